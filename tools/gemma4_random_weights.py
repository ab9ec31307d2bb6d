"""Seeded, non-trivial random weights for Gemma 4 text models and assistants.

HF's own initialiser leaves every RMSNorm weight at 1 and every layer scalar at 1, which would
let an implementation that ignores them pass. This one draws, in module-name order:
  linear weights    N(0, (0.7 / sqrt(fan_in))^2)   (output RMS about 0.7 of the input's)
  embeddings        N(0, 0.1^2)                    (the token and per-layer tables)
  RMSNorm weights   U(0.6, 1.4)                    (used as is: Gemma 4 has no `1 + w`)
  q_norm / k_norm   U(0.3, 0.7)                    (see below)
  layer scalars     U(0.6, 1.1)
  token_ordering    a random permutation of the vocabulary (assistant centroid head)
  MoE router        proj ROUTER_SPLIT * signs u^T + N(0, ROUTER_NOISE^2) (see below), scale
                    U(0.6, 1.4), per_expert_scale U(0.5, 1.5)
  MoE experts       gate_up_proj [E, 2I, H] N(0, (0.7 / sqrt(H))^2), down_proj [E, H, I]
                    N(0, (0.7 / sqrt(I))^2) (fan-in scaling as for the linear layers)

Gemma 4 attention uses scaling 1.0 on RMS-normalised queries and keys, so the q_norm/k_norm
weights set the attention temperature. With weights around 1 the softmax is nearly one-hot and
the assistant's step-to-step recurrence amplifies a 1e-6 rounding difference roughly tenfold
per step, which would make its 7-step references irreproducible by another f32 implementation;
weights around 0.5 keep attention spread over several keys and the recurrence contracting.

Assistants pass `post_norm_scale=0.4` (post-attention, post-feedforward and post-PLE norms in
U(0.24, 0.56)). With full-size post-norms the normalised attention output over the fixed shared
K/V dominates the assistant's residual stream, so every step drafts the same token; smaller
post-norms keep the step's input (token embedding + previous hidden) visible, and the drafts vary.

The MoE router's input is RMS-normalised and scaled by hidden^-0.5 (times `router.scale`), so it
has a norm of about 1 and each coordinate about 1/8 (hidden 64). The fixtures need the router's
top-k choice to be unambiguous at every position the references cover: the k-th largest
probability must beat the (k+1)-th by 1e-3 (gemma4_fixture_specs.py, MIN_ROUTER_GAP), over roughly
1400 decisions (prompt and greedy positions times layers). A router with i.i.d. Gaussian rows
cannot do that: whatever their scale, roughly 1 decision in 100 has a gap below 1e-3 (with
4 experts and top-2, p2 and p3 are both small whenever one expert dominates), so every seed
tried failed. So each layer's router is drawn as

    proj = ROUTER_SPLIT * signs u^T + ROUTER_NOISE * N(0, 1)   [E, H]

with u a random unit vector and signs a random arrangement of k "+1" and E - k "-1": the sign
of u.x (about N(0, 1/64)) picks the k experts marked +1 or the others, by a logit margin of
2 * ROUTER_SPLIT * |u.x|, and the Gaussian part orders the experts inside the group and gives
them different weights (and now and then, about 1.5 % of the decisions, lets a mixed pair win).
The selected pair then holds almost all the probability (each about 0.5), and only decisions
right where the two groups swap are near ties (about 4 in 10 000 on Gaussian inputs). Which
group is chosen changes from token to token, and the groups differ per layer.
`router.scale` and `per_expert_scale` are not ones, so ignoring either (or applying
`per_expert_scale` before the top-k renormalisation) changes the outputs. Models without MoE
blocks draw exactly the same numbers as before these branches existed.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.gemma4.modeling_gemma4 import (
    Gemma4RMSNorm,
    Gemma4TextDecoderLayer,
    Gemma4TextExperts,
    Gemma4TextRouter,
    Gemma4TextScaledWordEmbedding,
)
from transformers.models.gemma4_assistant.modeling_gemma4_assistant import Gemma4AssistantMaskedEmbedder


POST_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm", "post_per_layer_input_norm")
ROUTER_SPLIT = 96.0  # see the module docstring
ROUTER_NOISE = 0.5


def randomize_text_weights(model: nn.Module, seed: int, scope: str = "", post_norm_scale: float = 1.0) -> None:
    """Overwrite every text-model weight under `scope` with seeded, non-trivial values.

    Modules are visited in name order, embeddings first so that a tied `lm_head` keeps the
    embedding's distribution, and tied tensors are filled once; the result depends only on the
    seed and the architecture."""
    generator = torch.Generator().manual_seed(seed)
    seen: set[int] = set()

    def fill(tensor: torch.Tensor, values: torch.Tensor) -> None:
        if id(tensor) in seen:
            return
        seen.add(id(tensor))
        with torch.no_grad():
            tensor.copy_(values.to(tensor.dtype))

    modules = [(n, m) for n, m in sorted(model.named_modules(), key=lambda item: item[0]) if n.startswith(scope)]
    routers = {n for n, m in modules if isinstance(m, Gemma4TextRouter)}  # they fill their own proj

    for _name, module in modules:
        if isinstance(module, Gemma4TextScaledWordEmbedding):
            fill(module.weight, torch.randn(module.weight.shape, generator=generator) * 0.1)
    for name, module in modules:
        if isinstance(module, nn.Linear) and name.rpartition(".")[0] not in routers:
            shape = module.weight.shape
            fill(module.weight, torch.randn(shape, generator=generator) * (0.7 / shape[1] ** 0.5))
        elif isinstance(module, Gemma4RMSNorm) and module.with_scale:
            low, width = (0.3, 0.4) if name.endswith(("q_norm", "k_norm")) else (0.6, 0.8)
            scale = post_norm_scale if name.endswith(POST_NORMS) else 1.0
            fill(module.weight, scale * (low + width * torch.rand(module.weight.shape, generator=generator)))
        elif isinstance(module, Gemma4TextDecoderLayer):
            fill(module.layer_scalar, 0.6 + 0.5 * torch.rand(1, generator=generator))
        elif isinstance(module, Gemma4TextRouter):
            experts, hidden = module.proj.weight.shape
            direction = torch.randn(hidden, generator=generator)
            direction = direction / direction.norm()
            group = torch.randperm(experts, generator=generator) < module.config.top_k_experts
            signs = torch.where(group, 1.0, -1.0)
            noise = torch.randn(experts, hidden, generator=generator)
            fill(module.proj.weight, ROUTER_SPLIT * signs[:, None] * direction[None, :] + ROUTER_NOISE * noise)
            fill(module.scale, 0.6 + 0.8 * torch.rand(module.scale.shape, generator=generator))
            fill(module.per_expert_scale, 0.5 + torch.rand(module.per_expert_scale.shape, generator=generator))
        elif isinstance(module, Gemma4TextExperts):
            gate_up, down = module.gate_up_proj, module.down_proj
            fill(gate_up, torch.randn(gate_up.shape, generator=generator) * (0.7 / gate_up.shape[2] ** 0.5))
            fill(down, torch.randn(down.shape, generator=generator) * (0.7 / down.shape[2] ** 0.5))
        elif isinstance(module, Gemma4AssistantMaskedEmbedder):
            vocab = module.token_ordering.shape[0]
            fill(module.token_ordering, torch.randperm(vocab, generator=generator))
