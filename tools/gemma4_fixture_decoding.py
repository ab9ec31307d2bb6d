"""Greedy decoding with eos disabled, both by a plain argmax loop over HF's cache and by HF's
own `generate`, so that each can check the other."""

from __future__ import annotations

import copy

import torch
from torch import nn

from gemma4_fixture_specs import PAD


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
