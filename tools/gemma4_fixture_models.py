"""HF Gemma 4 configs built from the fixture specs, and the parts of a built model the
references read (one place that knows a multimodal target nests its text model)."""

from __future__ import annotations

from torch import nn
from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig
from transformers.models.gemma4_assistant import Gemma4AssistantConfig

from gemma4_fixture_specs import ASSISTANT_TEXT, BOS, EOS, PAD, ROPE_PARAMETERS, TARGETS


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


def text_model_of(model: nn.Module) -> nn.Module:
    if isinstance(model, Gemma4ForConditionalGeneration):
        return model.model.language_model
    return model.model


def text_config_of(model: nn.Module) -> Gemma4TextConfig:
    return model.config.get_text_config()
