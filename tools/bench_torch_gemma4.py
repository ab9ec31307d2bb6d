#!/usr/bin/env python3
"""Time Hugging Face transformers on a medium random Gemma 4 text model (the torch baseline).

Builds (once) a random `gemma4_text` checkpoint with realistic ratios, saves it with safetensors
to a directory outside the repository (default /tmp/gemma4-medium), and times in float32 on the
CPU with a fixed number of torch threads:

  prefill     one forward of a 128-token prompt into an empty DynamicCache, logits for the last
              position only (`logits_to_keep=1`, what `generate` does);
  block_bs    one forward of `bs` tokens (bs = 1, 4, 8) on top of a 128-token cached context,
              logits for every block position (what a speculative verify needs). The cache is
              deep-copied before each run, outside the timed region, so every run sees the same
              128-token context.

Each measurement is the median of `--runs` runs after one warm-up run. The result is printed as
JSON. The Rust benchmark loads the same directory and times the same operations.

Usage:  python tools/bench_torch_gemma4.py [DIR] [--runs 5] [--threads 2] [--rebuild]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_gemma4_workarounds  # noqa: E402
from gemma4_random_weights import randomize_text_weights  # noqa: E402

SLIDING = "sliding_attention"
FULL = "full_attention"
SEED = 7

MEDIUM_CONFIG = dict(
    vocab_size=32_768,
    hidden_size=1024,
    intermediate_size=4096,
    num_hidden_layers=8,
    layer_types=[SLIDING, SLIDING, SLIDING, FULL, SLIDING, SLIDING, SLIDING, FULL],
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    global_head_dim=256,
    num_global_key_value_heads=None,
    attention_k_eq_v=False,
    sliding_window=512,
    num_kv_shared_layers=2,
    use_double_wide_mlp=False,
    hidden_size_per_layer_input=128,
    vocab_size_per_layer_input=32_768,
    final_logit_softcapping=30.0,
    tie_word_embeddings=True,
    rope_parameters={
        SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
        FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    },
    max_position_embeddings=8192,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)


def build(directory: Path) -> None:
    torch.manual_seed(SEED)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**MEDIUM_CONFIG)).eval()
    randomize_text_weights(model, SEED)
    model.save_pretrained(directory)


def median_ms(run, runs: int, prepare=lambda: None) -> tuple[float, list[float]]:
    """Median wall time of `run(prepare())` in milliseconds, after one warm-up run."""
    run(prepare())
    samples = []
    for _ in range(runs):
        argument = prepare()
        start = time.perf_counter()
        run(argument)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), [round(s, 3) for s in samples]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", nargs="?", type=Path, default=Path("/tmp/gemma4-medium"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--block-sizes", default="1,4,8")
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--rebuild", action="store_true", help="rebuild the checkpoint even if it exists")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    hf_gemma4_workarounds.install()

    if args.rebuild or not (args.directory / "config.json").exists():
        build(args.directory)
    model = Gemma4ForCausalLM.from_pretrained(args.directory, dtype=torch.float32, attn_implementation=args.attn)
    model.eval()

    generator = torch.Generator().manual_seed(SEED)
    vocab = model.config.vocab_size
    prompt = torch.randint(3, vocab, (1, args.prompt_len), generator=generator)
    prompt[0, 0] = model.config.bos_token_id

    prefill_ms, prefill_samples = median_ms(
        lambda ids: model(input_ids=ids, use_cache=True, logits_to_keep=1), args.runs, lambda: prompt
    )

    context = model(input_ids=prompt, use_cache=True, logits_to_keep=1).past_key_values
    blocks = {}
    for size in (int(s) for s in args.block_sizes.split(",")):
        block = torch.randint(3, vocab, (1, size), generator=generator)
        ms, samples = median_ms(
            lambda cache, block=block: model(input_ids=block, past_key_values=cache, use_cache=True),
            args.runs,
            lambda: copy.deepcopy(context),
        )
        blocks[str(size)] = {"median_ms": round(ms, 3), "samples_ms": samples}

    result = {
        "directory": str(args.directory),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32",
        "attn_implementation": args.attn,
        "threads": args.threads,
        "runs": args.runs,
        "parameters": sum(p.numel() for p in model.parameters()),
        "config": {k: v for k, v in MEDIUM_CONFIG.items() if k != "rope_parameters"},
        "prefill": {"tokens": args.prompt_len, "median_ms": round(prefill_ms, 3), "samples_ms": prefill_samples},
        "block_on_context": {"context_tokens": args.prompt_len, "by_block_size": blocks},
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
