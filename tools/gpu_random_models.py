"""Random-weight models of realistic size, written with numpy alone, for timing specd where
only small files can be shipped (a GPU machine with no network): the files are made there.

  gemma4 DIR    a Gemma 4 text target (config.json + model.safetensors, BF16 by default) in
                the layout of the `target-nople` fixture: no per-layer inputs, no KV sharing,
                sliding and full attention layers, a tied head; about 1.1B parameters by default
  qwen2 FILE    a Qwen2 GGUF (Q8_0 matrices, F32 norms and biases) of Qwen2.5-0.5B's geometry
                by default, with the smallest byte-level BPE tokenizer specd reads (the 256
                byte tokens, fillers, `<|endoftext|>` last, no merges): run it with --prompt-ids
  check-shapes  builds the tensor list of the tiny `target-nople` fixture's config with the
                same rules and compares it with that fixture's safetensors header, so the rules
                used at any size are the ones specd already loads

Weights follow tools/gemma4_random_weights.py's distributions (linear N(0, (0.7/sqrt(fan_in))^2),
embeddings N(0, 0.1^2), norms U(0.6, 1.4), q/k norms U(0.3, 0.7), layer scalars U(0.6, 1.1)),
drawn from one seeded generator. The outputs of such a model mean nothing; they are for timing
and for comparing one device or one decoding mode with another on the same weights.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).resolve().parent.parent / "crates/models/tests/fixtures/gemma4/target-nople"


def gemma4_config(args: argparse.Namespace) -> dict:
    # Five sliding layers, then a full one, as Gemma 4 checkpoints alternate them.
    layer_types = [
        "full_attention" if (i + 1) % 6 == 0 or i == args.layers - 1 else "sliding_attention"
        for i in range(args.layers)
    ]
    return {
        "architectures": ["Gemma4ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attention_k_eq_v": False,
        "bos_token_id": 2,
        "dtype": "bfloat16" if args.dtype == "bf16" else "float32",
        "enable_moe_block": False,
        "eos_token_id": 1,
        "final_logit_softcapping": 30.0,
        "global_head_dim": args.global_head_dim,
        "head_dim": args.head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": args.hidden,
        "hidden_size_per_layer_input": 0,
        "initializer_range": 0.02,
        "intermediate_size": args.intermediate,
        "layer_types": layer_types,
        "max_position_embeddings": 8192,
        "model_type": "gemma4_text",
        "moe_intermediate_size": None,
        "num_attention_heads": args.heads,
        "num_experts": None,
        "num_global_key_value_heads": 1,
        "num_hidden_layers": args.layers,
        "num_key_value_heads": args.kv_heads,
        "num_kv_shared_layers": 0,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": args.sliding_window,
        "tie_word_embeddings": True,
        "top_k_experts": None,
        "use_bidirectional_attention": None,
        "use_cache": True,
        "use_double_wide_mlp": False,
        "vocab_size": args.vocab,
        "vocab_size_per_layer_input": 0,
    }


def gemma4_tensors(cfg: dict) -> list[tuple[str, list[int], str]]:
    """(name, shape, kind) of every tensor of a `target-nople`-style config; kind picks the
    distribution."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    layers = cfg["num_hidden_layers"]
    first_shared = layers - cfg["num_kv_shared_layers"]
    out = [("model.embed_tokens.weight", [cfg["vocab_size"], h], "embed")]
    for i, kind in enumerate(cfg["layer_types"]):
        hd = cfg["global_head_dim"] if kind == "full_attention" else cfg["head_dim"]
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", [h], "norm"),
            (p + "layer_scalar", [1], "scalar"),
            (p + "mlp.down_proj.weight", [h, inter], "linear"),
            (p + "mlp.gate_proj.weight", [inter, h], "linear"),
            (p + "mlp.up_proj.weight", [inter, h], "linear"),
            (p + "post_attention_layernorm.weight", [h], "norm"),
            (p + "post_feedforward_layernorm.weight", [h], "norm"),
            (p + "pre_feedforward_layernorm.weight", [h], "norm"),
            (p + "self_attn.o_proj.weight", [h, heads * hd], "linear"),
            (p + "self_attn.q_norm.weight", [hd], "qknorm"),
            (p + "self_attn.q_proj.weight", [heads * hd, h], "linear"),
        ]
        # KV-shared layers read an earlier layer's K/V and store no projections of their own.
        if i < first_shared:
            out += [
                (p + "self_attn.k_norm.weight", [hd], "qknorm"),
                (p + "self_attn.k_proj.weight", [kv * hd, h], "linear"),
                (p + "self_attn.v_proj.weight", [kv * hd, h], "linear"),
            ]
    out.append(("model.norm.weight", [h], "norm"))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", [cfg["vocab_size"], h], "linear"))
    return sorted(out)


def draw(rng: np.random.Generator, shape: list[int], kind: str) -> np.ndarray:
    n = int(np.prod(shape))
    if kind == "linear":
        x = rng.standard_normal(n, dtype=np.float32) * np.float32(0.7 / np.sqrt(shape[-1]))
    elif kind == "embed":
        x = rng.standard_normal(n, dtype=np.float32) * np.float32(0.1)
    elif kind == "norm":
        x = rng.uniform(0.6, 1.4, n).astype(np.float32)
    elif kind == "qknorm":
        x = rng.uniform(0.3, 0.7, n).astype(np.float32)
    elif kind == "scalar":
        x = rng.uniform(0.6, 1.1, n).astype(np.float32)
    elif kind == "bias":
        x = rng.standard_normal(n, dtype=np.float32) * np.float32(0.1)
    else:
        raise ValueError(kind)
    return x.reshape(shape)


def to_bf16_bytes(x: np.ndarray) -> bytes:
    # Round to nearest even on the upper 16 bits (finite inputs only, which these are).
    u = x.astype(np.float32).view(np.uint32)
    u = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    return u.astype("<u2").tobytes()


def write_gemma4(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = gemma4_config(args)
    tensors = gemma4_tensors(cfg)
    st_dtype, width = ("BF16", 2) if args.dtype == "bf16" else ("F32", 4)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in tensors:
        size = int(np.prod(shape)) * width
        header[name] = {"dtype": st_dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    rng = np.random.default_rng(args.seed)
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, kind in tensors:
            x = draw(rng, shape, kind)
            f.write(to_bf16_bytes(x) if args.dtype == "bf16" else x.astype("<f4").tobytes())
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    params = sum(int(np.prod(s)) for _, s, _ in tensors)
    print(f"gemma4: {out}: {params / 1e9:.3f}B parameters, {offset / 2**30:.2f} GiB {st_dtype}")


def check_shapes(_: argparse.Namespace) -> int:
    cfg = json.loads((FIXTURE / "config.json").read_text())
    raw = (FIXTURE / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    want = sorted((k, v["shape"]) for k, v in header.items() if k != "__metadata__")
    got = sorted((name, shape) for name, shape, _ in gemma4_tensors(cfg))
    if want != got:
        print("shape rules disagree with the fixture:")
        for item in sorted(set(map(str, want)) ^ set(map(str, got))):
            print("  ", item)
        return 1
    print(f"shape rules reproduce {FIXTURE.name}: {len(got)} tensors")
    return 0


# GGUF: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (version 3, little-endian).
GGUF_U32, GGUF_I32, GGUF_F32, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 8, 9
GGML_F32, GGML_Q8_0 = 0, 8
ALIGN = 32


def gguf_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-character map: the byte-level BPE vocabulary's first 256 tokens."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def gguf_value(kind: int, value) -> bytes:
    if kind == GGUF_STRING:
        return gguf_string(value)
    if kind == GGUF_U32:
        return struct.pack("<I", value)
    if kind == GGUF_I32:
        return struct.pack("<i", value)
    if kind == GGUF_F32:
        return struct.pack("<f", value)
    elem, items = value
    return struct.pack("<IQ", elem, len(items)) + b"".join(gguf_value(elem, v) for v in items)


def q8_0(x: np.ndarray) -> bytes:
    """Q8_0 blocks of 32: an f16 scale (max |x| / 127) then 32 int8."""
    blocks = x.astype(np.float32).reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0).astype(np.float32)
    q = np.clip(np.rint(blocks * inv[:, None]), -127, 127).astype(np.int8)
    out = np.empty((blocks.shape[0], 34), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def write_qwen2(args: argparse.Namespace) -> None:
    h, f, heads, kvh = args.hidden, args.ffn, args.heads, args.kv_heads
    kv = kvh * (h // heads)
    specs = [("token_embd.weight", [args.vocab, h], "embed")]
    for layer in range(args.layers):
        p = f"blk.{layer}."
        specs += [
            (p + "attn_norm.weight", [h], "norm"),
            (p + "attn_q.weight", [h, h], "linear"),
            (p + "attn_q.bias", [h], "bias"),
            (p + "attn_k.weight", [kv, h], "linear"),
            (p + "attn_k.bias", [kv], "bias"),
            (p + "attn_v.weight", [kv, h], "linear"),
            (p + "attn_v.bias", [kv], "bias"),
            (p + "attn_output.weight", [h, h], "linear"),
            (p + "ffn_norm.weight", [h], "norm"),
            (p + "ffn_gate.weight", [f, h], "linear"),
            (p + "ffn_up.weight", [f, h], "linear"),
            (p + "ffn_down.weight", [h, f], "linear"),
        ]
    specs.append(("output_norm.weight", [h], "norm"))
    meta = [
        ("general.architecture", GGUF_STRING, "qwen2"),
        ("qwen2.block_count", GGUF_U32, args.layers),
        ("qwen2.embedding_length", GGUF_U32, h),
        ("qwen2.feed_forward_length", GGUF_U32, f),
        ("qwen2.attention.head_count", GGUF_U32, heads),
        ("qwen2.attention.head_count_kv", GGUF_U32, kvh),
        ("qwen2.attention.layer_norm_rms_epsilon", GGUF_F32, 1e-6),
        ("qwen2.rope.freq_base", GGUF_F32, 1e6),
        ("qwen2.context_length", GGUF_U32, 32768),
    ]
    # specd's Qwen2 target reads its tokenizer from the file even when given token ids.
    tokens = byte_tokens()
    tokens += [f"<|filler_{i}|>" for i in range(len(tokens), args.vocab - 1)] + ["<|endoftext|>"]
    types = [1] * (args.vocab - 1) + [3]
    meta += [
        ("tokenizer.ggml.model", GGUF_STRING, "gpt2"),
        ("tokenizer.ggml.pre", GGUF_STRING, "qwen2"),
        ("tokenizer.ggml.tokens", GGUF_ARRAY, (GGUF_STRING, tokens)),
        ("tokenizer.ggml.token_type", GGUF_ARRAY, (GGUF_I32, types)),
        ("tokenizer.ggml.merges", GGUF_ARRAY, (GGUF_STRING, [])),
        ("tokenizer.ggml.eos_token_id", GGUF_U32, args.vocab - 1),
    ]

    def ggml_type(shape: list[int]) -> int:
        return GGML_Q8_0 if len(shape) == 2 else GGML_F32

    def nbytes(shape: list[int]) -> int:
        n = int(np.prod(shape))
        return n // 32 * 34 if ggml_type(shape) == GGML_Q8_0 else n * 4

    head = b"GGUF" + struct.pack("<IQQ", 3, len(specs), len(meta))
    for key, kind, value in meta:
        head += gguf_string(key) + struct.pack("<I", kind) + gguf_value(kind, value)
    offset = 0
    for name, shape, _ in specs:
        # ggml lists dimensions innermost first.
        head += gguf_string(name) + struct.pack("<I", len(shape))
        head += struct.pack(f"<{len(shape)}Q", *reversed(shape))
        head += struct.pack("<IQ", ggml_type(shape), offset)
        offset += nbytes(shape)
        offset += -offset % ALIGN
    head += b"\0" * (-len(head) % ALIGN)
    rng = np.random.default_rng(args.seed)
    with open(args.out, "wb") as out:
        out.write(head)
        written = 0
        for name, shape, kind in specs:
            x = draw(rng, shape, kind)
            data = q8_0(x) if ggml_type(shape) == GGML_Q8_0 else x.astype("<f4").tobytes()
            out.write(data)
            written += len(data)
            out.write(b"\0" * (-written % ALIGN))
            written += -written % ALIGN
    params = sum(int(np.prod(s)) for _, s, _ in specs)
    print(f"qwen2: {args.out}: {params / 1e9:.3f}B parameters, {written / 2**30:.2f} GiB Q8_0/F32")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gemma4")
    g.add_argument("out")
    g.add_argument("--hidden", type=int, default=2048)
    g.add_argument("--intermediate", type=int, default=8192)
    g.add_argument("--layers", type=int, default=16)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--kv-heads", type=int, default=4)
    g.add_argument("--head-dim", type=int, default=256)
    g.add_argument("--global-head-dim", type=int, default=512)
    g.add_argument("--vocab", type=int, default=32768)
    g.add_argument("--sliding-window", type=int, default=512)
    g.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    g.add_argument("--seed", type=int, default=1)
    q = sub.add_parser("qwen2")
    q.add_argument("out")
    q.add_argument("--hidden", type=int, default=896)
    q.add_argument("--ffn", type=int, default=4864)
    q.add_argument("--layers", type=int, default=24)
    q.add_argument("--heads", type=int, default=14)
    q.add_argument("--kv-heads", type=int, default=2)
    q.add_argument("--vocab", type=int, default=151936)
    q.add_argument("--seed", type=int, default=2)
    sub.add_parser("check-shapes")
    args = ap.parse_args()
    if args.cmd == "gemma4":
        write_gemma4(args)
    elif args.cmd == "qwen2":
        write_qwen2(args)
    else:
        return check_shapes(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
