#!/usr/bin/env python3
"""Speculation under load: aggregate throughput at 1, 4, 8 and 16 concurrent clients, specd
beside llama-server with as many parallel slots, on the Qwen2.5-Coder pair.

Driven by tools/bench_load.sh, which builds and fetches what it needs. Servers, all on
127.0.0.1 and on every core with their defaults:

- llama-server `-np N` for N clients (started again for each level), plain decoding;
- specd split into three processes (verifier, drafter, router) with their defaults;
- specd's one-process server (`specd serve --target T --drafter D`) with its defaults.

Each of the N clients sends `--requests` requests one after the other over the OpenAI chat
API (greedy, `max_tokens`, end of sequence ignored), prompts taken in turn from the built-in
set (code, prose and edits); throughput is every completion token over the wall time from the
first request's start to the last one's end. Each specd server runs every level twice, plain
(`specd.speculative: false` per request) and with its defaults (speculation as the router
decides), and every speculative text must equal the plain text of the same prompt. Prompt
caches are off on every server (the same prompts come back at every level), so the figures
are decoding and prefill under load. The
router's decisions are reported from the requests' stats: the share of rounds that drafted
and of rounds that asked for a pre-draft. Standard library only.
"""

import argparse
import http.client
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_multiturn import (  # noqa: E402
    Server,
    read_line,
    run_at_once,
    spawn,
    start_llama_server,
)
from bench_overlap import unescape  # noqa: E402


def specd_env(args):
    env = dict(os.environ, RUST_LOG="warn")
    if args.threads_given:
        env["SPECD_THREADS"] = str(args.threads)
    return env


def start_split(args, out):
    env = specd_env(args)
    log = out / "specd-split.log"
    # Pinned: the verifier on the first core, the drafter on the second, one thread each.
    pin = (lambda core: ["taskset", "-c", str(core)]) if args.pin else (lambda core: [])
    one_thread = ["--threads", "1"] if args.pin else []
    verifier = spawn([*pin(0), args.specd, "serve", "verifier", "--target", args.target,
                      *one_thread, "--prefix-cache-bytes", "0", "--listen", "127.0.0.1:0",
                      *args.verifier_args], log, env)
    v_addr = read_line(verifier, "listening on ", log)
    drafter = spawn([*pin(1), args.specd, "serve", "drafter", "--drafter", args.drafter,
                     "--target", args.target, *one_thread, "--prefix-cache-bytes", "0",
                     "--listen", "127.0.0.1:0"], log, env)
    d_addr = read_line(drafter, "listening on ", log)
    router = spawn([args.specd, "serve", "router", "--verifier", f"http://{v_addr}",
                    "--drafters", f"http://{d_addr}", "--target", args.target,
                    "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
                    *args.router_args], log, env)
    http_addr = read_line(router, "http listening on ", log)
    return Server("specd split", [verifier, drafter, router], http_addr)


def start_one(args, out):
    log = out / "specd-one-process.log"
    proc = spawn([args.specd, "serve", "--target", args.target, "--drafter", args.drafter,
                  "--prefix-cache-bytes", "0", "--drafter-prefix-cache-bytes", "0",
                  "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"], log,
                 specd_env(args))
    http_addr = read_line(proc, "http listening on ", log)
    read_line(proc, "listening on ", log)
    return Server("specd one-process", [proc], http_addr)


def complete(addr, prompt, max_tokens, kind, speculate, block_size=0):
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}
    if kind == "specd":
        body["specd"] = {"ignore_eos": True, "speculative": speculate}
        if speculate and block_size:
            body["specd"]["block_size"] = block_size
    else:
        body["ignore_eos"] = True
        body["cache_prompt"] = False
    conn = http.client.HTTPConnection(addr, timeout=1200)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{addr}: HTTP {response.status}: {data[:300]!r}")
    return json.loads(data)


def run_level(server, kind, speculate, clients, prompts, args):
    """`clients` clients at once, `args.requests` requests each; aggregate tokens/s."""
    answers = [[] for _ in range(clients)]
    errors = []

    def client(i):
        try:
            for j in range(args.requests):
                k = (i * args.requests + j) % len(prompts)
                answer = complete(server.http, prompts[k][1], args.max_tokens, kind, speculate,
                                  args.block_size)
                answers[i].append((k, answer))
        except Exception as error:  # reported after the level
            errors.append(error)

    elapsed = run_at_once(clients, client)
    if errors:
        raise errors[0]
    done = [a for per_client in answers for a in per_client]
    tokens = sum(a["usage"]["completion_tokens"] for _, a in done)
    stats = [a.get("specd") or {} for _, a in done]
    rounds = sum(s.get("rounds", 0) for s in stats)
    plain_rounds = sum(s.get("plain_rounds", 0) for s in stats)
    predrafted = sum(s.get("predraft_hits", 0) + s.get("predraft_misses", 0) for s in stats)
    return {
        "clients": clients,
        "seconds": elapsed,
        "tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "texts": {k: a["choices"][0]["message"]["content"] for k, a in done},
        "rounds": rounds,
        "drafting_share": (rounds - plain_rounds) / rounds if rounds else None,
        "predrafted_share": predrafted / rounds if rounds else None,
        "accepted": sum(s.get("accepted", 0) for s in stats),
        "drafted": sum(s.get("drafted", 0) for s in stats),
    }


def fmt(x, digits=2):
    return "–" if x is None else f"{x:.{digits}f}"


def report(results, levels, out):
    block = results.get("block_size") or "specd's choice"
    lines = [f"aggregate completion tokens/s, {results['max_tokens']} tokens per request, "
             f"speculative block size {block}, "
             f"{results['requests']} requests per client, greedy; every speculative text equal "
             f"to plain: {results['identical']}", ""]
    names = [n for n in ("specd split", "specd one-process") if n in results["specd"]]
    header = ["clients", "llama-server -np N"]
    for name in names:
        header += [f"{name} plain", f"{name} spec", f"{name} spec ÷ plain",
                   f"{name} spec ÷ llama-server", f"{name} drafting share",
                   f"{name} pre-drafted share"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|---" * len(header) + "|")
    for i, clients in enumerate(levels):
        llama = results["llama"][i]["tokens_per_s"]
        row = [str(clients), fmt(llama)]
        ratio = (lambda x: x / llama) if llama else (lambda x: None)
        for name in names:
            plain = results["specd"][name]["plain"][i]
            spec = results["specd"][name]["spec"][i]
            row += [fmt(plain["tokens_per_s"]), fmt(spec["tokens_per_s"]),
                    fmt(spec["tokens_per_s"] / plain["tokens_per_s"]),
                    fmt(ratio(spec["tokens_per_s"])), fmt(spec["drafting_share"]),
                    fmt(spec["predrafted_share"])]
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    print(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specd", required=True)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--levels", default="1,4,8,16")
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=0,
                        help="a fixed block size for speculative requests (not governed); "
                             "0: specd decides")
    parser.add_argument("--pin", action="store_true",
                        help="split services pinned: verifier on core 0, drafter on core 1, "
                             "one thread each (taskset)")
    parser.add_argument("--skip", default="",
                        help="comma-separated: llama, split, one-process")
    parser.add_argument("--router-arg", action="append", default=[], dest="router_args",
                        help="an extra argument of the split router (repeat)")
    parser.add_argument("--verifier-arg", action="append", default=[], dest="verifier_args",
                        help="an extra argument of the split verifier (repeat)")
    args = parser.parse_args()
    args.threads_given = args.threads is not None
    if args.threads is None:
        args.threads = os.cpu_count()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    levels = [int(n) for n in args.levels.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    prompts = []
    for line in Path(args.prompts).read_text().splitlines():
        if line:
            kind, _, text = line.partition("\t")
            prompts.append((kind, unescape(text)))
    results = {"max_tokens": args.max_tokens, "requests": args.requests,
               "block_size": args.block_size, "llama": [],
               "specd": {}}
    for clients in levels:
        if "llama" in skip:
            results["llama"].append({"tokens_per_s": None})
            continue
        server = start_llama_server(args, out, f"llama-server-np{clients}", slots=clients,
                                    context=max(4096, 1024 * clients))
        try:
            complete(server.http, "Hello", 4, "llama", False)
            results["llama"].append(run_level(server, "llama", False, clients, prompts, args))
        finally:
            server.stop()
        print(f"llama-server -np {clients}: {results['llama'][-1]['tokens_per_s']:.2f} tok/s",
              file=sys.stderr, flush=True)
    starters = [("split", start_split), ("one-process", start_one)]
    identical = True
    for key, start in starters:
        if key in skip:
            continue
        server = start(args, out)
        try:
            # One short request of each kind first, so no level pays a first use.
            complete(server.http, "Hello", 4, "specd", False)
            complete(server.http, "Hello", 4, "specd", True)
            rows = {"plain": [], "spec": []}
            for clients in levels:
                for mode in ("plain", "spec"):
                    row = run_level(server, "specd", mode == "spec", clients, prompts, args)
                    rows[mode].append(row)
                    print(f"{server.name} {mode} x{clients}: {row['tokens_per_s']:.2f} tok/s",
                          file=sys.stderr, flush=True)
                plain, spec = rows["plain"][-1]["texts"], rows["spec"][-1]["texts"]
                identical &= all(spec[k] == plain[k] for k in spec if k in plain)
            results["specd"][server.name] = rows
        finally:
            server.stop()
    results["identical"] = identical
    (out / "results.json").write_text(json.dumps(results, indent=1))
    report(results, levels, out)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
