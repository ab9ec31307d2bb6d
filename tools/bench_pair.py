#!/usr/bin/env python3
"""specd and llama.cpp side by side on the Qwen2.5-Coder 1.5B target / 0.5B drafter pair.

Driven by tools/bench_pair.sh, which builds both tools first. In one run, with the same
prompts (the chat-templated texts `specd bench` renders), the same number of new tokens and
greedy decoding:

- specd: `specd bench --sweep` (plain, then fixed K drafts per round for the draft-model and
  n-gram drafters), which also measures the step costs and checks every speculative output
  against plain;
- llama.cpp: `llama-completion` (plain) and `llama-speculative-simple` (draft model, K drafts)
  on each prompt, plus `llama-bench` for its decode and small-batch costs.

Tokens per second count decode only (prompt processing excluded) on both sides. Writes
specd.json, llama.json, report.md and the raw logs into the output directory.
"""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path


def run(cmd, log_path, timeout=900):
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    elapsed = time.time() - started
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(map(str, cmd)) + "\n")
        log.write(f"# exit {proc.returncode}, {elapsed:.1f} s\n--- stdout\n")
        log.write(proc.stdout)
        log.write("\n--- stderr\n")
        log.write(proc.stderr)
    return proc


EVAL_RE = re.compile(r"eval time =\s*([\d.]+) ms /\s*(\d+) (?:runs|tokens)")
DECODED_RE = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
ACCEPT_RE = re.compile(r"n_accept\s*=\s*(\d+)")
DRAFTED_RE = re.compile(r"n_drafted\s*=\s*(\d+)")


def plain_eval(stderr):
    """(tokens, seconds) of llama-completion's decode ("eval time", prompt eval excluded)."""
    for line in stderr.splitlines():
        match = EVAL_RE.search(line)
        if match and "prompt eval" not in line:
            return int(match.group(2)), float(match.group(1)) / 1e3
    raise RuntimeError("no 'eval time' line in llama-completion's output")


def generated_text(stdout, prompt):
    """The generated text of a llama.cpp example's stdout (the prompt is echoed first)."""
    at = stdout.find(prompt)
    if at >= 0:
        return stdout[at + len(prompt) :]
    marker = "<|im_start|>assistant\n"
    at = stdout.rfind(marker)
    return stdout[at + len(marker) :] if at >= 0 else stdout


def same_prefix(a, b):
    """Outputs agree up to the shorter one (tools may stop a few tokens apart, and print
    trailing newlines of their own)."""
    a, b = a.rstrip(), b.rstrip()
    n = min(len(a), len(b))
    return n > 0 and a[:n] == b[:n]


def llama_runs(args, prompts, out):
    common = ["-t", str(args.threads), "--temp", "0", "-c", "4096", "--seed", "1"]
    n = ["-n", str(args.max_tokens)]
    results = {"plain": [], "spec": {k: [] for k in args.ks}}
    for i, prompt in enumerate(prompts):
        text = prompt["text"]
        proc = run(
            [f"{args.llama_bin}/llama-completion", "-m", args.target, "-p", text, "-no-cnv",
             "--no-display-prompt", "--ignore-eos"] + n + common,
            out / f"llama-plain-{i}.log",
        )
        if proc.returncode != 0:
            raise RuntimeError(f"llama-completion failed, see llama-plain-{i}.log")
        tokens, secs = plain_eval(proc.stderr)
        plain_text = proc.stdout
        results["plain"].append({"prompt": i, "tokens": tokens, "seconds": secs,
                                 "text": plain_text})
        for k in args.ks:
            proc = run(
                [f"{args.llama_bin}/llama-speculative-simple", "-m", args.target, "-md",
                 args.drafter, "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
                 "-p", text] + n + common,
                out / f"llama-spec-k{k}-{i}.log",
            )
            if proc.returncode != 0:
                raise RuntimeError(f"llama-speculative-simple failed, see llama-spec-k{k}-{i}.log")
            decoded = DECODED_RE.search(proc.stderr + proc.stdout)
            if not decoded:
                raise RuntimeError(f"no 'decoded' line, see llama-spec-k{k}-{i}.log")
            accepted = ACCEPT_RE.search(proc.stderr)
            drafted = DRAFTED_RE.search(proc.stderr)
            gen = generated_text(proc.stdout, text)
            results["spec"][k].append({
                "prompt": i,
                "tokens": int(decoded.group(1)),
                "seconds": float(decoded.group(2)),
                "accepted": int(accepted.group(1)) if accepted else None,
                "drafted": int(drafted.group(1)) if drafted else None,
                "identical": same_prefix(plain_text, gen),
                "text": gen,
            })
    return results


def llama_bench(args, out):
    """llama.cpp's own decode step and small-batch (verify-like) costs on the target."""
    widths = ",".join(str(k + 1) for k in [0] + list(args.ks))
    proc = run(
        [f"{args.llama_bin}/llama-bench", "-m", args.target, "-t", str(args.threads), "-r", "3",
         "-p", widths, "-n", "16", "-o", "json"],
        out / "llama-bench.log",
    )
    if proc.returncode != 0:
        return None
    try:
        rows = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return None
    costs = {}
    for row in rows:
        n_prompt, n_gen = row.get("n_prompt", 0), row.get("n_gen", 0)
        ms = row.get("avg_ns", 0) / 1e6
        if n_gen:
            costs["decode_ms"] = ms / n_gen
        elif n_prompt:
            costs[f"batch_{n_prompt}_ms"] = ms
    return costs


def rate(samples):
    tokens = sum(s["tokens"] for s in samples)
    secs = sum(s["seconds"] for s in samples)
    return tokens / secs if secs > 0 else 0.0


def report(args, specd, llama, lbench):
    lines = []
    out = lines.append
    plain_llama = rate(llama["plain"])
    plain_specd = specd["plain_decode_tokens_per_second"]
    costs = specd["costs"]
    out(f"max tokens {args.max_tokens}, {len(specd['prompts'])} prompts, greedy, "
        f"{args.threads} threads; tok/s over decode only")
    out("")
    out("| tool | drafter | K | tok/s | × own plain | × llama.cpp plain | × llama.cpp spec (same K) "
        "| α | tokens/round | theory (pos) | meas ÷ theory | spec == plain |")
    out("|---|---|---|---|---|---|---|---|---|---|---|---|")
    out(f"| llama.cpp | – | 0 | {plain_llama:.2f} | 1.00 | 1.00 | – | – | 1.00 | – | – | – |")
    spec_llama = {}
    for k in args.ks:
        samples = llama["spec"][k]
        tps = rate(samples)
        spec_llama[k] = tps
        acc = [s["accepted"] for s in samples if s["accepted"] is not None]
        dr = [s["drafted"] for s in samples if s["drafted"] is not None]
        alpha = sum(acc) / sum(dr) if dr and sum(dr) else float("nan")
        same = sum(1 for s in samples if s["identical"])
        out(f"| llama.cpp | draft-model | {k} | {tps:.2f} | {tps / plain_llama:.2f} | "
            f"{tps / plain_llama:.2f} | 1.00 | {alpha:.2f} | – | – | – | {same}/{len(samples)} |")
    n_prompts = len(specd["prompts"])
    out(f"| specd | – | 0 | {plain_specd:.2f} | 1.00 | {plain_specd / plain_llama:.2f} | – | – | "
        f"1.00 | – | – | {n_prompts}/{n_prompts} |")
    for row in specd["rows"]:
        k = row["k"] if row["k"] is not None else "auto"
        tps = row["decode_tokens_per_second"]
        vs_spec = f"{tps / spec_llama[k]:.2f}" if row["drafter"] == "draft-model" and k in spec_llama else "–"
        out(f"| specd | {row['drafter']} | {k} | {tps:.2f} | {row['ratio_to_plain']:.2f} | "
            f"{tps / plain_llama:.2f} | {vs_spec} | {row['alpha']:.2f} | "
            f"{row['tokens_per_round']:.2f} | {row['theory_positional']:.2f} | "
            f"{row['measured_over_theory']:.2f} | {row['identical']}/{row['generations']} |")
    out("")
    out("specd acceptance per draft position (accepted ÷ drafted at that position):")
    out("")
    for row in specd["rows"]:
        pos = " ".join(f"{p:.2f}" for p in row["acceptance_per_position"])
        out(f"- {row['drafter']} K={row['k'] if row['k'] is not None else 'auto'}: {pos}")
    out("")
    out("Step costs (median ms; cost = ÷ one target decode step):")
    out("")
    out(f"- specd decode step {costs['decode_step_ms']:.1f} ms; draft-model step "
        f"{(costs['draft_step_ms'] or 0):.1f} ms = {costs['draft_step_cost']:.2f}")
    verify = ", ".join(
        f"n={i + 1}: {ms:.1f} ms ({c:.2f})"
        for i, (ms, c) in enumerate(zip(costs["verify_ms"], costs["verify_cost"]))
    )
    out(f"- specd verify of n tokens: {verify}")
    if lbench:
        step = lbench.get("decode_ms")
        parts = []
        for n in [k + 1 for k in [0] + list(args.ks)]:
            ms = lbench.get(f"batch_{n}_ms")
            if ms is not None and step:
                parts.append(f"n={n}: {ms:.1f} ms ({ms / step:.2f})")
        out(f"- llama.cpp (llama-bench) decode step {step or 0:.1f} ms; batch of n tokens "
            f"(last-row logits only): " + ", ".join(parts))
    if specd["mismatches"]:
        out("")
        out("**specd speculative output differed from plain:**")
        for m in specd["mismatches"]:
            out(f"- {m}")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specd", required=True)
    parser.add_argument("--llama-bin", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--ks", default="1,2,3,4,5,6")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", help="prompt file, one per line (default: specd's built-in set)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    args.ks = [int(k) for k in args.ks.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    print("specd bench --sweep ...", file=sys.stderr)
    proc = run(
        [args.specd, "bench", "--target", args.target, "--drafter", args.drafter,
         "--sweep", ",".join(map(str, args.ks)), "--sweep-drafts", "draft-model,ngram",
         "--max-tokens", str(args.max_tokens), "--json"]
        + (["--prompts", args.prompts] if args.prompts else []),
        out / "specd-bench.log",
        timeout=5400,
    )
    if not proc.stdout.strip():
        sys.exit(f"specd bench failed (exit {proc.returncode}), see {out / 'specd-bench.log'}")
    specd = json.loads(proc.stdout.strip().splitlines()[-1])
    (out / "specd.json").write_text(json.dumps(specd, indent=1))
    specd_failed = proc.returncode != 0

    print("llama.cpp plain and speculative ...", file=sys.stderr)
    llama = llama_runs(args, specd["prompts"], out)
    print("llama-bench ...", file=sys.stderr)
    lbench = llama_bench(args, out)
    (out / "llama.json").write_text(json.dumps({"runs": llama, "bench": lbench}, indent=1,
                                               default=str))
    for i, (p, l) in enumerate(zip(specd["prompts"], llama["plain"])):
        agree = same_prefix(p["plain_text"], l["text"])
        print(f"prompt {i}: specd plain text {'==' if agree else '!='} llama.cpp plain text",
              file=sys.stderr)
    text = report(args, specd, llama, lbench)
    (out / "report.md").write_text(text)
    print(text)
    if specd_failed:
        sys.exit("MISMATCH: specd's speculative output differed from plain (see report.md)")


if __name__ == "__main__":
    main()
