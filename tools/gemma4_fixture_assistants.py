"""Builds an assistant (MTP drafter) fixture against its already built target: its checkpoint,
then per prompt the target's prefill state the assistant reads, every draft step's outputs,
and a cross-check against HF's own candidate generator, into reference.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn
from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator
from transformers.models.gemma4_assistant import Gemma4AssistantForCausalLM

import fixture_json
import hf_gemma4_workarounds
from fixture_json import f32_list, int_list
from gemma4_fixture_checkpoints import assert_same_weights, checkpoint_files, load_checkpoint, versions
from gemma4_fixture_decoding import greedy_generation_config, without_eos
from gemma4_fixture_models import assistant_config, layer_geometry, text_config_of, text_model_of
from gemma4_fixture_specs import (
    ASSISTANT_POST_NORM_SCALE,
    ASSISTANT_PROMPTS,
    DRAFT_STEPS,
    FULL,
    MIN_ARGMAX_MARGIN,
    PROMPTS,
    SLIDING,
)
from gemma4_random_weights import randomize_text_weights


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
