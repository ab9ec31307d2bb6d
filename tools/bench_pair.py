#!/usr/bin/env python3
"""specd and llama.cpp side by side on the Qwen2.5-Coder 1.5B target / 0.5B drafter pair.

Driven by tools/bench_pair.sh, which builds both tools first. In one run, with the same
prompts (the chat-templated texts `specd-bench` renders), the same number of new tokens and
greedy decoding:

- specd: `specd-bench --sweep` (plain, then fixed K drafts per round for the draft-model and
  n-gram drafters), which also measures the step costs and checks every speculative output
  against plain;
- llama.cpp: `llama-completion` (plain) and `llama-speculative-simple` (draft model, K drafts)
  on each prompt, `llama-lookup` (prompt-lookup decoding: n-gram drafts of up to K tokens from
  the prompt and the text so far, no draft model) on the prompts of the lookup kinds (default:
  the edit prompts, whose answers copy the prompt), plus `llama-bench` for its decode,
  small-batch (n = 1..8) and 1,500-token prompt costs on the target and its decode and prompt
  costs on the drafter;
- both: cold start to the first token (a fresh process generating one token from the first
  prompt, timed from spawn to exit, with its peak resident memory), 3 runs each.

Every prompt has a kind (`code`, `prose`, `edit` for specd's built-in set; see `specd-bench
--kinds`), and the report gives every row's tokens/s and ratio to its own tool's plain decoding
per kind as well as over all prompts. The "Engine" section sets specd's CPU engine (the `engine` object of `specd-bench`) beside
llama.cpp, each figure next to the target it should meet. Tokens per second count decode only
(prompt processing excluded) on both sides. Every specd process runs with SPECD_THREADS set to
the thread count llama.cpp gets. Writes specd.json, llama.json, cold_start.json, report.md and
the raw logs into the output directory; `--report-only` writes report.md again from those JSON
files without running anything.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path


def run(cmd, log_path, timeout=900, env=None):
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    elapsed = time.time() - started
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(map(str, cmd)) + "\n")
        log.write(f"# exit {proc.returncode}, {elapsed:.1f} s\n--- stdout\n")
        log.write(proc.stdout)
        log.write("\n--- stderr\n")
        log.write(proc.stderr)
    return proc


def run_measured(cmd, log_path, env=None):
    """(exit status, seconds from spawn to exit, peak resident memory in KiB) of one fresh
    process; its output goes to the log."""
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(map(str, cmd)) + "\n")
    with open(log_path, "a") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        # wait4 rather than Popen.wait: it also returns the child's resource usage.
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.write(f"\n# exit {proc.returncode}, {elapsed:.3f} s, "
                  f"peak RSS {usage.ru_maxrss} KiB\n")
    return proc.returncode, elapsed, usage.ru_maxrss


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


def spec_sample(proc, i, plain_text, text, log_name):
    """One speculative run of llama-speculative-simple or llama-lookup: both print the
    prompt, then the generated text on stdout, and on stderr "decoded N tokens in T seconds"
    (decode only, prompt processing excluded) and the n_drafted / n_accept counts."""
    decoded = DECODED_RE.search(proc.stderr + proc.stdout)
    if not decoded:
        raise RuntimeError(f"no 'decoded' line, see {log_name}")
    accepted = ACCEPT_RE.search(proc.stderr)
    drafted = DRAFTED_RE.search(proc.stderr)
    gen = generated_text(proc.stdout, text)
    return {
        "prompt": i,
        "tokens": int(decoded.group(1)),
        "seconds": float(decoded.group(2)),
        "accepted": int(accepted.group(1)) if accepted else None,
        "drafted": int(drafted.group(1)) if drafted else None,
        "identical": same_prefix(plain_text, gen),
        "text": gen,
    }


def prompt_kind(prompt):
    return prompt.get("kind", "file")


def lookup_prompts(args, prompts):
    """Indices of the prompts llama-lookup runs on: those of the lookup kinds."""
    if args.lookup_kinds == ["all"]:
        return list(range(len(prompts)))
    return [i for i, p in enumerate(prompts) if prompt_kind(p) in args.lookup_kinds]


def llama_runs(args, prompts, out):
    common = ["-t", str(args.threads), "--temp", "0", "-c", "4096", "--seed", "1"]
    n = ["-n", str(args.max_tokens)]
    results = {"plain": [], "spec": {k: [] for k in args.ks}, "lookup": {k: [] for k in args.ks}}
    lookup = set(lookup_prompts(args, prompts))
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
            results["spec"][k].append(
                spec_sample(proc, i, plain_text, text, f"llama-spec-k{k}-{i}.log"))
        if i not in lookup:
            continue
        for k in args.ks:
            # The n-gram sizes (1 to 4 tokens) are fixed in llama.cpp's common/ngram-cache.h;
            # no static or dynamic lookup cache is given, so each run drafts only from its
            # own prompt and output, as specd's n-gram drafter does. --ignore-eos as in the
            # plain run: both then emit the same number of tokens.
            log_name = f"llama-lookup-k{k}-{i}.log"
            proc = run(
                [f"{args.llama_bin}/llama-lookup", "-m", args.target, "--spec-draft-n-max",
                 str(k), "-p", text, "--ignore-eos"] + n + common,
                out / log_name,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"llama-lookup failed, see {log_name}")
            results["lookup"][k].append(spec_sample(proc, i, plain_text, text, log_name))
    return results


# The long prompt of the prefill comparison (specd-bench's engine section uses as many).
PREFILL_TOKENS = 1500
# Tokens of llama-bench's decode (tg) test.
TG_TOKENS = 32
# Fresh processes per tool for the cold start.
COLD_RUNS = 3


def verify_widths(args):
    """Batch widths of the verify comparison: n = 1..8 and every swept K + 1."""
    return sorted(set(range(1, 9)) | {k + 1 for k in args.ks})


def llama_bench_rows(args, extra, log_path):
    """llama-bench's JSON rows for `extra` arguments, or None where it failed."""
    proc = run(
        [f"{args.llama_bin}/llama-bench", "-t", str(args.threads), "-r", "3", "-o", "json",
         *extra],
        log_path,
        timeout=3600,
    )
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        return None


def llama_bench(args, model, prompts, log_path):
    """llama.cpp's own costs of `model`: the decode step (tg) from an empty context and
    after a PREFILL_TOKENS-token one (tg at that depth), and per prompt width n the batch
    time and tokens/s (pp; last-row logits only). Each is the median of llama-bench's
    repetitions, as specd's figures are medians: its mean follows a single disturbed run."""
    rows = llama_bench_rows(
        args, ["-m", model, "-p", ",".join(map(str, prompts)), "-n", str(TG_TOKENS)], log_path)
    if rows is None:
        return None
    deep = llama_bench_rows(
        args, ["-m", model, "-p", "0", "-n", str(TG_TOKENS), "-d", str(PREFILL_TOKENS)],
        log_path.with_name(log_path.stem + "-depth.log"))
    costs = {}
    for row in rows + (deep or []):
        n_prompt, n_gen = row.get("n_prompt", 0), row.get("n_gen", 0)
        ms = statistics.median(row.get("samples_ns") or [row.get("avg_ns", 0)]) / 1e6
        costs["model_size"] = row.get("model_size")
        if n_gen and row.get("n_depth", 0):
            costs["decode_long_ms"] = ms / n_gen
        elif n_gen:
            costs["decode_ms"] = ms / n_gen
        elif n_prompt:
            costs[f"batch_{n_prompt}_ms"] = ms
            costs[f"pp_{n_prompt}_tps"] = n_prompt / ms * 1e3 if ms > 0 else None
    return costs


def cold_start(args, prompt, out):
    """Cold start to the first token, both tools alternating: a fresh process that loads the
    target and generates one token from `prompt`, timed from spawn to exit."""
    env = dict(os.environ, SPECD_THREADS=str(args.threads))
    tools = {
        "specd": ([args.specd, "generate", "--target", args.target, "--prompt-ids",
                   ",".join(map(str, prompt["ids"])), "--max-tokens", "1", "--no-draft"], env),
        "llama.cpp": ([f"{args.llama_bin}/llama-completion", "-m", args.target, "-p",
                       prompt["text"], "-n", "1", "-no-cnv", "--no-display-prompt", "-t",
                       str(args.threads), "--temp", "0", "-c", "4096", "--seed", "1"], None),
    }
    runs = {name: [] for name in tools}
    for i in range(COLD_RUNS):
        for name, (cmd, cmd_env) in tools.items():
            log = out / f"cold-{name.replace('.', '')}-{i}.log"
            status, seconds, rss_kib = run_measured(cmd, log, cmd_env)
            if status != 0:
                raise RuntimeError(f"{name} cold start failed, see {log.name}")
            runs[name].append({"seconds": seconds, "peak_rss_kib": rss_kib})
    return {
        name: {
            "runs": samples,
            "seconds_median": statistics.median(s["seconds"] for s in samples),
            "peak_rss_bytes": max(s["peak_rss_kib"] for s in samples) * 1024,
        }
        for name, samples in runs.items()
    }


def rate(samples):
    tokens = sum(s["tokens"] for s in samples)
    secs = sum(s["seconds"] for s in samples)
    return tokens / secs if secs > 0 else 0.0


def rate_of(samples, prompts):
    """Tokens/s of the samples of the prompts (indices) in `prompts`; None when there is none."""
    chosen = [s for s in samples if s["prompt"] in prompts]
    return rate(chosen) if chosen else None


def alpha_of(samples):
    accepted = [s["accepted"] for s in samples if s["accepted"] is not None]
    drafted = [s["drafted"] for s in samples if s["drafted"] is not None]
    return sum(accepted) / sum(drafted) if drafted and sum(drafted) else None


def kinds_of(prompts):
    """The prompt kinds in order of first appearance, each with the indices of its prompts."""
    kinds = {}
    for i, p in enumerate(prompts):
        kinds.setdefault(prompt_kind(p), []).append(i)
    return kinds


def specd_rate_of(specd, row, prompts):
    """specd's decode tokens/s over the prompts (indices) in `prompts`, from the per-prompt
    decode tokens and seconds; plain decoding when `row` is None."""
    if row is None:
        parts = [(p.get("plain_decode_tokens"), p.get("plain_decode_seconds"))
                 for i, p in enumerate(specd["prompts"]) if i in prompts]
    else:
        parts = [(p.get("decode_tokens"), p.get("decode_seconds"))
                 for p in row.get("per_prompt", []) if p["prompt"] in prompts]
    if not parts or any(t is None or sec is None for t, sec in parts):
        return None
    secs = sum(sec for _, sec in parts)
    return sum(t for t, _ in parts) / secs if secs > 0 else None


def speed_cell(tps, base):
    """tok/s and its ratio to the tool's plain decoding on the same prompts."""
    if tps is None:
        return "–"
    ratio = div(tps, base)
    return f"{tps:.2f} ({ratio:.2f}×)" if ratio is not None else f"{tps:.2f}"


def row_k(row):
    return row["k"] if row["k"] is not None else "auto"


def kinds_section(args, specd, llama):
    """Every row's tokens/s per prompt kind and over all prompts, each with its ratio to its
    own tool's plain decoding of the same prompts."""
    prompts = specd["prompts"]
    kinds = kinds_of(prompts)
    everything = set(range(len(prompts)))
    lookup = set(lookup_prompts(args, prompts))
    groups = [(kind, set(members)) for kind, members in kinds.items()] + [("all", everything)]
    lines = ["", "By prompt kind: tok/s over decode only, with × the same tool's plain decoding "
             "of the same prompts (" + ", ".join(f"{k}: {len(m)}" for k, m in kinds.items())
             + " prompts):", ""]
    out = lines.append
    out("| tool | drafter | K | " + " | ".join(kind for kind, _ in groups) + " |")
    out("|---|---|---|" + "---|" * len(groups))
    l_plain = {kind: rate_of(llama["plain"], members) for kind, members in groups}
    s_plain = {kind: specd_rate_of(specd, None, members) for kind, members in groups}

    def line(tool, drafter, k, cells):
        out(f"| {tool} | {drafter} | {k} | " + " | ".join(cells) + " |")

    line("llama.cpp", "–", 0, [speed_cell(l_plain[kind], l_plain[kind]) for kind, _ in groups])
    for k in args.ks:
        line("llama.cpp", "draft-model", k,
             [speed_cell(rate_of(llama["spec"][k], m), l_plain[kind]) for kind, m in groups])
    for k in args.ks:
        samples = llama.get("lookup", {}).get(k, [])
        if samples:
            # Only groups whose every prompt ran llama-lookup get a figure.
            line("llama.cpp", "lookup", k,
                 [speed_cell(rate_of(samples, m), l_plain[kind]) if m <= lookup else "–"
                  for kind, m in groups])
    line("specd", "–", 0, [speed_cell(s_plain[kind], s_plain[kind]) for kind, _ in groups])
    for row in specd["rows"]:
        line("specd", row["drafter"], row_k(row),
             [speed_cell(specd_rate_of(specd, row, m), s_plain[kind]) for kind, m in groups])
    return lines


def lookup_section(args, specd, llama):
    """llama-lookup on its prompts beside llama.cpp plain and specd's n-gram drafter on the
    same prompts."""
    prompts = specd["prompts"]
    chosen = set(lookup_prompts(args, prompts))
    runs = llama.get("lookup", {})
    if not chosen or not any(runs.get(k) for k in args.ks):
        return ["", "llama-lookup did not run: no prompt of the lookup kinds "
                f"({', '.join(args.lookup_kinds)})."]
    kinds = sorted({prompt_kind(prompts[i]) for i in chosen})
    l_plain = rate_of(llama["plain"], chosen)
    s_plain = specd_rate_of(specd, None, chosen)
    ngram = {row["k"]: row for row in specd["rows"] if row["drafter"] == "ngram"}
    lines = ["", f"Prompt lookup on the {', '.join(kinds)} prompts ({len(chosen)}): llama.cpp's "
             "`llama-lookup` (n-gram drafts of up to K tokens from the prompt and the output so "
             "far, n-grams of 1 to 4 tokens) beside specd's n-gram drafter; × plain is over the "
             f"same tool's plain decoding of these prompts (llama.cpp {fmt(l_plain, '.2f')}, "
             f"specd {fmt(s_plain, '.2f')} tok/s):", ""]
    out = lines.append
    out("| K | llama-lookup tok/s | × llama.cpp plain | α | spec == plain | specd ngram tok/s "
        "| × specd plain | α | spec == plain |")
    out("|---|---|---|---|---|---|---|---|---|")
    for k in args.ks:
        samples = [s for s in runs.get(k, []) if s["prompt"] in chosen]
        tps = rate(samples) if samples else None
        same = sum(1 for s in samples if s["identical"])
        row = ngram.get(k)
        s_cells = ["–", "–", "–", "–"]
        if row is not None:
            s_tps = specd_rate_of(specd, row, chosen)
            parts = [p for p in row.get("per_prompt", []) if p["prompt"] in chosen]
            drafted = sum(p.get("drafted", 0) for p in parts)
            accepted = sum(p.get("accepted", 0) for p in parts)
            per_kind = [p for p in row.get("per_kind", []) if p["kind"] in kinds]
            s_same = sum(p["identical"] for p in per_kind)
            s_gen = sum(p["generations"] for p in per_kind)
            s_cells = [fmt(s_tps, ".2f"), fmt(div(s_tps, s_plain), ".2f"),
                       fmt(div(accepted, drafted), ".2f"), f"{s_same}/{s_gen}"]
        out(f"| {k} | {fmt(tps, '.2f')} | {fmt(div(tps, l_plain), '.2f')} | "
            f"{fmt(alpha_of(samples), '.2f')} | {same}/{len(samples)} | " + " | ".join(s_cells)
            + " |")
    return lines


def fmt(value, spec, suffix=""):
    return "–" if value is None else f"{value:{spec}}{suffix}"


def div(a, b):
    return a / b if a is not None and b else None


def engine_section(args, specd, lbench, lbench_drafter, cold):
    """The "Engine" section: specd's CPU engine beside llama.cpp, each figure next to the
    target it should meet."""
    engine = specd.get("engine")
    lines = ["", "## Engine", ""]
    out = lines.append
    if not engine:
        out("specd reported no engine section (the target does not run on the CPU engine).")
        return lines
    lb, ld = lbench or {}, lbench_drafter or {}
    target, drafter = engine["target"], engine.get("drafter") or {}
    bandwidth = engine["read_bandwidth_gbs"] * 1e9
    out(f"specd engine: {engine['kernels']} kernels, prefetch hint "
        f"{engine.get('prefetch') or 'undecided'} (measured at run time), "
        f"{engine['threads']} threads; measured "
        f"read bandwidth {engine['read_bandwidth_gbs']:.1f} GB/s (median over repetitions of the "
        f"faster of two passes over 1 GiB, one with plain loads and one asking for the lines "
        f"ahead as the kernels do). specd steps: median of {engine['step_reps']} at a "
        f"{engine['context_tokens']}-token context, each repetition measuring every quantity "
        f"once, back to back; specd's ratios (verify and draft costs, bandwidth use, drafter "
        f"prefill) are medians of the ratios within a repetition; llama.cpp: llama-bench, median of 3 repetitions, tg{TG_TOKENS} and pp<n> (last-row "
        f"logits only) from an empty context. Prefill: {engine['prefill_tokens']} tokens, specd "
        f"in chunks of {engine['prefill_chunk']} into a fresh cache (median of "
        f"{engine['prefill_reps']}), llama.cpp pp{PREFILL_TOKENS}; the decode step after it: "
        f"specd's median of {engine['step_reps']} on the last prefill's cache, llama.cpp "
        f"tg{TG_TOKENS} at depth {PREFILL_TOKENS}. Cold start: median of "
        f"{COLD_RUNS} fresh processes generating 1 token from the first prompt; peak RSS is the "
        f"largest of them.")
    out("")
    out("| measure | specd | llama.cpp | specd ÷ llama.cpp | target | met |")
    out("|---|---|---|---|---|---|")

    def row(name, ours, theirs, spec, ratio=None, goal=None, ok=None, suffix=""):
        met = "–" if ok is None else ("yes" if ok else "no")
        out(f"| {name} | {fmt(ours, spec, suffix)} | {fmt(theirs, spec, suffix)} | "
            f"{fmt(ratio, '.2f')} | {goal or '–'} | {met} |")

    def check(value, test):
        return None if value is None else test(value)

    step, l_step = target["decode_step_ms"], lb.get("decode_ms")
    step_ratio = div(step, l_step)
    row("decode step, target (ms)", step, l_step, ".1f", step_ratio, "≤ 1.00× llama.cpp",
        check(step_ratio, lambda r: r <= 1.00))
    for n, cost in enumerate(target["verify_cost"], start=1):
        l_cost = div(lb.get(f"batch_{n}_ms"), l_step)
        goal, ok = ("≤ 1.35× own decode step", cost <= 1.35) if n == 5 else (None, None)
        row(f"verify of {n} token{'s' if n > 1 else ''} (× own decode step)", cost, l_cost,
            ".2f", None, goal, ok)
    d_cost, l_d_cost = drafter.get("step_cost"), div(ld.get("decode_ms"), l_step)
    row("draft step 0.5B ÷ target step 1.5B", d_cost, l_d_cost, ".2f", None, "≤ 0.40",
        check(d_cost, lambda c: c <= 0.40))
    row("decode step, drafter (ms)", drafter.get("decode_step_ms"), ld.get("decode_ms"), ".1f",
        div(drafter.get("decode_step_ms"), ld.get("decode_ms")))
    row("weight bytes streamed per target step (MB)", target["streamed_bytes"] / 1e6,
        div(lb.get("model_size"), 1e6), ".0f")
    use = target["bandwidth_use"] * 100
    l_use = div(target["streamed_bytes"] / bandwidth * 1e5, l_step)
    row("bandwidth use, target (bytes/step/time ÷ read bandwidth)", use, l_use, ".0f",
        None, "≥ 90%", use >= 90, suffix="%")
    if drafter:
        row("bandwidth use, drafter", drafter["bandwidth_use"] * 100,
            div(drafter["streamed_bytes"] / bandwidth * 1e5, ld.get("decode_ms")), ".0f",
            suffix="%")
    pp = f"pp_{PREFILL_TOKENS}_tps"
    sides = [("target", target, lb), ("drafter", drafter, ld)]
    for name, ours, theirs in sides:
        tps = ours.get("prefill_tokens_per_second")
        ratio = div(tps, theirs.get(pp))
        row(f"prefill tok/s, {name} ({engine['prefill_tokens']} tokens)", tps, theirs.get(pp),
            ".0f", ratio, f"≥ 1.00× llama.cpp pp{PREFILL_TOKENS}",
            check(ratio, lambda r: r >= 1.00))
    for name, ours, theirs in sides:
        mine, their = ours.get("decode_step_long_ms"), theirs.get("decode_long_ms")
        row(f"decode step after {engine['prefill_tokens']} tokens, {name} (ms)", mine, their,
            ".1f", div(mine, their))
    d_prefill = drafter.get("prefill_over_target")
    row("drafter prefill ÷ target prefill (time)", d_prefill, div(lb.get(pp), ld.get(pp)),
        ".2f", None, "≤ 0.40", check(d_prefill, lambda r: r <= 0.40))
    gguf = os.path.getsize(args.target)
    cold = cold or {}
    rss = {name: div(cold.get(name, {}).get("peak_rss_bytes"), gguf)
           for name in ("specd", "llama.cpp")}
    row(f"peak RSS ÷ GGUF file ({gguf / 1e6:.0f} MB), cold start", rss["specd"],
        rss["llama.cpp"], ".2f", div(rss["specd"], rss["llama.cpp"]), "≤ 1.30× the file",
        check(rss["specd"], lambda r: r <= 1.30))
    secs = {name: cold.get(name, {}).get("seconds_median") for name in ("specd", "llama.cpp")}
    ratio = div(secs["specd"], secs["llama.cpp"])
    row("cold start to first token (s)", secs["specd"], secs["llama.cpp"], ".2f", ratio,
        "≤ 1.50× llama.cpp", check(ratio, lambda r: r <= 1.50))
    out("")
    out("llama.cpp's bandwidth use counts the weight bytes specd streams per step over "
        "llama.cpp's step time; its bytes row is llama-bench's model size.")
    return lines


def report(args, specd, llama, lbench, lbench_drafter, cold):
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
    if "kinds" in specd:
        lines.extend(kinds_section(args, specd, llama))
        lines.extend(lookup_section(args, specd, llama))
    ttft = specd.get("ttft")
    if ttft:
        out("")
        line = (f"Time to first token, {ttft['prompt_tokens']}-token prompt (specd, median of "
                f"2; target ≤ 1.05x): in one process, plain {ttft['plain_s']:.2f} s, "
                f"speculative with the draft model {ttft['speculative_s']:.2f} s = "
                f"{ttft['speculative_over_plain']:.2f}x plain")
        split = ttft.get("split")
        if split:
            line += (f"; split over loopback gRPC, plain {split['plain_s']:.2f} s, speculative "
                     f"{split['speculative_s']:.2f} s = {split['speculative_over_plain']:.2f}x "
                     f"plain")
        out(line + ".")
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
        for n in verify_widths(args):
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
    lines.extend(engine_section(args, specd, lbench, lbench_drafter, cold))
    return "\n".join(lines) + "\n"


def int_keys(runs):
    """llama.json's runs with the K keys back as integers (JSON made them strings)."""
    return {name: ({int(k): v for k, v in value.items()} if isinstance(value, dict) else value)
            for name, value in runs.items()}


def report_only(args, out):
    specd = json.loads((out / "specd.json").read_text())
    llama_file = json.loads((out / "llama.json").read_text())
    cold_path = out / "cold_start.json"
    cold = json.loads(cold_path.read_text()) if cold_path.exists() else None
    llama = int_keys(llama_file["runs"])
    args.max_tokens = specd.get("max_tokens", args.max_tokens)
    # The settings of the run that wrote the files, whatever the command line says now.
    for name, value in llama_file.get("settings", {}).items():
        setattr(args, name, value)
    args.ks = sorted(llama["spec"]) or args.ks
    text = report(args, specd, llama, llama_file.get("bench"),
                  llama_file.get("bench_drafter"), cold)
    (out / "report.md").write_text(text)
    print(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specd")
    parser.add_argument("--specd-bench")
    parser.add_argument("--llama-bin")
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--ks", default="1,2,3,4,5,6")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", help="prompt file, one per line (default: specd's built-in set)")
    parser.add_argument("--kinds", help="prompt kinds to run, e.g. code,prose,edit (default: all)")
    parser.add_argument("--lookup-kinds", default="edit",
                        help="prompt kinds llama-lookup runs on, or 'all' (default: edit)")
    parser.add_argument("--report-only", action="store_true",
                        help="write report.md again from the JSON files in --out, running nothing")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    args.ks = [int(k) for k in args.ks.split(",")]
    args.lookup_kinds = [k.strip() for k in args.lookup_kinds.split(",") if k.strip()]
    out = Path(args.out)
    if args.report_only:
        report_only(args, out)
        return
    for name in ("specd", "specd_bench", "llama_bin", "drafter"):
        if getattr(args, name) is None:
            parser.error(f"--{name.replace('_', '-')} is required unless --report-only")
    out.mkdir(parents=True, exist_ok=True)

    print("specd-bench --sweep ...", file=sys.stderr)
    env = dict(os.environ, SPECD_THREADS=str(args.threads))
    proc = run(
        [args.specd_bench, "--target", args.target, "--drafter", args.drafter,
         "--sweep", ",".join(map(str, args.ks)), "--sweep-drafts", "draft-model,ngram,hybrid",
         "--max-tokens", str(args.max_tokens), "--ttft-tokens", str(PREFILL_TOKENS), "--json"]
        + (["--prompts", args.prompts] if args.prompts else [])
        + (["--kinds", args.kinds] if args.kinds else []),
        out / "specd-bench.log",
        timeout=5400,
        env=env,
    )
    if not proc.stdout.strip():
        sys.exit(f"specd-bench failed (exit {proc.returncode}), see {out / 'specd-bench.log'}")
    specd = json.loads(proc.stdout.strip().splitlines()[-1])
    (out / "specd.json").write_text(json.dumps(specd, indent=1))
    specd_failed = proc.returncode != 0

    print("llama.cpp plain and speculative ...", file=sys.stderr)
    llama = llama_runs(args, specd["prompts"], out)
    print("llama-bench ...", file=sys.stderr)
    lbench = llama_bench(args, args.target, verify_widths(args) + [PREFILL_TOKENS],
                         out / "llama-bench.log")
    lbench_drafter = llama_bench(args, args.drafter, [PREFILL_TOKENS],
                                 out / "llama-bench-drafter.log")
    settings = {"max_tokens": args.max_tokens, "threads": args.threads, "ks": args.ks,
                "lookup_kinds": args.lookup_kinds}
    (out / "llama.json").write_text(json.dumps(
        {"runs": llama, "bench": lbench, "bench_drafter": lbench_drafter,
         "settings": settings}, indent=1, default=str))
    print("cold start ...", file=sys.stderr)
    try:
        cold = cold_start(args, specd["prompts"][0], out)
    except (RuntimeError, subprocess.SubprocessError, OSError) as error:
        print(f"cold start: {error}", file=sys.stderr)
        cold = None
    (out / "cold_start.json").write_text(json.dumps(cold, indent=1))
    for i, (p, l) in enumerate(zip(specd["prompts"], llama["plain"])):
        agree = same_prefix(p["plain_text"], l["text"])
        print(f"prompt {i}: specd plain text {'==' if agree else '!='} llama.cpp plain text",
              file=sys.stderr)
    text = report(args, specd, llama, lbench, lbench_drafter, cold)
    (out / "report.md").write_text(text)
    print(text)
    if specd_failed:
        sys.exit("MISMATCH: specd's speculative output differed from plain (see report.md)")


if __name__ == "__main__":
    main()
