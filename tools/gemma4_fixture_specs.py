"""What the Gemma 4 fixtures are: seeds, geometries, prompts and the thresholds the references
must clear. The builders take every such choice from here, so a new fixture or a changed size
is an edit to this file alone; tools/README.md describes each fixture in prose.
"""

from __future__ import annotations

import copy

import torch

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


def is_moe(spec: dict) -> bool:
    return bool(spec["text"].get("enable_moe_block"))
