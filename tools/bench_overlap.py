#!/usr/bin/env python3
"""Overlapped drafting across services, measured through the router's HTTP API.

Sends each prompt to each router URL given (plain decoding is the first router with
speculation switched off per request) and reports decode tokens/s from the router's own
stats: (completion tokens - 1) / (total time - time to first token), each speculative
router against the second one (sequential), and each router's pre-draft hit rate (hits
over rounds that asked for a pre-draft), branch hit rate (hits from rejection branches,
over the same) and pre-drafted share (rounds that asked for a pre-draft over all rounds:
how often overlap was on). Standard library only.

usage: bench_overlap.py --router NAME=URL [--router NAME=URL ...] --prompts FILE
       [--max-tokens N] [--block-size N] [--runs N] [--json OUT]
"""
import argparse
import json
import sys
import urllib.request


def unescape(text):
    """A prompt file line's text: \\n, \\t and \\\\ stand for newline, tab, backslash."""
    out, chars = [], iter(text)
    for c in chars:
        if c == "\\":
            nxt = next(chars, "")
            out.append({"n": "\n", "t": "\t", "\\": "\\"}.get(nxt, "\\" + nxt))
        else:
            out.append(c)
    return "".join(out)


def complete(url, prompt, max_tokens, block, speculate):
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "specd": {"ignore_eos": True, "speculative": speculate},
    }
    if speculate and block:
        body["specd"]["block_size"] = block
    request = urllib.request.Request(
        url.rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--router", action="append", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--block-size", type=int, default=3)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json")
    parser.add_argument("--llama-tps", type=float,
                        help="llama.cpp's plain decode tokens/s on the verifier's core")
    args = parser.parse_args()
    routers = [r.split("=", 1) for r in args.router]
    prompts = []
    with open(args.prompts) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            kind, _, text = line.partition("\t")
            prompts.append((kind, unescape(text)))
    modes = [("plain", routers[0][1], False)] + [(name, url, True) for name, url in routers]
    results = {}
    texts = {}
    for kind, prompt in prompts:
        for name, url, speculate in modes:
            for _ in range(args.runs):
                answer = complete(url, prompt, args.max_tokens, args.block_size, speculate)
                s = answer["specd"]
                tokens = answer["usage"]["completion_tokens"]
                seconds = (s["total_time_ms"] - s["time_to_first_token_ms"]) / 1e3
                row = results.setdefault((kind, name), {"tokens": 0, "seconds": 0.0,
                                                         "hits": 0, "misses": 0,
                                                         "branch_hits": 0,
                                                         "rounds": 0, "accepted": 0,
                                                         "drafted": 0})
                row["tokens"] += tokens - 1
                row["seconds"] += seconds
                row["hits"] += s.get("predraft_hits", 0)
                row["misses"] += s.get("predraft_misses", 0)
                row["branch_hits"] += s.get("predraft_branch_hits", 0)
                row["rounds"] += s["rounds"]
                row["accepted"] += s["accepted"]
                row["drafted"] += s["drafted"]
                text = answer["choices"][0]["message"]["content"]
                texts.setdefault((kind, prompt), set()).add(text)
    same = all(len(v) == 1 for v in texts.values())
    kinds = sorted({k for k, _ in prompts})
    names = [name for name, _, _ in modes]
    print(f"decode tok/s, {args.max_tokens} tokens, block size {args.block_size}, greedy; "
          f"outputs identical across modes: {same}")
    # Every other speculative router against the second (sequential).
    base = names[2] if len(names) >= 3 else None
    others = [n for n in names[1:] if base and n != base]
    llama = [args.llama_tps] if args.llama_tps else []
    overlapped = [n for n in names[1:] if n != base]
    header = (names + [f"{n} ÷ plain" for n in names[1:]] +
              [f"{n} ÷ {base}" for n in others] +
              [f"{n} ÷ llama.cpp plain" for _ in llama for n in names] +
              [f"{n} hit rate" for n in overlapped] +
              [f"{n} branch hit rate" for n in overlapped] +
              [f"{n} pre-drafted share" for n in overlapped])
    print("| kind | " + " | ".join(header) + " |")
    print("|---" * (len(header) + 1) + "|")
    report = []
    for kind in kinds + ["all"]:
        rows = {}
        for name in names:
            keys = [(k, name) for k in kinds] if kind == "all" else [(kind, name)]
            agg = {f: sum(results[key][f] for key in keys) for f in results[keys[0]]}
            rows[name] = agg
        tps = {n: rows[n]["tokens"] / rows[n]["seconds"] for n in names}

        def rate(n, field):
            asked = rows[n]["hits"] + rows[n]["misses"]
            return f"{rows[n][field] / asked:.2f}" if asked else "–"

        def share(n):
            asked = rows[n]["hits"] + rows[n]["misses"]
            return f"{asked / rows[n]['rounds']:.2f}" if rows[n]["rounds"] else "–"

        cells = ([f"{tps[n]:.2f}" for n in names] +
                 [f"{tps[n] / tps['plain']:.2f}" for n in names[1:]] +
                 [f"{tps[n] / tps[base]:.2f}" for n in others] +
                 [f"{tps[n] / l:.2f}" for l in llama for n in names] +
                 [rate(n, "hits") for n in overlapped] +
                 [rate(n, "branch_hits") for n in overlapped] +
                 [share(n) for n in overlapped])
        print(f"| {kind} | " + " | ".join(cells) + " |")
        report.append({"kind": kind, "tok_s": tps, "rows": rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"identical": same, "kinds": report}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
