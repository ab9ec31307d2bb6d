#!/usr/bin/env python3
"""Tiny random Gemma 4 checkpoints and Hugging Face reference outputs for the Rust tests.

The Rust Gemma 4 implementation (crates/models) is tested against numbers computed here by
Hugging Face transformers, so CI needs neither Python nor torch: this script writes the
checkpoints (config.json + safetensors) and a `reference.json` next to each one, and both are
committed under crates/models/tests/fixtures/gemma4/.

Everything runs on the CPU in float32 with one torch thread and fixed seeds, so two runs produce
byte-identical files (`--check-determinism` proves it). Weights come from
gemma4_random_weights.py, not from HF's initialiser, with magnitudes large enough that a wrong
norm, scale, mask or RoPE detail changes the logits visibly.

Targets (see tools/README.md for the exact geometry of each):
  target-full          gemma4_text, PLE, KV sharing, k_eq_v, double-wide MLP, softcap
  target-nople         gemma4_text, no PLE, KV sharing, untied lm_head, no softcap
  target-multimodal    gemma4 (Gemma4ForConditionalGeneration) with tiny vision and audio towers
  target-sharded-bf16  target-full's architecture, bf16, several safetensors shards
  target-moe           gemma4_text with MoE blocks (4 experts, top-2), no PLE, KV sharing, k_eq_v
Assistants (gemma4_assistant, Gemma4AssistantForCausalLM):
  assistant-dense      dense tied head, paired with target-full
  assistant-centroid   centroid ("ordered embeddings") head, paired with target-full
  assistant-nople      dense tied head, paired with target-nople
  assistant-moe        dense tied head, paired with target-moe

Usage:  python tools/gemma4_fixtures.py [--out DIR] [--only NAME ...] [--check-determinism]
"""

from __future__ import annotations

import argparse
import filecmp
import os
import sys
import tempfile
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
# What each fixture is lives in gemma4_fixture_specs.py; how it is built and checked, in the
# gemma4_fixture_*.py modules the two builders import.
import hf_gemma4_workarounds  # noqa: E402
from gemma4_fixture_assistants import build_assistant  # noqa: E402
from gemma4_fixture_specs import ASSISTANTS, TARGETS  # noqa: E402
from gemma4_fixture_targets import build_target  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "crates" / "models" / "tests" / "fixtures" / "gemma4"


def selected_fixtures(only: list[str] | None) -> list[str]:
    """The fixtures to build, in build order: all of them, or those named plus the targets the
    named assistants are paired with."""
    if not only:
        return [*TARGETS, *ASSISTANTS]
    unknown = sorted(set(only) - set(TARGETS) - set(ASSISTANTS))
    if unknown:
        raise SystemExit(f"unknown fixtures: {', '.join(unknown)}")
    wanted = set(only) | {ASSISTANTS[n]["target"] for n in only if n in ASSISTANTS}
    return [n for n in [*TARGETS, *ASSISTANTS] if n in wanted]


def generate_all(out_dir: Path, names: list[str]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = {}
    for name, spec in TARGETS.items():
        if name in names:
            print(f"building {name}", flush=True)
            targets[name] = build_target(name, spec, out_dir)
    for name, spec in ASSISTANTS.items():
        if name in names:
            print(f"building {name}", flush=True)
            build_assistant(name, spec, out_dir, targets)


def directories_identical(left: Path, right: Path) -> bool:
    comparison = filecmp.dircmp(left, right)
    if comparison.left_only or comparison.right_only or comparison.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(left, right, comparison.common_files, shallow=False)
    if mismatch or errors:
        print(f"differing files under {left.name}: {mismatch + errors}", file=sys.stderr)
        return False
    return all(directories_identical(left / d, right / d) for d in comparison.common_dirs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="build only these fixtures (and the targets of the assistants named); the others are left alone",
    )
    parser.add_argument(
        "--check-determinism",
        action="store_true",
        help="also generate into a temporary directory and require byte-identical output",
    )
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_grad_enabled(False)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    hf_gemma4_workarounds.install()

    names = selected_fixtures(args.only)
    generate_all(args.out, names)
    if args.check_determinism:
        with tempfile.TemporaryDirectory() as scratch:
            generate_all(Path(scratch), names)
            if not all(directories_identical(args.out / n, Path(scratch) / n) for n in names):
                print("fixtures are NOT deterministic", file=sys.stderr)
                return 1
        print("second run is byte-identical")
    total = sum(f.stat().st_size for n in names for f in (args.out / n).rglob("*") if f.is_file())
    print(f"wrote {len(names)} fixtures to {args.out} ({total / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
