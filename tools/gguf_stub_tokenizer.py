#!/usr/bin/env python3
"""Writes the smallest tokenizer llama.cpp's convert_hf_to_gguf.py takes for a Gemma 4
checkpoint that has none: a byte-fallback BPE of exactly the config's vocab_size tokens
(<pad> 0, <eos> 1, <bos> 2, <unk> 3, then byte tokens; an assistant's vocab_size is in its
text_config), so that the converter cuts no embedding row. It only fills the GGUF vocabulary;
specd and llama.cpp are fed token ids.

Usage: gguf_stub_tokenizer.py CHECKPOINT_DIR [--loadable]

--loadable adds one merge (a b -> ab) and filler tokens past the 256 byte tokens: llama.cpp's
gemma4 tokenizer refuses to load a file without merges, which the converter alone does not
mind.
"""

import json
import sys
from pathlib import Path


def main() -> None:
    d = Path(sys.argv[1])
    loadable = "--loadable" in sys.argv[2:]
    config = json.loads((d / "config.json").read_text())
    # An assistant (gemma4_assistant) keeps its vocabulary size in its text_config.
    n = config.get("vocab_size") or config["text_config"]["vocab_size"]
    special = ["<pad>", "<eos>", "<bos>", "<unk>"]
    if not loadable and n > len(special) + 256:
        sys.exit(f"{d}: vocab_size {n} is larger than this stub tokenizer can fill")
    vocab = {t: i for i, t in enumerate(special)}
    for b in range(min(256, n - len(special))):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    merges = []
    if loadable:
        for t in ("a", "b", "ab"):
            vocab[t] = len(vocab)
        merges = ["a b"]
        while len(vocab) < n:
            vocab[f"tok{len(vocab)}"] = len(vocab)
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, t in enumerate(special)
        ],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False, "vocab": vocab, "merges": merges},
    }
    (d / "tokenizer.json").write_text(json.dumps(tokenizer))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False,
    }))


if __name__ == "__main__":
    main()
