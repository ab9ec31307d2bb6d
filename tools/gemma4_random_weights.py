"""Seeded, non-trivial random weights for Gemma 4 text models and assistants.

HF's own initialiser leaves every RMSNorm weight at 1 and every layer scalar at 1, which would
let an implementation that ignores them pass. This one draws, in module-name order:
  linear weights    N(0, (0.7 / sqrt(fan_in))^2)   (output RMS about 0.7 of the input's)
  embeddings        N(0, 0.1^2)                    (the token and per-layer tables)
  RMSNorm weights   U(0.6, 1.4)                    (used as is: Gemma 4 has no `1 + w`)
  q_norm / k_norm   U(0.3, 0.7)                    (see below)
  layer scalars     U(0.6, 1.1)
  token_ordering    a random permutation of the vocabulary (assistant centroid head)

Gemma 4 attention uses scaling 1.0 on RMS-normalised queries and keys, so the q_norm/k_norm
weights set the attention temperature. With weights around 1 the softmax is nearly one-hot and
the assistant's step-to-step recurrence amplifies a 1e-6 rounding difference roughly tenfold
per step, which would make its 7-step references irreproducible by another f32 implementation;
weights around 0.5 keep attention spread over several keys and the recurrence contracting.

Assistants pass `post_norm_scale=0.4` (post-attention, post-feedforward and post-PLE norms in
U(0.24, 0.56)). With full-size post-norms the normalised attention output over the fixed shared
K/V dominates the assistant's residual stream, so every step drafts the same token; smaller
post-norms keep the step's input (token embedding + previous hidden) visible, and the drafts vary.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.gemma4.modeling_gemma4 import (
    Gemma4RMSNorm,
    Gemma4TextDecoderLayer,
    Gemma4TextScaledWordEmbedding,
)
from transformers.models.gemma4_assistant.modeling_gemma4_assistant import Gemma4AssistantMaskedEmbedder


POST_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm", "post_per_layer_input_norm")


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
    for _name, module in modules:
        if isinstance(module, Gemma4TextScaledWordEmbedding):
            fill(module.weight, torch.randn(module.weight.shape, generator=generator) * 0.1)
    for name, module in modules:
        if isinstance(module, nn.Linear):
            shape = module.weight.shape
            fill(module.weight, torch.randn(shape, generator=generator) * (0.7 / shape[1] ** 0.5))
        elif isinstance(module, Gemma4RMSNorm) and module.with_scale:
            low, width = (0.3, 0.4) if name.endswith(("q_norm", "k_norm")) else (0.6, 0.8)
            scale = post_norm_scale if name.endswith(POST_NORMS) else 1.0
            fill(module.weight, scale * (low + width * torch.rand(module.weight.shape, generator=generator)))
        elif isinstance(module, Gemma4TextDecoderLayer):
            fill(module.layer_scalar, 0.6 + 0.5 * torch.rand(1, generator=generator))
        elif isinstance(module, Gemma4AssistantMaskedEmbedder):
            vocab = module.token_ordering.shape[0]
            fill(module.token_ordering, torch.randperm(vocab, generator=generator))
