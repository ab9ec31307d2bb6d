#!/usr/bin/env python3
"""A small Gemma 4-style tokenizer, its GGUF as llama.cpp's converter writes it, and reference
encodings from two independent implementations, for the tests of specd's `gemma4` GGUF
tokenizer (crates/text).

The tokenizer has Gemma 4's shape at a thousandth of its size: an SPM-style BPE tokenizer.json
(a normalizer replacing ' ' with U+2581, byte fallback to <0x00>..<0xFF>, Hugging Face's Gemma
decoders), Gemma 4's special tokens at the head of the vocabulary (<pad> <eos> <bos> <unk>
<mask>, the tool, thinking, channel and turn markers), whole tokens for runs of newlines, spaces
and tabs as Gemma 4 has, and BPE merges learnt here on the small corpus below. Rare characters (most CJK, every emoji) are left out of the alphabet so that they
take the byte fallback. tokenizer_config.json carries a short chat template in Gemma 4's turn
format.

The GGUF is written by the converter itself (convert_hf_to_gguf.py --vocab-only, whose
Gemma4Model.set_vocab writes tokenizer.ggml.model = gemma4, the tokens, types, merges and
special ids, add_bos_token and the template), from a copy of the tiny target-full checkpoint's
config with this tokenizer beside it. References come from llama.cpp's llama-tokenize (BOS
added, special tokens parsed) and from `tokenizers` on tokenizer.json (add_special_tokens);
the script stops if the two disagree on any test string.

Usage: gemma4_tokenizer_fixture.py LLAMACPP_TREE LLAMA_TOKENIZE OUT_DIR
(tools/gemma4_tokenizer_fixture.sh finds or builds the last two and picks the environment.)
Writes into OUT_DIR: gemma4-tokenizer.gguf, gemma4-tokenizer.hf.json (the tokenizer.json it
was converted from; the name keeps it from being read as the GGUF's tokenizer.json) and
gemma4-tokenizer.references.json.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

REPO_ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT = REPO_ROOT / "crates" / "models" / "tests" / "fixtures" / "gemma4" / "target-full"

SPACE = "\u2581"
# Gemma 4's control and marker tokens, in its order (ids 0-4, then the tool, thinking, channel
# and turn markers; Gemma 4 numbers them 46-52, 98, 100-101, 105-106).
SPECIAL = [
    "<pad>", "<eos>", "<bos>", "<unk>", "<mask>",
    "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
    "<tool_response|>", '<|"|>', "<|think|>", "<|channel>", "<channel|>", "<|turn>", "<turn|>",
]
# Gemma 4 has whole tokens for runs of up to 31 newlines, spaces and tabs; here up to 8 / 8 / 4.
RUNS = [("\n", 8), (SPACE, 8), ("\t", 4)]
VOCAB_SIZE = 1024
# Characters seen fewer times than this stay out of the alphabet and fall back to bytes.
ALPHABET_LIMIT = 90

CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog does not mind; it has seen the fox before.
A speculative decoder lets a small model draft a few tokens and a large model verify them.
When the drafts are right, the large model accepts them all in one forward pass.
When a draft is wrong, the verifier keeps the accepted prefix and emits its own next token.
The output is exactly what the large model would have written alone, token for token.
Tokenizers split text into pieces: words, parts of words, spaces, punctuation and bytes.
Byte fallback means that no text is ever unknown: a character outside the vocabulary is
written as the bytes of its UTF-8 encoding, one token per byte.
In this tokenizer a space is part of the word that follows it, as in SentencePiece.
There are tokens for runs of spaces, runs of newlines and runs of tabs, which code needs.

def greet(name):
    \"\"\"Return a greeting for name.\"\"\"
    if not name:
        return "Hello, world!"
    return f"Hello, {name}!"

for i in range(10):
    print(i, greet(str(i)))

fn main() {
    let numbers = vec![1, 2, 3, 4, 5];
    let total: i32 = numbers.iter().sum();
    println!("total = {}", total);
}

struct Point { x: f64, y: f64 }
impl Point {
    fn norm(&self) -> f64 { (self.x * self.x + self.y * self.y).sqrt() }
}

Le renard brun saute par-dessus le chien paresseux. Où est la gare ? Très bien, merci.
Der schnelle braune Fuchs springt über den faulen Hund. Schöne Grüße aus München.
El zorro marrón salta sobre el perro perezoso. ¿Dónde está la estación? Mañana.
Η γρήγορη καφέ αλεπού. Быстрая коричневая лиса прыгает через ленивую собаку.
日本語の文章です。今日はいい天気です。
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 1000 2024 3.14159 -7 1e-6 0x1F
Punctuation: (a, b) [c; d] {e: f} <g/> "quoted" 'single' a+b=c a*b a/b a%b a&b a|b a^b ~a
User: What is the capital of France?
Model: The capital of France is Paris.
User: And of Germany?
Model: Berlin is the capital of Germany.
"""

# A short chat template in Gemma 4's turn format: a system message is the first turn, the
# assistant's role is "model", every turn ends with <turn|> and a newline, contents are
# trimmed, and the generation prompt opens the model's turn with an empty thought channel
# (what Gemma 4's own template writes when thinking is off).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<|turn>' + role + '\\n' + message['content'] | trim + '<turn|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|turn>model\\n<|channel>thought\\n<channel|>' }}{% endif %}"
)

TEST_STRINGS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "many        spaces inside",
    "one\ntwo",
    "one\n\ntwo\n\n\nthree",
    "\n",
    "\n\n\n\n\n\n\n\n\n\n\n\n",
    "line\r\nwindows line",
    "\tindented\n\t\ttwice",
    "    four-space indent\n        eight",
    "café naïve Zürich Ελληνικά",
    "日本語のテキストと漢字",
    "emoji 🚀 and 👩‍💻 and 🦙",
    "\x00\x01\x7f control bytes",
    "<|turn>user\nWhat is 2 + 2?<turn|>\n<|turn>model\n",
    "text<eos>more text<bos>",
    "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>",
    "not a <|turn marker and <turn| either",
    "def f(x):\n    return x ** 2  # square\n",
    "Numbers 1234567890 and 3.14159",
]

CHAT_REFERENCES = [
    [{"role": "user", "content": "Hello there"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "  And of Germany?  "},
    ],
]


def train_merges(budget: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Up to `budget` BPE tokens (the alphabet, then one per merge) learnt on CORPUS the way
    SentencePiece sees text: spaces as U+2581 starting each word, newlines apart. The most
    frequent pair merges first, ties going to the smaller pair, so the result is reproducible
    (Hugging Face's trainer breaks ties by hash order)."""
    words: Counter[tuple[str, ...]] = Counter()
    for line in CORPUS.replace(" ", SPACE).split("\n"):
        for word in re.findall(f"{SPACE}?[^{SPACE}]+|{SPACE}", line):
            words[tuple(word)] += 1
    chars: Counter[str] = Counter()
    for word, count in words.items():
        for char in word:
            chars[char] += count
    alphabet = sorted(sorted(chars), key=lambda c: -chars[c])[:ALPHABET_LIMIT]
    tokens = sorted(alphabet)
    known = set(tokens)
    merges = []
    while len(tokens) < budget:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for a, b in zip(word, word[1:]):
                if a in known and b in known:
                    pairs[(a, b)] += count
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merged = best[0] + best[1]
        merges.append(best)
        if merged not in known:
            tokens.append(merged)
            known.add(merged)
        words = Counter({merge_word(word, best): count for word, count in words.items()})
    return tokens, merges


def merge_word(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def build_vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    vocab: dict[str, int] = {}

    def add(token: str) -> None:
        if token not in vocab:
            vocab[token] = len(vocab)

    for token in SPECIAL:
        add(token)
    run_merges = []
    for char, longest in RUNS:
        for n in range(1, longest + 1):
            add(char * n)
    # Every split of a run into two shorter runs is a merge, longest runs first, as in the
    # merges Gemma 4's tokenizer.json lists first.
    for n in range(max(longest for _, longest in RUNS), 1, -1):
        for char, longest in RUNS:
            if n <= longest:
                run_merges.extend((char * k, char * (n - k)) for k in range(n - 1, 0, -1))
    for byte in range(256):
        add(f"<0x{byte:02X}>")
    # Some learnt tokens (U+2581, short runs) are already there: learn more than the room left.
    trained_tokens, trained_merges = train_merges(VOCAB_SIZE - len(vocab) + 16)
    merges = list(run_merges)
    seen = set(merges)
    for token in trained_tokens:
        if len(vocab) == VOCAB_SIZE:
            break
        add(token)
    for a, b in trained_merges:
        if (a, b) not in seen and a in vocab and b in vocab and a + b in vocab:
            merges.append((a, b))
            seen.add((a, b))
    assert len(vocab) == VOCAB_SIZE, len(vocab)
    return vocab, merges


def tokenizer_json(vocab: dict[str, int], merges: list[tuple[str, str]]) -> dict:
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    tokenizer = Tokenizer(bpe)
    tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B:1", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return json.loads(tokenizer.to_str())


def llama_ids(llama_tokenize: str, gguf: Path, text: str, work: Path) -> list[int]:
    prompt = work / "prompt.txt"
    prompt.write_bytes(text.encode("utf-8"))
    out = subprocess.run(
        [llama_tokenize, "-m", str(gguf), "-f", str(prompt), "--ids", "--log-disable"],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    tree, llama_tokenize, out_dir = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab, merges = build_vocabulary()
    hf = tokenizer_json(vocab, merges)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # The directory name becomes general.name.
        model_dir = work / "gemma4-tokenizer"
        model_dir.mkdir()
        config = json.loads((CHECKPOINT / "config.json").read_text())
        config["vocab_size"] = VOCAB_SIZE
        config["vocab_size_per_layer_input"] = VOCAB_SIZE
        (model_dir / "config.json").write_text(json.dumps(config, indent=2))
        shutil.copy(CHECKPOINT / "generation_config.json", model_dir)
        (model_dir / "tokenizer.json").write_text(json.dumps(hf, ensure_ascii=False))
        (model_dir / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "GemmaTokenizer",
            "pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>",
            "unk_token": "<unk>", "mask_token": "<mask>",
            "extra_special_tokens": SPECIAL[5:],
            "add_bos_token": True, "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        }, indent=2))
        gguf = out_dir / "gemma4-tokenizer.gguf"
        env = dict(os.environ, PYTHONPATH=str(tree / "gguf-py"))
        converted = subprocess.run(
            [sys.executable, str(tree / "convert_hf_to_gguf.py"), str(model_dir), "--vocab-only",
             "--outtype", "f32", "--outfile", str(gguf)],
            env=env, capture_output=True, text=True,
        )
        if converted.returncode != 0:
            sys.exit(converted.stdout + converted.stderr)
        shutil.copy(model_dir / "tokenizer.json", out_dir / "gemma4-tokenizer.hf.json")

        reference = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        encodings = []
        for text in TEST_STRINGS:
            ids = llama_ids(llama_tokenize, gguf, text, work)
            hf_ids = reference.encode(text, add_special_tokens=True).ids
            if ids != hf_ids:
                sys.exit(f"llama.cpp and tokenizers disagree on {text!r}: {ids} vs {hf_ids}")
            decoded = reference.decode(ids[1:], skip_special_tokens=False)
            if decoded != text:
                sys.exit(f"tokenizers does not decode {text!r} back: {decoded!r}")
            encodings.append({"text": text, "ids": ids})

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        template = env.from_string(CHAT_TEMPLATE)
        chats = []
        for messages in CHAT_REFERENCES:
            rendered = template.render(messages=messages, add_generation_prompt=True,
                                       bos_token="<bos>", eos_token="<eos>")
            # The template writes the BOS itself: llama.cpp's own would be a second one.
            ids = llama_ids(llama_tokenize, gguf, rendered, work)[1:]
            if ids != reference.encode(rendered, add_special_tokens=False).ids:
                sys.exit(f"llama.cpp and tokenizers disagree on the chat {messages!r}")
            chats.append({"messages": messages, "rendered": rendered, "ids": ids})

    # One reference a line, so that a regenerated file diffs readably.
    def lines(entries: list[dict]) -> str:
        return ",\n".join("  " + json.dumps(e, ensure_ascii=False) for e in entries)

    about = ("encodings of gemma4-tokenizer.gguf by llama.cpp's llama-tokenize (BOS added, special "
             "tokens parsed), equal to tokenizers' on gemma4-tokenizer.hf.json; chat prompts "
             "rendered by jinja2 and encoded without an added BOS "
             "(tools/gemma4_tokenizer_fixture.py)")
    (out_dir / "gemma4-tokenizer.references.json").write_text(
        "{\n"
        f' "about": {json.dumps(about)},\n'
        f' "vocab_size": {VOCAB_SIZE},\n'
        f' "merges": {len(merges)},\n'
        f' "encodings": [\n{lines(encodings)}\n ],\n'
        f' "chats": [\n{lines(chats)}\n ]\n'
        "}\n"
    )
    print(f"{gguf}: {VOCAB_SIZE} tokens, {len(merges)} merges, {len(encodings)} references",
          file=sys.stderr)


if __name__ == "__main__":
    main()
