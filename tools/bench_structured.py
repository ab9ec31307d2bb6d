#!/usr/bin/env python3
"""Structured output (JSON schema) on the Qwen2.5-Coder pair: plain, speculative, and
speculative with fast-forward (tokens the schema forces verified as free drafts), beside
free-text plain decoding and llama-server with the same schemas.

Driven by tools/bench_structured.sh. Every server starts here on 127.0.0.1 and is asked over
its OpenAI-compatible HTTP API (non-streaming, greedy). One specd one-process server
(`specd serve --target T --drafter D`) serves every specd mode, chosen per request:

- free plain: no response_format, `specd.speculative: false`;
- plain: response_format json_schema, `specd.speculative: false`;
- spec: json_schema, speculation on, `specd.fast_forward: false`;
- spec+ff: json_schema, speculation on (the default, fast-forward on).

Decode speed is (completion tokens - 1) / (total time - time to first token), from the
response's `specd` object (specd) or `timings` (llama-server: predicted_per_second). The
specd modes run every prompt REPS times, interleaved, on one server; llama-server runs after,
alone (each server is up only during its own phase). Medians per prompt; ratios are taken
prompt by prompt, then their geometric mean. Writes results.json and report.md.
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "city": {"type": "string"},
        "skills": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "email", "city", "skills"],
    "additionalProperties": False,
}

FUNCTION = {
    "type": "object",
    "properties": {
        "function_name": {"type": "string"},
        "parameters": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "type": {"type": "string"}},
                "required": ["name", "type"],
                "additionalProperties": False,
            },
        },
        "returns": {"type": "string"},
        "time_complexity": {"type": "string"},
        "raises": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["function_name", "parameters", "returns", "time_complexity", "raises"],
    "additionalProperties": False,
}

BOOKS = {
    "type": "object",
    "properties": {
        "books": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "title": {"type": "string"},
                    "author": {"type": "string"},
                    "year": {"type": "integer"},
                    "genre": {"type": "string", "enum": ["fiction", "science", "history", "programming"]},
                },
                "required": ["title", "author", "year", "genre"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["books"],
    "additionalProperties": False,
}

ISSUE = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "severity": {"type": "string", "enum": ["low", "medium", "high", "critical"]},
        "component": {"type": "string"},
        "steps_to_reproduce": {"type": "array", "items": {"type": "string"}},
        "expected": {"type": "string"},
        "actual": {"type": "string"},
    },
    "required": ["title", "severity", "component", "steps_to_reproduce", "expected", "actual"],
    "additionalProperties": False,
}

PROMPTS = [
    ("person", PERSON,
     "Extract the person's details as JSON: Maria Lopez, 34, lives in Seville and can be "
     "reached at maria.lopez@example.com. She writes Rust and Python, and knows SQL and Docker."),
    ("function", FUNCTION,
     "Describe this Python function as JSON:\n\ndef merge_sorted(a: list[int], b: list[int]) -> "
     "list[int]:\n    if a is None or b is None:\n        raise ValueError('inputs must be lists')\n"
     "    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
     "            out.append(a[i]); i += 1\n        else:\n            out.append(b[j]); j += 1\n"
     "    return out + a[i:] + b[j:]\n"),
    ("books", BOOKS, "List four well-known books about programming as JSON."),
    ("issue", ISSUE,
     "File a bug report as JSON: the login page of our web app shows a blank screen in Safari "
     "17 after entering a password and pressing Enter; it should open the dashboard."),
]

MODES = ["free plain", "plain", "spec", "spec+ff"]


def post(addr, path, body, timeout=600):
    conn = http.client.HTTPConnection(addr, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"{path}: {response.status} {data[:400]!r}")
    return json.loads(data)


def specd_body(prompt, schema, mode, max_tokens):
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "specd": {},
    }
    if mode != "free plain":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
    if mode in ("free plain", "plain"):
        body["specd"]["speculative"] = False
    if mode == "spec":
        body["specd"]["fast_forward"] = False
    return body


def run_specd(addr, prompt, schema, mode, max_tokens):
    answer = post(addr, "/v1/chat/completions", specd_body(prompt, schema, mode, max_tokens))
    stats = answer["specd"]
    tokens = answer["usage"]["completion_tokens"]
    decode_s = (stats["total_time_ms"] - stats["time_to_first_token_ms"]) / 1e3
    rounds = stats.get("rounds", 0)
    return {
        "text": answer["choices"][0]["message"]["content"],
        "tokens": tokens,
        "decode_tok_s": (tokens - 1) / decode_s if decode_s > 0 else 0.0,
        "tokens_per_round": (tokens - 1) / rounds if rounds else 0.0,
        "forced_drafted": stats.get("forced_drafted", 0),
        "forced_accepted": stats.get("forced_accepted", 0),
        "drafted": stats.get("drafted", 0),
        "accepted": stats.get("accepted", 0),
    }


def run_llama(addr, prompt, schema, max_tokens):
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}},
    }
    answer = post(addr, "/v1/chat/completions", body)
    timings = answer.get("timings", {})
    return {
        "text": answer["choices"][0]["message"]["content"],
        "tokens": answer["usage"]["completion_tokens"],
        "decode_tok_s": timings.get("predicted_per_second", 0.0),
    }


def read_line(proc, prefix, log):
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"process exited before printing {prefix!r}; see {log}")
        if line.startswith(prefix):
            return line[len(prefix):].strip()


def start_specd(args, out):
    env = dict(os.environ, SPECD_THREADS=str(args.threads), RUST_LOG="warn")
    log_path = out / "specd.log"
    log = open(log_path, "a")
    cmd = [args.specd, "serve", "--target", args.target, "--drafter", args.drafter,
           "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    addr = read_line(proc, "http listening on ", log_path)
    read_line(proc, "listening on ", log_path)
    return proc, addr


def start_llama(args, out):
    port = 19000 + os.getpid() % 1000
    cmd = [args.llama_server, "-m", args.target, "--host", "127.0.0.1", "--port", str(port),
           "-np", "1", "-t", str(args.threads), "-c", "4096"]
    log = open(out / "llama-server.log", "a")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    addr = f"127.0.0.1:{port}"
    for _ in range(600):
        try:
            conn = http.client.HTTPConnection(addr, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, addr
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("llama-server did not become healthy")


def geomean(xs):
    xs = [x for x in xs if x > 0]
    if not xs:
        return 0.0
    product = 1.0
    for x in xs:
        product *= x
    return product ** (1 / len(xs))


def report(results, out):
    lines = ["# Structured output (JSON schema), greedy", ""]
    lines.append("| prompt | tokens | " + " | ".join(f"{m} tok/s" for m in results["modes"]) +
                 " | spec tok/round | spec+ff tok/round | forced drafts (accepted) |")
    lines.append("|---|---|" + "---|" * len(results["modes"]) + "---|---|---|")
    for name, per in results["prompts"].items():
        cells = [f"{per[m]['decode_tok_s']:.2f}" for m in results["modes"]]
        ff = per["spec+ff"]
        lines.append(
            f"| {name} | {per['plain']['tokens']} | " + " | ".join(cells) +
            f" | {per['spec']['tokens_per_round']:.2f} | {ff['tokens_per_round']:.2f} | "
            f"{ff['forced_drafted']} ({ff['forced_accepted']}) |")
    lines.append("")
    for label, value in results["ratios"].items():
        lines.append(f"- {label}: {value:.3f}")
    lines.append("")
    lines.append(f"- outputs identical across plain, spec and spec+ff: {results['identical']}")
    lines.append(f"- every constrained output parses as JSON: {results['valid_json']}")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--specd", required=True)
    parser.add_argument("--llama-server")
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    modes = list(MODES) + (["llama-server"] if args.llama_server else [])
    samples = {name: {m: [] for m in modes} for name, _, _ in PROMPTS}

    def phase(start, ask, phase_modes):
        """One server on its own: a warm-up of each mode, then REPS interleaved passes."""
        proc, addr = start(args, out)
        try:
            for mode in phase_modes:
                ask(addr, PROMPTS[0], mode)
            for rep in range(args.reps):
                for name, schema, prompt in PROMPTS:
                    for mode in phase_modes:
                        sample = ask(addr, (name, schema, prompt), mode)
                        samples[name][mode].append(sample)
                        print(f"rep {rep} {name} {mode}: {sample['tokens']} tokens, "
                              f"{sample['decode_tok_s']:.2f} tok/s", file=sys.stderr)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    # Each server runs alone: an idle peer process still takes cores now and then.
    phase(start_specd,
          lambda addr, p, mode: run_specd(addr, p[2], p[1], mode, args.max_tokens), MODES)
    if args.llama_server:
        phase(start_llama,
              lambda addr, p, mode: run_llama(addr, p[2], p[1], args.max_tokens),
              ["llama-server"])

    per_prompt = {}
    identical = True
    valid = True
    for name, _, _ in PROMPTS:
        per_prompt[name] = {}
        for mode in modes:
            runs = samples[name][mode]
            median = statistics.median(r["decode_tok_s"] for r in runs)
            row = dict(runs[0])
            row["decode_tok_s"] = median
            per_prompt[name][mode] = row
        texts = {per_prompt[name][m]["text"] for m in ("plain", "spec", "spec+ff")}
        identical &= len(texts) == 1
        try:
            json.loads(per_prompt[name]["plain"]["text"])
        except ValueError:
            valid = False

    def ratio(a, b):
        return geomean([per_prompt[n][a]["decode_tok_s"] / per_prompt[n][b]["decode_tok_s"]
                        for n in per_prompt if per_prompt[n][b]["decode_tok_s"] > 0])

    ratios = {
        "constrained plain / free plain (per-token speed, >= 0.95 wanted)": ratio("plain", "free plain"),
        "spec / constrained plain": ratio("spec", "plain"),
        "spec+ff / constrained plain (>= 1.3 wanted)": ratio("spec+ff", "plain"),
        "spec+ff / spec": ratio("spec+ff", "spec"),
    }
    if "llama-server" in modes:
        ratios["spec+ff / llama-server constrained"] = ratio("spec+ff", "llama-server")
        ratios["constrained plain / llama-server constrained"] = ratio("plain", "llama-server")
    results = {"modes": modes, "prompts": per_prompt, "ratios": ratios,
               "identical": identical, "valid_json": valid, "reps": args.reps,
               "threads": args.threads}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    report(results, out)


if __name__ == "__main__":
    main()
