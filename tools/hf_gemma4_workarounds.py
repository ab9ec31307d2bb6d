"""Workarounds for two bugs in Hugging Face transformers 5.23.0's Gemma 4 code.

`install()` first probes whether each bug reproduces in the installed transformers (the result
is recorded in every reference file), then applies both patches. Neither patch changes anything
for configurations that already work, so the fixtures equal what a fixed transformers would
compute. tools/README.md describes the bugs in prose.

1. `Gemma4TextModel._maybe_slice_kv_shared_inputs` slices `per_layer_inputs` unconditionally.
   A text model without per-layer embeddings (`hidden_size_per_layer_input == 0`) passes
   `per_layer_inputs=None`, so any forward of more than one token through a model with
   `num_kv_shared_layers > 0` raises `TypeError: 'NoneType' object is not subscriptable`
   (plain forwards and `generate`'s prefill alike; only single-token steps and forwards that
   request hidden states or attentions skip the slicing). The patch runs
   the original slicing with a dummy per-layer tensor and hands `None` back.

2. `Gemma4TextConfig.kv_sharing_modes` assumes at least one layer produces K/V. A Gemma 4
   assistant (`Gemma4AssistantConfig`) forces `num_kv_shared_layers == num_hidden_layers`, so
   the producing set is empty and the property raises `ValueError: The set of layer types
   producing a cache is different than the set of layer types using them`; no assistant can be
   instantiated. The patch returns `"reuse"` for every layer in that case, which is what the
   assistant's attention expects: every layer reads `shared_kv_states[layer_type]` from the
   target and owns no k/v projections.
"""

from __future__ import annotations

import torch
from transformers.models.gemma4 import configuration_gemma4, modeling_gemma4

_INSTALLED = False


def _slice_without_per_layer_inputs(original):
    def patched(self, hidden_states, per_layer_inputs, *args, **kwargs):
        if per_layer_inputs is not None:
            return original(self, hidden_states, per_layer_inputs, *args, **kwargs)
        batch, seq_len = hidden_states.shape[:2]
        placeholder = hidden_states.new_zeros(batch, seq_len, 1, 1)
        hidden_states, _, position_embeddings, masks = original(
            self, hidden_states, placeholder, *args, **kwargs
        )
        return hidden_states, None, position_embeddings, masks

    return patched


def _kv_sharing_modes_allowing_all_shared(original_property):
    def kv_sharing_modes(self):
        if self.num_kv_shared_layers and self.num_kv_shared_layers >= self.num_hidden_layers:
            return ["reuse"] * self.num_hidden_layers
        return original_property.fget(self)

    return property(kv_sharing_modes)


def _probe_bug_1() -> bool:
    """True if the unpatched slicing fails for a model without per-layer embeddings."""
    config = configuration_gemma4.Gemma4TextConfig(**_TINY_TEXT)
    model = modeling_gemma4.Gemma4TextModel(config)
    states = torch.zeros(1, 3, _TINY_TEXT["hidden_size"])
    try:
        model._maybe_slice_kv_shared_inputs(states, None, {}, {}, 0, past_key_values=None)
    except TypeError:
        return True
    return False


def _probe_bug_2() -> bool:
    """True if a config whose layers are all KV-shared cannot list its sharing modes."""
    config = configuration_gemma4.Gemma4TextConfig(**_TINY_TEXT)
    config.num_kv_shared_layers = config.num_hidden_layers
    try:
        _ = config.kv_sharing_modes
    except ValueError:
        return True
    return False


_TINY_TEXT = dict(
    vocab_size=16,
    hidden_size=8,
    intermediate_size=8,
    num_hidden_layers=2,
    num_attention_heads=1,
    num_key_value_heads=1,
    head_dim=8,
    global_head_dim=8,
    layer_types=["sliding_attention", "full_attention"],
    sliding_window=4,
    hidden_size_per_layer_input=0,
    vocab_size_per_layer_input=0,
)

# Filled by `install()`: whether each bug reproduced in the installed transformers.
BUGS_PRESENT: dict[str, bool] = {}


def install() -> dict[str, bool]:
    """Probe both bugs, apply both patches once per process, return the probe results."""
    global _INSTALLED
    if _INSTALLED:
        return BUGS_PRESENT
    BUGS_PRESENT["slice_kv_shared_inputs_without_ple"] = _probe_bug_1()
    BUGS_PRESENT["kv_sharing_modes_all_layers_shared"] = _probe_bug_2()
    text_model = modeling_gemma4.Gemma4TextModel
    text_model._maybe_slice_kv_shared_inputs = _slice_without_per_layer_inputs(
        text_model._maybe_slice_kv_shared_inputs
    )
    config_class = configuration_gemma4.Gemma4TextConfig
    config_class.kv_sharing_modes = _kv_sharing_modes_allowing_all_shared(
        config_class.__dict__["kv_sharing_modes"]
    )
    _INSTALLED = True
    return BUGS_PRESENT
