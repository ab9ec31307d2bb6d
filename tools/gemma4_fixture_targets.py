"""Builds a target fixture: its checkpoint, then HF's outputs on every prompt (logits, hidden
states per layer, greedy continuation, and for MoE targets the routing) into reference.json,
checking along the way everything tools/README.md lists under "Self-checks"."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn
from transformers import Gemma4ForCausalLM, Gemma4ForConditionalGeneration

import fixture_json
import hf_gemma4_workarounds
from fixture_json import f32_list, int_list
from gemma4_fixture_checkpoints import (
    assert_same_weights,
    checkpoint_files,
    load_checkpoint,
    save_checkpoint,
    versions,
)
from gemma4_fixture_decoding import generate_greedy, greedy_decode
from gemma4_fixture_models import layer_geometry, target_config, text_config_of, text_model_of
from gemma4_fixture_moe import RouterRecorder, check_grouped_mm_experts, check_moe_semantics
from gemma4_fixture_specs import GREEDY_TOKENS, MIN_ARGMAX_MARGIN, MIN_ROUTER_GAP, PROMPTS, is_moe
from gemma4_random_weights import randomize_text_weights


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
