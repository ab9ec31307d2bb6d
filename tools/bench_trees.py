#!/usr/bin/env python3
"""Token trees against chains on the real pair, embedded (`specd generate`), per prompt kind.

Each prompt runs plain, then speculative with chains and with trees, REPS times in turn (so
load drifts hit every mode alike): the defaults (adaptive block size, chains vs trees of up to
3 branch drafts, each request choosing per round), fixed shapes of equal verify width (a
chain of 4 drafts against a tree of 2 levels and up to 2 branch drafts: 5 rows each), and each
small tree beside the chain of its depth (2 levels + 2 against 2 drafts; one draft with its
runner-up against one draft). Reports,
per kind and mode, tokens per round, speculative / plain decode speed (medians of per-rep
ratios, plain measured in the same rep) and whether every output equals plain. `--draft`
picks the drafting: the draft model (the default), prompt lookup in front of it (`hybrid`), or
prompt lookup alone (`ngram`, whose trees hold what followed other occurrences of the matched
n-gram). `--modes draft-weights` runs, instead of the shapes, the draft model's matrices as
stored against re-encoded to 4 bits (`--draft-weights q4`), at the default shapes.
"""

import argparse
import json
import statistics
import subprocess
import sys
from collections import defaultdict

MODES = [
    ("plain", ["--no-draft"]),
    ("chain (default)", ["--tree-nodes", "0"]),
    ("tree (default)", ["--tree-nodes", "3"]),
    ("chain, 4 drafts", ["--block-size", "5", "--tree-nodes", "0"]),
    ("tree, 2 levels + 2", ["--block-size", "3", "--tree-nodes", "2"]),
    ("chain, 2 drafts", ["--block-size", "3", "--tree-nodes", "0"]),
    ("chain, 1 draft", ["--block-size", "2", "--tree-nodes", "0"]),
    ("tree, 1 level + 1", ["--block-size", "2", "--tree-nodes", "1"]),
]

MODE_SETS = {
    "trees": MODES,
    "draft-weights": [
        ("plain", ["--no-draft"]),
        ("drafter as stored", ["--draft-weights", "stored"]),
        ("drafter at 4 bits", ["--draft-weights", "q4"]),
    ],
}


def prompts(specd_bench, kinds):
    out = subprocess.run(
        [specd_bench, "--print-prompts"] + (["--kinds", kinds] if kinds else []),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [tuple(line.split("\t", 1)) for line in out.splitlines() if "\t" in line]


def generate(args, prompt, flags):
    command = [
        args.specd, "generate", "--target", args.target, "--prompt", prompt,
        "--max-tokens", str(args.max_tokens), "--json",
    ]
    if flags != ["--no-draft"]:
        command += ["--draft", args.draft]
        if args.draft != "ngram":
            command += ["--drafter", args.drafter]
    out = subprocess.run(command + flags, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--specd", required=True)
    parser.add_argument("--specd-bench", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--kinds", default="")
    parser.add_argument("--draft", default="draft-model",
                        choices=["draft-model", "hybrid", "ngram"],
                        help="how rounds draft: the draft model, prompt lookup in front of it, "
                             "or prompt lookup alone")
    parser.add_argument("--modes", default="trees", choices=sorted(MODE_SETS),
                        help="the tree and chain shapes, or the draft model's precision")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    modes = MODE_SETS[args.modes]

    rows = defaultdict(lambda: defaultdict(list))  # kind -> mode -> samples
    raw = []
    for kind, prompt in prompts(args.specd_bench, args.kinds):
        for rep in range(args.reps):
            results = {name: generate(args, prompt, flags) for name, flags in modes}
            plain = results["plain"]
            plain_rate = plain["speed"]["decode_tokens_per_s"]
            for name, result in results.items():
                stats = result.get("stats", {})
                sample = {
                    "speedup": result["speed"]["decode_tokens_per_s"] / plain_rate,
                    "tokens_per_round": stats.get("mean_accepted_tokens_per_round") or 1.0,
                    "tree_rounds": stats.get("tree_rounds", 0),
                    "rounds": stats.get("rounds", 0),
                    "same": result["tokens"] == plain["tokens"],
                }
                rows[kind][name].append(sample)
                raw.append({"kind": kind, "prompt": prompt, "rep": rep, "mode": name, **sample})
            print(f"{kind} rep {rep}: " + ", ".join(
                f"{n} {rows[kind][n][-1]['speedup']:.2f}x" for n, _ in modes), file=sys.stderr)

    with open(f"{args.out}/trees.json", "w") as f:
        json.dump(raw, f, indent=1)
    lines = [
        "| kind | mode | tokens/round | spec / plain (median) | tree rounds | output = plain |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for kind, by_mode in rows.items():
        for name, _ in modes:
            samples = by_mode[name]
            tpr = statistics.mean(s["tokens_per_round"] for s in samples)
            speed = statistics.median(s["speedup"] for s in samples)
            trees = sum(s["tree_rounds"] for s in samples)
            rounds = sum(s["rounds"] for s in samples)
            same = all(s["same"] for s in samples)
            lines.append(
                f"| {kind} | {name} | {tpr:.2f} | {speed:.2f} | {trees}/{rounds} | "
                f"{'yes' if same else 'NO'} |"
            )
    report = "\n".join(lines)
    with open(f"{args.out}/report.md", "w") as f:
        f.write(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
