"""Checks that make a MoE target's references trustworthy for an f32 reimplementation: the
recorded routing is unambiguous, matches the routing rules recomputed from the weights, and
HF's default experts kernel agrees with the eager loop the references come from."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

from gemma4_fixture_checkpoints import load_checkpoint
from gemma4_fixture_decoding import greedy_decode
from gemma4_fixture_models import text_model_of
from gemma4_fixture_specs import GREEDY_TOKENS


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
