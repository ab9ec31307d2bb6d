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
import copy
import filecmp
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import (
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
)
from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator
from transformers.models.gemma4_assistant import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_json  # noqa: E402
import hf_gemma4_workarounds  # noqa: E402
from fixture_json import f32_list, int_list  # noqa: E402
from gemma4_random_weights import randomize_text_weights  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "crates" / "models" / "tests" / "fixtures" / "gemma4"

SLIDING = "sliding_attention"
FULL = "full_attention"
BOS, EOS, PAD = 2, 1, 0
GREEDY_TOKENS = 64
DRAFT_STEPS = 7
# Every recorded argmax (greedy target tokens, drafts) must beat the runner-up by at least this
# much, so that an f32 implementation with a different summation order (differences around
# 1e-6) reproduces the same tokens. Seeds were chosen to satisfy it; the script fails otherwise.
MIN_ARGMAX_MARGIN = 1e-3
# For MoE targets: at every position and layer the references depend on (every prompt position,
# every greedy step), the k-th largest router probability must beat the (k+1)-th by at least
# this much, so that an f32 implementation picks the same experts.
MIN_ROUTER_GAP = 1e-3

# Seeds of the MoE pair: the first ones (counting from 0) for which every self-check passes,
# the router gap included.
MOE_TARGET_SEED = 1
MOE_ASSISTANT_SEED = 0

ROPE_PARAMETERS = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}

# Shared by every target's text config; each fixture overrides what it exercises.
COMMON_TEXT = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    sliding_window=8,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=1024,
    rope_parameters=ROPE_PARAMETERS,
    bos_token_id=BOS,
    eos_token_id=EOS,
    pad_token_id=PAD,
)

# `global_head_dim` and `num_global_key_value_heads` are constructor-only arguments: the config
# turns them into `per_layer_config` overrides for the full-attention layers and forgets them.
TARGETS = {
    "target-full": dict(
        seed=2,
        multimodal=False,
        dtype=torch.float32,
        config_form="per_layer_config",
        text=dict(
            COMMON_TEXT,
            num_hidden_layers=6,
            layer_types=[SLIDING, FULL, SLIDING, SLIDING, SLIDING, FULL],
            num_kv_shared_layers=2,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            use_double_wide_mlp=True,
            hidden_size_per_layer_input=16,
            vocab_size_per_layer_input=256,
            final_logit_softcapping=3.0,
            tie_word_embeddings=True,
        ),
    ),
    "target-nople": dict(
        seed=8,
        multimodal=False,
        dtype=torch.float32,
        config_form="legacy",
        text=dict(
            COMMON_TEXT,
            num_hidden_layers=6,
            layer_types=[SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL],
            num_kv_shared_layers=3,
            global_head_dim=32,
            # Ignored by HF because attention_k_eq_v is false: full layers keep 2 KV heads.
            num_global_key_value_heads=1,
            attention_k_eq_v=False,
            use_double_wide_mlp=False,
            hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=0,
            final_logit_softcapping=None,
            tie_word_embeddings=False,
        ),
    ),
    "target-multimodal": dict(
        seed=2,
        multimodal=True,
        dtype=torch.float32,
        config_form="per_layer_config",
        text=dict(
            COMMON_TEXT,
            num_hidden_layers=4,
            layer_types=[SLIDING, FULL, SLIDING, FULL],
            num_kv_shared_layers=0,
            global_head_dim=32,
            num_global_key_value_heads=None,
            attention_k_eq_v=False,
            use_double_wide_mlp=False,
            hidden_size_per_layer_input=16,
            vocab_size_per_layer_input=256,
            final_logit_softcapping=30.0,
            tie_word_embeddings=True,
        ),
        vision=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=16,
            patch_size=4,
            position_embedding_size=32,
            pooling_kernel_size=2,
        ),
        audio=dict(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            subsampling_conv_channels=[8, 4],
            conv_kernel_size=3,
            attention_chunk_size=4,
            attention_context_left=5,
            output_proj_dims=32,
        ),
    ),
    "target-sharded-bf16": dict(
        seed=7,
        multimodal=False,
        dtype=torch.bfloat16,
        max_shard_size="100KB",
        config_form="legacy",
        text=None,  # filled below: target-full's architecture
    ),
}
TARGETS["target-sharded-bf16"]["text"] = copy.deepcopy(TARGETS["target-full"]["text"])
# target-nople's layer layout and KV sharing, but a tied head, k_eq_v (full layers: 1 KV head, no
# v_proj) and a softcap, plus a MoE block in every layer (HF has no per-layer switch). Added
# last, so that the other fixtures are built exactly as before.
TARGETS["target-moe"] = dict(
    seed=MOE_TARGET_SEED,
    multimodal=False,
    dtype=torch.float32,
    config_form="per_layer_config",
    text=dict(
        COMMON_TEXT,
        num_hidden_layers=6,
        layer_types=[SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL],
        num_kv_shared_layers=3,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        use_double_wide_mlp=False,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        final_logit_softcapping=30.0,
        tie_word_embeddings=True,
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=16,
    ),
)

ASSISTANTS = {
    "assistant-dense": dict(seed=11, target="target-full", ordered=False),
    "assistant-centroid": dict(
        seed=12, target="target-full", ordered=True, num_centroids=16, centroid_intermediate_top_k=4
    ),
    "assistant-nople": dict(seed=13, target="target-nople", ordered=False),
    "assistant-moe": dict(seed=MOE_ASSISTANT_SEED, target="target-moe", ordered=False),
}
ASSISTANT_POST_NORM_SCALE = 0.4  # see gemma4_random_weights.py
ASSISTANT_TEXT = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    layer_types=[SLIDING, FULL, SLIDING, FULL],
    num_attention_heads=4,
)


def make_prompts() -> dict[str, list[int]]:
    """BOS followed by seeded random ids in [3, vocab): a short prompt (shorter than the sliding
    window), a medium one and a long one (three windows)."""
    generator = torch.Generator().manual_seed(1234)
    prompts = {}
    for name, length in (("short", 6), ("medium", 13), ("long", 24)):
        body = torch.randint(3, COMMON_TEXT["vocab_size"], (length - 1,), generator=generator)
        prompts[name] = [BOS] + body.tolist()
    return prompts


PROMPTS = make_prompts()
ASSISTANT_PROMPTS = ("short", "long")


# --------------------------------------------------------------------------------------------
# Configs


def target_config(spec: dict) -> Gemma4TextConfig | Gemma4Config:
    text = Gemma4TextConfig(**spec["text"])
    if not spec["multimodal"]:
        return text
    return Gemma4Config(
        text_config=text.to_dict(),
        vision_config=spec["vision"],
        audio_config=spec["audio"],
        tie_word_embeddings=spec["text"]["tie_word_embeddings"],
    )


def assistant_config(spec: dict, target_text: Gemma4TextConfig) -> Gemma4AssistantConfig:
    """The assistant's attention reads the target's shared K/V, so its head dims and KV head
    counts per layer type, its window and its RoPE must equal the target's."""
    target_spec = TARGETS[spec["target"]]["text"]
    text = Gemma4TextConfig(
        **ASSISTANT_TEXT,
        vocab_size=target_text.vocab_size,
        num_key_value_heads=target_spec["num_key_value_heads"],
        head_dim=target_spec["head_dim"],
        global_head_dim=target_spec["global_head_dim"],
        num_global_key_value_heads=target_spec["num_global_key_value_heads"],
        attention_k_eq_v=target_spec["attention_k_eq_v"],
        sliding_window=target_spec["sliding_window"],
        rope_parameters=ROPE_PARAMETERS,
        rms_norm_eps=target_spec["rms_norm_eps"],
        hidden_activation=target_spec["hidden_activation"],
        max_position_embeddings=target_spec["max_position_embeddings"],
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        num_kv_shared_layers=ASSISTANT_TEXT["num_hidden_layers"],
        use_double_wide_mlp=False,
        final_logit_softcapping=None,
        tie_word_embeddings=True,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    extra = {}
    if spec["ordered"]:
        extra = dict(
            num_centroids=spec["num_centroids"],
            centroid_intermediate_top_k=spec["centroid_intermediate_top_k"],
        )
    return Gemma4AssistantConfig(
        text_config=text.to_dict(),
        backbone_hidden_size=target_text.hidden_size,
        use_ordered_embeddings=spec["ordered"],
        tie_word_embeddings=True,
        **extra,
    )


def layer_geometry(text: Gemma4TextConfig) -> list[dict]:
    modes = text.kv_sharing_modes
    return [
        {
            "layer": i,
            "type": text.layer_types[i],
            "head_dim": text.per_layer_config[i].head_dim,
            "num_key_value_heads": text.per_layer_config[i].num_key_value_heads,
            "kv_sharing": modes[i],
        }
        for i in range(text.num_hidden_layers)
    ]


# --------------------------------------------------------------------------------------------
# Saving and loading


def rewrite_config_to_legacy_geometry(directory: Path, text_spec: dict) -> None:
    """Replace the `per_layer_config` that 5.23 writes by the older top-level keys
    `global_head_dim` / `num_global_key_value_heads`, which HF still accepts on load."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    text = config.get("text_config", config)
    text.pop("per_layer_config", None)
    text["global_head_dim"] = text_spec["global_head_dim"]
    text["num_global_key_value_heads"] = text_spec["num_global_key_value_heads"]
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_checkpoint(model: nn.Module, directory: Path, spec: dict) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    kwargs = {}
    if spec.get("max_shard_size"):
        kwargs["max_shard_size"] = spec["max_shard_size"]
    model.save_pretrained(directory, **kwargs)
    if spec["config_form"] == "legacy":
        rewrite_config_to_legacy_geometry(directory, spec["text"])


def load_checkpoint(model_class, directory: Path, **kwargs) -> nn.Module:
    model = model_class.from_pretrained(directory, attn_implementation="eager", **kwargs)
    return model.float().eval()


def is_moe(spec: dict) -> bool:
    return bool(spec["text"].get("enable_moe_block"))


def assert_same_weights(saved: nn.Module, loaded: nn.Module) -> None:
    saved_state = saved.state_dict()
    loaded_state = loaded.state_dict()
    if saved_state.keys() != loaded_state.keys():
        raise AssertionError(f"state dict keys differ: {saved_state.keys() ^ loaded_state.keys()}")
    for key, tensor in saved_state.items():
        if not torch.equal(tensor.float(), loaded_state[key].float()):
            raise AssertionError(f"{key} changed in the save/load round trip")


def checkpoint_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != "reference.json")


# --------------------------------------------------------------------------------------------
# Target references


def text_model_of(model: nn.Module) -> nn.Module:
    if isinstance(model, Gemma4ForConditionalGeneration):
        return model.model.language_model
    return model.model


def text_config_of(model: nn.Module) -> Gemma4TextConfig:
    return model.config.get_text_config()


# --------------------------------------------------------------------------------------------
# MoE routing


class RouterRecorder:
    """Forward hooks on every decoder layer's router and experts. Each forward appends, per
    layer, the router's input (the flattened residual), its outputs (f32 softmax
    probabilities, top-k weights after renormalisation and `per_expert_scale`, top-k indices),
    and the experts' input (pre_feedforward_layernorm_2 of the residual) and output (the
    weighted sum, before post_feedforward_layernorm_2)."""

    def __init__(self, model: nn.Module):
        self.layers = list(text_model_of(model).layers)
        self.records: list[dict] = []

    def __enter__(self):
        self.handles = []
        for i, layer in enumerate(self.layers):
            self.handles.append(layer.router.register_forward_hook(self._router_hook(i)))
            self.handles.append(layer.experts.register_forward_hook(self._experts_hook(i)))
        return self

    def __exit__(self, *_exc):
        for handle in self.handles:
            handle.remove()

    def _router_hook(self, layer: int):
        def hook(_module, inputs, outputs):
            probs, weights, index = (t.detach().clone() for t in outputs)
            self.records.append(
                {"layer": layer, "router_in": inputs[0].detach().clone(), "probs": probs, "weights": weights, "index": index}
            )

        return hook

    def _experts_hook(self, layer: int):
        def hook(_module, inputs, output):
            record = self.records[-1]
            if record["layer"] != layer or "experts_out" in record:
                raise AssertionError("the experts must run right after their router")
            record["experts_in"] = inputs[0].detach().clone()
            record["experts_out"] = output.detach().clone()

        return hook

    def min_gap(self, top_k: int) -> float:
        """Smallest p_k - p_(k+1) over every recorded layer and position."""
        gaps = []
        for record in self.records:
            ordered = torch.sort(record["probs"], dim=-1, descending=True).values
            gaps.append((ordered[:, top_k - 1] - ordered[:, top_k]).min())
        return float(torch.stack(gaps).min())


def check_moe_semantics(layer: nn.Module, config: Gemma4TextConfig, record: dict) -> None:
    """Recompute one layer's routing and experts from the weights, the way tools/README.md
    describes them, and require HF's outputs: RMSNorm without scale, x scale x hidden^-0.5,
    proj, f32 softmax, top-k, renormalise, x per_expert_scale; each selected expert on
    pre_feedforward_layernorm_2(residual) with gate_up_proj's first half the gate."""
    router, experts = layer.router, layer.experts
    x = record["router_in"].float()
    normed = x * torch.pow(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps, -0.5)
    logits = (normed * router.scale * config.hidden_size**-0.5) @ router.proj.weight.T
    probs = torch.softmax(logits, dim=-1)
    weights, index = torch.topk(probs, config.top_k_experts, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True) * router.per_expert_scale[index]
    if not torch.equal(index, record["index"]):
        raise AssertionError("recomputed top-k experts differ from HF's")
    if not torch.allclose(probs, record["probs"], atol=1e-6, rtol=0):
        raise AssertionError("recomputed router probabilities differ from HF's")
    if not torch.allclose(weights, record["weights"], atol=1e-6, rtol=0):
        raise AssertionError("recomputed top-k weights differ from HF's")
    h = layer.pre_feedforward_layernorm_2(x)
    if not torch.equal(h, record["experts_in"]):
        raise AssertionError("the experts' input is not pre_feedforward_layernorm_2(residual)")
    inter = config.moe_intermediate_size
    out = torch.zeros_like(h)
    for t in range(h.shape[0]):
        for j in range(config.top_k_experts):
            e = int(index[t, j])
            gate_up = experts.gate_up_proj[e] @ h[t]
            act = nn.functional.gelu(gate_up[:inter], approximate="tanh") * gate_up[inter:]
            out[t] += weights[t, j] * (experts.down_proj[e] @ act)
    if not torch.allclose(out, record["experts_out"], atol=1e-5, rtol=0):
        raise AssertionError("recomputed expert outputs differ from HF's")


def capture_layer_outputs(model: nn.Module):
    """Forward hooks collecting every decoder layer's output (pre final norm, after the layer
    scalar). `output_hidden_states` returns the same tensors for all but the last layer, whose
    entry it replaces by the final-normed state."""
    outputs: list[torch.Tensor] = []
    handles = [
        layer.register_forward_hook(lambda _m, _i, out: outputs.append(out.detach().clone()))
        for layer in text_model_of(model).layers
    ]
    return outputs, handles


def greedy_decode(model: nn.Module, ids: torch.Tensor, steps: int) -> tuple[list[int], list[float], torch.Tensor]:
    """Plain argmax decoding with HF's DynamicCache, one token per forward, eos not special."""
    out = model(input_ids=ids, use_cache=True)
    prefill_logits = out.logits[0, -1]
    cache = out.past_key_values
    logits = prefill_logits
    tokens, margins = [], []
    for _ in range(steps):
        top = torch.topk(logits, 2)
        token = int(top.indices[0])
        tokens.append(token)
        margins.append(float(top.values[0] - top.values[1]))
        out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits = out.logits[0, -1]
    return tokens, margins, prefill_logits


def greedy_generation_config(model: nn.Module, max_new_tokens: int):
    """A greedy config with eos disabled. `generate` fills every `None` it is given from the
    model's own generation config, so eos must be removed there too (see `without_eos`)."""
    generation_config = copy.deepcopy(model.generation_config)
    generation_config.eos_token_id = None
    generation_config.do_sample = False
    generation_config.max_new_tokens = max_new_tokens
    generation_config.min_new_tokens = None
    generation_config.pad_token_id = PAD
    return generation_config


class without_eos:
    """Temporarily clear the model's default eos so that `generate` never stops early."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self):
        self.saved = self.model.generation_config
        self.model.generation_config = copy.deepcopy(self.saved)
        self.model.generation_config.eos_token_id = None

    def __exit__(self, *_exc):
        self.model.generation_config = self.saved


def generate_greedy(model: nn.Module, ids: torch.Tensor, steps: int) -> list[int]:
    """HF's own `generate`, greedy, eos disabled, exactly `steps` new tokens."""
    with without_eos(model):
        sequences = model.generate(ids, generation_config=greedy_generation_config(model, steps))
    return sequences[0, ids.shape[1] :].tolist()


def per_layer_inputs_last(model: nn.Module, ids: torch.Tensor) -> torch.Tensor | None:
    text_model = text_model_of(model)
    if not text_config_of(model).hidden_size_per_layer_input:
        return None
    embeds = text_model.embed_tokens(ids)
    combined = text_model.project_per_layer_inputs(embeds, text_model.get_per_layer_inputs(ids, embeds))
    return combined[0, -1]


def target_prompt_reference(model: nn.Module, name: str, prompt: list[int]) -> dict:
    text = text_config_of(model)
    if not text.enable_moe_block:
        return prompt_reference(model, name, prompt)
    with RouterRecorder(model) as recorder:
        reference = prompt_reference(model, name, prompt)
    num_layers = text.num_hidden_layers
    gap = recorder.min_gap(text.top_k_experts)
    if gap < MIN_ROUTER_GAP:
        raise AssertionError(f"{name}: router gap {gap:.2e} is below {MIN_ROUTER_GAP}")
    prefill = recorder.records[:num_layers]  # the uncached forward of the whole prompt
    layers = text_model_of(model).layers
    for record in prefill:
        if record["probs"].shape[0] != len(prompt):
            raise AssertionError("the first forward should route every prompt position")
        check_moe_semantics(layers[record["layer"]], text, record)
        # The recorded order of the selected experts (descending probability) must be
        # unambiguous too: every gap among the k + 1 largest probabilities of the last position.
        ordered = torch.sort(record["probs"][-1], descending=True).values[: text.top_k_experts + 1]
        if float((ordered[:-1] - ordered[1:]).min()) < MIN_ROUTER_GAP:
            raise AssertionError(f"{name}: the top-k order at the last position is a near tie")
    reference.update(
        {
            "router_top_k_index_last": [int_list(r["index"][-1]) for r in prefill],
            "router_top_k_weights_last": [f32_list(r["weights"][-1]) for r in prefill],
            "router_probs_last": [f32_list(r["probs"][-1]) for r in prefill],
            "experts_out_last": [f32_list(r["experts_out"][-1]) for r in prefill],
            "router_min_gap": gap,
        }
    )
    return reference


def prompt_reference(model: nn.Module, name: str, prompt: list[int]) -> dict:
    ids = torch.tensor([prompt])
    layer_outputs, handles = capture_layer_outputs(model)
    try:
        out = model(input_ids=ids, use_cache=False, output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    num_layers = text_config_of(model).num_hidden_layers
    if len(layer_outputs) != num_layers:
        raise AssertionError("expected one captured output per decoder layer")
    for i in range(num_layers - 1):
        if not torch.equal(layer_outputs[i], out.hidden_states[i + 1]):
            raise AssertionError(f"hook output of layer {i} differs from output_hidden_states")

    tokens, margins, cached_prefill_logits = greedy_decode(model, ids, GREEDY_TOKENS)
    if not torch.allclose(cached_prefill_logits, out.logits[0, -1], atol=1e-5, rtol=0):
        raise AssertionError("prefill logits with and without a cache disagree")
    if min(margins) < MIN_ARGMAX_MARGIN:
        raise AssertionError(f"{name}: greedy margin {min(margins):.2e} is below {MIN_ARGMAX_MARGIN}")
    generated = generate_greedy(model, ids, GREEDY_TOKENS)
    if generated != tokens:
        raise AssertionError(f"{name}: generate() {generated} != argmax loop {tokens}")

    reference = {
        "name": name,
        "prompt_ids": prompt,
        "last_logits": f32_list(out.logits[0, -1]),
        "greedy": tokens,
        "greedy_margins": [float(m) for m in margins],
        "embedding_last": f32_list(out.hidden_states[0][0, -1]),
        "layer_hidden_last": [f32_list(h[0, -1]) for h in layer_outputs],
        "final_hidden_last": f32_list(out.hidden_states[-1][0, -1]),
    }
    ple = per_layer_inputs_last(model, ids)
    if ple is not None:
        reference["per_layer_inputs_last"] = [f32_list(row) for row in ple]
    if name == "short":
        reference["all_logits"] = [f32_list(row) for row in out.logits[0]]
    return reference


def check_multimodal_text_path(model: Gemma4ForConditionalGeneration, prompt: list[int]) -> None:
    """The multimodal class on text-only input must equal a text-only model holding the same
    language-model weights (what a Rust loader that reads only `model.language_model.*` does)."""
    text_model = Gemma4ForCausalLM(copy.deepcopy(text_config_of(model))).eval()
    text_model.model.load_state_dict(model.model.language_model.state_dict())
    text_model.lm_head.weight = text_model.model.embed_tokens.weight
    ids = torch.tensor([prompt])
    expected = model(input_ids=ids).logits
    actual = text_model(input_ids=ids).logits
    if not torch.allclose(expected, actual, atol=1e-5, rtol=0):
        raise AssertionError("multimodal text-only logits differ from the text-only model's")


def versions(dtype: torch.dtype, computed_in: str, moe: bool = False) -> dict:
    result = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "checkpoint_dtype": str(dtype).removeprefix("torch."),
        "compute_dtype": "float32",
        "computed_in": computed_in,
        "attn_implementation": "eager",
    }
    if moe:
        result["experts_implementation"] = "eager"
    result["torch_threads"] = torch.get_num_threads()
    return result


def check_grouped_mm_experts(directory: Path, eager: nn.Module, references: list[dict]) -> float:
    """HF's default experts implementation (grouped_mm) must agree with the eager loop the
    references come from: same greedy tokens, logits within 1e-5. Returns the largest logit
    difference."""
    grouped = load_checkpoint(Gemma4ForCausalLM, directory)
    if grouped.config._experts_implementation != "grouped_mm":
        raise AssertionError(f"expected grouped_mm by default, got {grouped.config._experts_implementation}")
    if eager.config._experts_implementation != "eager":
        raise AssertionError("the reference model should use the eager experts loop")
    worst = 0.0
    for reference in references:
        ids = torch.tensor([reference["prompt_ids"]])
        diff = (grouped(input_ids=ids).logits - eager(input_ids=ids).logits).abs().max()
        worst = max(worst, float(diff))
        tokens, _, _ = greedy_decode(grouped, ids, GREEDY_TOKENS)
        if tokens != reference["greedy"]:
            raise AssertionError(f"{reference['name']}: grouped_mm greedy tokens differ")
    if worst > 1e-5:
        raise AssertionError(f"grouped_mm logits differ from eager by {worst:.2e}")
    return worst


def build_target(name: str, spec: dict, out_dir: Path) -> nn.Module:
    directory = out_dir / name
    torch.manual_seed(spec["seed"])  # only the vision and audio towers keep HF's initialiser
    config = target_config(spec)
    model_class = Gemma4ForConditionalGeneration if spec["multimodal"] else Gemma4ForCausalLM
    model = model_class(config).eval()
    randomize_text_weights(model, spec["seed"], scope="model.language_model" if spec["multimodal"] else "")
    model = model.to(spec["dtype"])
    save_checkpoint(model, directory, spec)

    moe = is_moe(spec)
    loaded = load_checkpoint(model_class, directory, **({"experts_implementation": "eager"} if moe else {}))
    assert_same_weights(model, loaded)
    text = text_config_of(loaded)
    expected_geometry = layer_geometry(text_config_of(model))
    if layer_geometry(text) != expected_geometry:
        raise AssertionError(f"{name}: config.json does not reproduce the layer geometry")
    if spec["multimodal"]:
        check_multimodal_text_path(loaded, PROMPTS["long"])

    computed_in = "float32"
    if spec["dtype"] != torch.float32:
        computed_in = "float32 from the bf16-rounded weights stored in the checkpoint (upcast on load)"
    prompts = [target_prompt_reference(loaded, n, p) for n, p in PROMPTS.items()]
    reference = {
        "fixture": name,
        "model_type": loaded.config.model_type,
        "versions": versions(spec["dtype"], computed_in, moe),
        "hf_bugs_present": hf_gemma4_workarounds.BUGS_PRESENT,
        "files": checkpoint_files(directory),
        "layers": expected_geometry,
        "greedy_tokens": GREEDY_TOKENS,
    }
    if moe:
        reference["moe"] = {
            "num_experts": text.num_experts,
            "top_k_experts": text.top_k_experts,
            "moe_intermediate_size": text.moe_intermediate_size,
            "router_min_gap": min(p["router_min_gap"] for p in prompts),
            "min_router_gap_required": MIN_ROUTER_GAP,
            "router_decisions_checked": text.num_hidden_layers * sum(len(p["prompt_ids"]) + GREEDY_TOKENS for p in prompts),
            "greedy_min_margin": min(min(p["greedy_margins"]) for p in prompts),
            "grouped_mm_max_logit_diff": check_grouped_mm_experts(directory, loaded, prompts),
        }
    reference["prompts"] = prompts
    fixture_json.write(directory / "reference.json", reference)
    return loaded


# --------------------------------------------------------------------------------------------
# Assistant references


def target_prefill(target: nn.Module, prompt: list[int]):
    """Target prefill as the round loop does it: logits, the final-normed hidden of the last
    prompt token, and the K/V the last full and last sliding producer layers stored."""
    ids = torch.tensor([prompt])
    out = target(input_ids=ids, use_cache=True, output_hidden_states=True, return_shared_kv_states=True)
    shared = {kind: (kv[0], kv[1]) for kind, kv in out.shared_kv_states.items()}
    for kind, (keys, _values) in shared.items():
        if keys.shape[2] != len(prompt):
            raise AssertionError(f"{kind} shared K/V should hold every prompt position")
    return out.logits[0, -1], out.hidden_states[-1][:, -1:], shared


def visible_keys(mask: torch.Tensor | None, kv_len: int) -> list[int]:
    if mask is None:
        return list(range(kv_len))
    row = mask[0, 0, 0]
    allowed = row if row.dtype == torch.bool else row == 0
    return [i for i in range(kv_len) if bool(allowed[i])]


def draft_block(
    target: nn.Module,
    assistant: Gemma4AssistantForCausalLM,
    first_token: int,
    hidden: torch.Tensor,
    shared: dict,
    position: int,
    kv_len: int,
    steps: int,
) -> dict:
    """K greedy drafter steps calling the assistant's forward directly."""
    embed = text_model_of(target).embed_tokens  # scales by sqrt(H_target) itself
    normed: list[torch.Tensor] = []
    handle = assistant.model.norm.register_forward_hook(lambda _m, _i, out: normed.append(out.detach()))
    token = torch.tensor([[first_token]])
    result = {"drafts": [], "step_margins": [], "step_logits": [], "step_hidden": [], "step_normed": []}
    selected_ids, top_centroids = [], []
    try:
        for _ in range(steps):
            inputs = torch.cat([embed(token), hidden], dim=-1)
            out = assistant(
                inputs_embeds=inputs,
                position_ids=torch.tensor([[position]]),
                attention_mask=torch.ones(1, kv_len, dtype=torch.long),
                shared_kv_states=shared,
                use_cache=False,
            )
            logits = out.logits[0, -1]
            token = out.logits.argmax(dim=-1)
            hidden = out.last_hidden_state
            top = torch.topk(logits, 2).values
            result["drafts"].append(int(token))
            result["step_margins"].append(float(top[0] - top[1]))
            result["step_logits"].append(f32_list(logits))
            result["step_hidden"].append(f32_list(hidden[0, -1]))
            result["step_normed"].append(f32_list(normed[-1][0, -1]))
            if assistant.masked_embedding is not None:
                ids, centroids = centroid_selection(assistant, normed[-1])
                if int(token) not in ids:
                    raise AssertionError("the argmax token must be among the selected ids")
                selected_ids.append(ids)
                top_centroids.append(centroids)
    finally:
        handle.remove()
    if assistant.masked_embedding is not None:
        result["step_selected_ids"] = selected_ids
        result["step_top_centroids"] = top_centroids
    return result


def centroid_selection(assistant: Gemma4AssistantForCausalLM, normed: torch.Tensor) -> tuple[list[int], list[int]]:
    """The token ids HF's masked embedder scores, in its order: the top-k centroids by score
    (descending), each expanded to its row of `token_ordering`."""
    embedder = assistant.masked_embedding
    centroid_logits = embedder.centroids(normed)
    _, top = torch.topk(centroid_logits, k=embedder.centroid_intermediate_top_k, dim=-1)
    table = embedder.token_ordering.long().view(embedder.num_centroids, embedder.vocab_size_per_centroid)
    return int_list(table[top[0, -1]]), int_list(top[0, -1])


def attention_visibility(assistant, target, first_token, hidden, shared, kv_len) -> dict:
    embed = text_model_of(target).embed_tokens
    projected = assistant.pre_projection(torch.cat([embed(torch.tensor([[first_token]])), hidden], dim=-1))
    masks = assistant.create_attention_masks(projected, torch.ones(1, kv_len, dtype=torch.long), shared)
    return {kind: visible_keys(masks[kind], shared[kind][0].shape[2]) for kind in (FULL, SLIDING)}


def hf_generator_first_round(target, assistant, prompt: list[int]) -> list[int]:
    """Round-1 drafts of HF's own SinglePositionMultiTokenCandidateGenerator (via generate)."""
    recorded: list[list[int]] = []
    original = SinglePositionMultiTokenCandidateGenerator.get_candidates

    def recording(self, input_ids, *args, **kwargs):
        candidates, logits = original(self, input_ids, *args, **kwargs)
        if logits is not None and not recorded:
            recorded.append(candidates[0, input_ids.shape[1] :].tolist())
        return candidates, logits

    SinglePositionMultiTokenCandidateGenerator.get_candidates = recording
    try:
        assistant.generation_config.num_assistant_tokens = DRAFT_STEPS
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        with without_eos(target):
            target.generate(
                torch.tensor([prompt]),
                generation_config=greedy_generation_config(target, DRAFT_STEPS + 2),
                assistant_model=assistant,
            )
    finally:
        SinglePositionMultiTokenCandidateGenerator.get_candidates = original
    if not recorded:
        raise AssertionError("HF's generator produced no candidates")
    return recorded[0]


def assistant_prompt_reference(target, assistant, name: str, prompt: list[int], target_reference: dict) -> dict:
    kv_len = len(prompt)
    logits, hidden, shared = target_prefill(target, prompt)
    first_token = int(logits.argmax())
    if first_token != target_reference["greedy"][0]:
        raise AssertionError("prefill first token disagrees with the target reference")

    reference = {
        "name": name,
        "prompt_ids": prompt,
        "first_token": first_token,
        "position": kv_len - 1,
        "target_hidden_last": f32_list(hidden[0, -1]),
        "shared_kv": {
            kind: {
                "shape": list(shared[kind][0].shape),
                "k": f32_list(shared[kind][0]),
                "v": f32_list(shared[kind][1]),
            }
            for kind in (FULL, SLIDING)
        },
        "visible_keys": attention_visibility(assistant, target, first_token, hidden, shared, kv_len),
    }
    reference.update(draft_block(target, assistant, first_token, hidden, shared, kv_len - 1, kv_len, DRAFT_STEPS))
    if min(reference["step_margins"]) < MIN_ARGMAX_MARGIN:
        raise AssertionError(f"{name}: draft margin {min(reference['step_margins']):.2e} is below {MIN_ARGMAX_MARGIN}")

    # HF's generator queries at position len(prompt) (the bonus token's position); with that
    # position this loop must reproduce the generator's first round exactly.
    at_bonus_position = draft_block(target, assistant, first_token, hidden, shared, kv_len, kv_len, DRAFT_STEPS)
    generator_drafts = hf_generator_first_round(target, assistant, prompt)
    if generator_drafts != at_bonus_position["drafts"]:
        raise AssertionError(f"HF generator {generator_drafts} != loop at position P {at_bonus_position['drafts']}")
    reference["hf_generator_first_round"] = {"position": kv_len, "drafts": generator_drafts}
    return reference


def check_reproducible(assistant_dir: Path, target: nn.Module, prompt: list[int], expected: dict) -> None:
    """The drafts must not hinge on f32 rounding: the sdpa backend, and the eager one fed a
    target hidden perturbed by one part in 1e6, must give the same drafts and nearly the same
    hiddens (the recurrence through `step_hidden` must not amplify rounding differences)."""
    sdpa = Gemma4AssistantForCausalLM.from_pretrained(assistant_dir, attn_implementation="sdpa").float().eval()
    eager = load_checkpoint(Gemma4AssistantForCausalLM, assistant_dir)
    kv_len = len(prompt)
    logits, hidden, shared = target_prefill(target, prompt)
    token = int(logits.argmax())
    variants = {
        "sdpa": draft_block(target, sdpa, token, hidden, shared, kv_len - 1, kv_len, DRAFT_STEPS),
        "perturbed": draft_block(target, eager, token, hidden * (1 + 1e-6), shared, kv_len - 1, kv_len, DRAFT_STEPS),
    }
    reference_hidden = torch.tensor(expected["step_hidden"], dtype=torch.float32)
    for label, result in variants.items():
        if result["drafts"] != expected["drafts"]:
            raise AssertionError(f"{label} drafts {result['drafts']} != {expected['drafts']}")
        drift = (torch.tensor(result["step_hidden"], dtype=torch.float32) - reference_hidden).abs().max()
        if drift > 1e-4:
            raise AssertionError(f"{label}: step hidden drifts by {float(drift):.2e}")


def build_assistant(name: str, spec: dict, out_dir: Path, targets: dict) -> None:
    directory = out_dir / name
    target = targets[spec["target"]]
    torch.manual_seed(spec["seed"])
    config = assistant_config(spec, text_config_of(target))
    model = Gemma4AssistantForCausalLM(config).eval()
    randomize_text_weights(model, spec["seed"], post_norm_scale=ASSISTANT_POST_NORM_SCALE)
    if directory.exists():
        shutil.rmtree(directory)
    model.save_pretrained(directory)

    loaded = load_checkpoint(Gemma4AssistantForCausalLM, directory)
    assert_same_weights(model, loaded)
    target_reference = json.loads((out_dir / spec["target"] / "reference.json").read_text())
    by_name = {p["name"]: p for p in target_reference["prompts"]}
    prompts = [
        assistant_prompt_reference(target, loaded, n, PROMPTS[n], by_name[n]) for n in ASSISTANT_PROMPTS
    ]
    for prompt_reference in prompts:
        check_reproducible(directory, target, prompt_reference["prompt_ids"], prompt_reference)
    reference = {
        "fixture": name,
        "target": spec["target"],
        "model_type": loaded.config.model_type,
        "versions": versions(torch.float32, "float32"),
        "hf_bugs_present": hf_gemma4_workarounds.BUGS_PRESENT,
        "files": checkpoint_files(directory),
        "layers": layer_geometry(loaded.config.get_text_config()),
        "draft_steps": DRAFT_STEPS,
        "prompts": prompts,
    }
    fixture_json.write(directory / "reference.json", reference)


# --------------------------------------------------------------------------------------------


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
