#!/usr/bin/env python3
"""Multi-turn chats and agent loops: specd beside llama-server, on the Qwen2.5-Coder pair.

Driven by tools/bench_multiturn.sh, which builds and fetches what it needs. Every server is
started here, on 127.0.0.1, and asked over its OpenAI-compatible HTTP API with streaming, so
time to first token (TTFT) is what a client sees: from sending the request to the first
chunk that carries text.

Scenarios (greedy, the same messages to every server):

- chat: a system prompt holding a source file (about 1,500 tokens), then 5 user turns; the
  assistant turns in the history are fixed texts, so every server sees identical prompts;
  32 new tokens per turn. Turn 1 is cold, turns 2-5 warm (their history was seen before).
- agent: one long system prompt (instructions and a tool list, about 1,500 tokens) and 8
  different short requests, each a new conversation.
- load: 1, 4 and 8 chats at once (3 turns each, a shorter file), aggregate tokens/s, with
  specd's prefix cache on and off.

Servers: llama-server (`-np 1`, its defaults otherwise: it keeps its slot's K/V and evaluates
only the new tokens of a prompt that starts the same way), specd's one-process server (`specd
serve --target T --drafter D`) with its prefix cache and with `--prefix-cache-bytes 0`, and
specd split into three processes (verifier, drafter, router) with their defaults. Writes
results.json and report.md into the output directory; `--report-only` rewrites report.md from
results.json.
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

USER_TURNS = [
    "Summarize what this file does in two sentences.",
    "Which function would you change first to make it faster, and why?",
    "Write a unit test for the main entry point.",
    "Are there any error cases that are not handled?",
    "Rename the main type to something clearer and show the new declaration.",
]

ASSISTANT_TURNS = [
    "The file implements stop conditions for generated text. It checks end-of-sequence "
    "tokens, token limits and stop strings as tokens arrive.",
    "I would start with the stop-string search, since it rescans the decoded text on every "
    "token; keeping the scan position would avoid that.",
    "Here is a test that feeds a few tokens and checks that generation stops at the stop "
    "string and that the text before it is returned.",
    "Decoding errors of the detokenizer are passed through, but an empty stop string would "
    "match at once; it should be rejected when the request is checked.",
]

AGENT_REQUESTS = [
    "List the files in the src directory.",
    "Read Cargo.toml and tell me the crate's name.",
    "Search the code for TODO comments.",
    "Run the tests of the core crate.",
    "What does the function `accept_drafts` return?",
    "Create a branch named fix-stop-strings.",
    "Show the last three commits.",
    "How many lines does README.md have?",
]

TOOLS = [
    ("read_file", "Reads a file of the repository and returns its text.", ["path"]),
    ("write_file", "Writes text to a file of the repository, replacing it.", ["path", "text"]),
    ("list_dir", "Lists the entries of a directory.", ["path"]),
    ("search", "Searches the repository for a regular expression.", ["pattern", "glob"]),
    ("run_tests", "Runs the test suite of one crate and returns the summary.", ["crate"]),
    ("git", "Runs a read-only git command (log, show, diff, status, branch).", ["args"]),
    ("shell", "Runs a shell command in a sandbox and returns its output.", ["command"]),
    ("open_issue", "Opens an issue with a title and a body.", ["title", "body"]),
]


def source_text(chars):
    """The first `chars` characters of a source file of this repository (whole lines)."""
    text = (REPO / "crates/core/src/stop/checker.rs").read_text()
    cut = text[:chars]
    return cut[: cut.rfind("\n") + 1]


def chat_system(chars):
    return "You are a code assistant. The user is working on this file:\n\n```rust\n" + source_text(chars) + "```"


def agent_system():
    lines = [
        "You are an agent working in a software repository. Answer with one tool call as "
        "JSON, {\"tool\": NAME, \"arguments\": {...}}, or with a short final answer.",
        "Rules: never write outside the repository; prefer reading before writing; keep "
        "answers short; when a command fails, report its output; ask before deleting.",
        "Tools:",
    ]
    for name, doc, params in TOOLS:
        schema = {"type": "object", "properties": {p: {"type": "string"} for p in params}, "required": params}
        lines.append(f"- {name}: {doc} Parameters: {json.dumps(schema)}")
    # The tool list and rules again in more words, as agent frameworks' prompts run long.
    for name, doc, params in TOOLS:
        lines.append(
            f"When you use {name}, give every parameter ({', '.join(params)}) as a string. "
            f"{doc} It fails with an error message when an argument is invalid; report it."
        )
    lines.append("Examples of calls:")
    for name, _, params in TOOLS:
        args = {p: f"<{p}>" for p in params}
        lines.append(json.dumps({"tool": name, "arguments": args}))
    lines.append(source_text(2600))
    return "\n".join(lines)


def chat_messages(system, turn):
    messages = [{"role": "system", "content": system}]
    for i in range(turn):
        messages.append({"role": "user", "content": USER_TURNS[i]})
        messages.append({"role": "assistant", "content": ASSISTANT_TURNS[i]})
    messages.append({"role": "user", "content": USER_TURNS[turn]})
    return messages


class Server:
    """A server process and its HTTP address."""

    def __init__(self, name, procs, http_addr):
        self.name = name
        self.procs = procs
        self.http = http_addr

    def stop(self):
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def read_line(proc, prefix, log):
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"process exited before printing {prefix!r}; see {log}")
        if line.startswith(prefix):
            return line[len(prefix):].strip()


def spawn(cmd, log_path, env):
    log = open(log_path, "a")
    log.write("$ " + " ".join(map(str, cmd)) + "\n")
    log.flush()
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)


def start_specd_one(args, out, cache, tag):
    env = dict(os.environ, SPECD_THREADS=str(args.threads), RUST_LOG="warn")
    cmd = [args.specd, "serve", "--target", args.target, "--drafter", args.drafter,
           "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]
    if not cache:
        cmd += ["--prefix-cache-bytes", "0", "--drafter-prefix-cache-bytes", "0"]
    proc = spawn(cmd, out / f"{tag}.log", env)
    http = read_line(proc, "http listening on ", out / f"{tag}.log")
    read_line(proc, "listening on ", out / f"{tag}.log")
    return Server(tag, [proc], http)


def start_specd_split(args, out, tag):
    env = dict(os.environ, SPECD_THREADS=str(args.threads), RUST_LOG="warn")
    log = out / f"{tag}.log"
    verifier = spawn([args.specd, "serve", "verifier", "--target", args.target, "--listen", "127.0.0.1:0"], log, env)
    v_addr = read_line(verifier, "listening on ", log)
    drafter = spawn([args.specd, "serve", "drafter", "--drafter", args.drafter, "--target", args.target,
                     "--listen", "127.0.0.1:0"], log, env)
    d_addr = read_line(drafter, "listening on ", log)
    router = spawn([args.specd, "serve", "router", "--verifier", f"http://{v_addr}", "--drafters",
                    f"http://{d_addr}", "--target", args.target, "--listen", "127.0.0.1:0",
                    "--http-listen", "127.0.0.1:0"], log, env)
    http = read_line(router, "http listening on ", log)
    return Server(tag, [verifier, drafter, router], http)


def start_llama_server(args, out, tag, slots=1, context=8192):
    """llama-server with `slots` parallel slots sharing `context` tokens, once healthy."""
    port = 18000 + os.getpid() % 1000
    cmd = [args.llama_server, "-m", args.target, "--host", "127.0.0.1", "--port", str(port),
           "-np", str(slots), "-t", str(args.threads), "-c", str(context)]
    log = open(out / f"{tag}.log", "a")
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    addr = f"127.0.0.1:{port}"
    for _ in range(600):
        try:
            conn = http.client.HTTPConnection(addr, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return Server(tag, [proc], addr)
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited; see {tag}.log")
        time.sleep(0.5)
    raise RuntimeError("llama-server did not become healthy")


def chat(addr, messages, max_tokens, kind):
    """One streamed chat completion: (ttft s, total s, text, completion tokens, cached
    prompt tokens or None)."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if kind == "specd":
        body["specd"] = {"ignore_eos": True}
    else:
        body["ignore_eos"] = True
        body["cache_prompt"] = True
    data = json.dumps(body)
    conn = http.client.HTTPConnection(addr, timeout=600)
    started = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", data, {"content-type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{addr}: HTTP {response.status}: {response.read()[:300]!r}")
    ttft = None
    text = []
    usage = {}
    timings = {}
    while True:
        line = response.readline()
        if not line:
            break
        line = line.decode().strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        event = json.loads(payload)
        for choice in event.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.perf_counter() - started
                text.append(piece)
        if event.get("usage"):
            usage = event["usage"]
        if event.get("timings"):
            timings = event["timings"]
    total = time.perf_counter() - started
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None and timings:
        # llama-server: prompt tokens it did not evaluate again.
        cached = usage.get("prompt_tokens", 0) - timings.get("prompt_n", 0) if usage else timings.get("cache_n")
    return {
        "ttft": ttft if ttft is not None else total,
        "total": total,
        "text": "".join(text),
        "completion_tokens": usage.get("completion_tokens"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached": cached,
    }


def run_chat(server, kind, system, turns, max_tokens):
    return [chat(server.http, chat_messages(system, t), max_tokens, kind) for t in range(turns)]


def run_agent(server, kind, max_tokens):
    system = agent_system()
    return [chat(server.http, [{"role": "system", "content": system}, {"role": "user", "content": r}],
                 max_tokens, kind) for r in AGENT_REQUESTS]


def run_at_once(count, work):
    """Runs `work(i)` for i in 0..count, each in its own thread, all at once; the wall time
    until the last one ended, in seconds."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def run_load(server, kind, conversations, system_chars, turns, max_tokens):
    """`conversations` chats at once (each with its own first line, so no conversation
    shares K/V with another, nor with those of an earlier run), `turns` turns each;
    aggregate completion tokens/s."""
    results = [None] * conversations
    def one(i):
        system = f"Run {conversations}, conversation {i}.\n" + chat_system(system_chars)
        results[i] = run_chat(server, kind, system, turns, max_tokens)
    elapsed = run_at_once(conversations, one)
    tokens = sum(r["completion_tokens"] or 0 for rs in results for r in rs)
    return {"conversations": conversations, "seconds": elapsed, "tokens": tokens,
            "tokens_per_s": tokens / elapsed, "runs": results}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specd", required=False)
    parser.add_argument("--llama-server", required=False)
    parser.add_argument("--target")
    parser.add_argument("--drafter")
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--chat-chars", type=int, default=6600)
    parser.add_argument("--load-chars", type=int, default=2400)
    parser.add_argument("--skip", default="", help="comma-separated scenarios to skip: chat,agent,load,split")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        report(json.loads((out / "results.json").read_text()), out)
        return
    skip = set(filter(None, args.skip.split(",")))
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "threads": args.threads,
               "cpu": cpu_name(), "chat": {}, "agent": {}, "load": {}}
    system = chat_system(args.chat_chars)
    configs = [
        ("llama-server", "llama", lambda: start_llama_server(args, out, "llama-server")),
        ("specd one-process", "specd", lambda: start_specd_one(args, out, True, "specd-one")),
        ("specd one-process, cache off", "specd", lambda: start_specd_one(args, out, False, "specd-one-nocache")),
    ]
    if "split" not in skip:
        configs.append(("specd split", "specd", lambda: start_specd_split(args, out, "specd-split")))
    for name, kind, start in configs:
        print(f"== {name}", file=sys.stderr, flush=True)
        server = start()
        try:
            if "chat" not in skip:
                results["chat"][name] = run_chat(server, kind, system, len(USER_TURNS), 32)
                print(f"   chat TTFT {[round(r['ttft'], 2) for r in results['chat'][name]]}", file=sys.stderr, flush=True)
            if "agent" not in skip:
                results["agent"][name] = run_agent(server, kind, 32)
                print(f"   agent TTFT {[round(r['ttft'], 2) for r in results['agent'][name]]}", file=sys.stderr, flush=True)
            if "load" not in skip and kind == "specd" and name != "specd split":
                results["load"][name] = [run_load(server, kind, n, args.load_chars, 3, 32) for n in (1, 4, 8)]
                print(f"   load tok/s {[round(r['tokens_per_s'], 2) for r in results['load'][name]]}", file=sys.stderr, flush=True)
        finally:
            server.stop()
        (out / "results.json").write_text(json.dumps(results, indent=1))
    report(results, out)


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def fmt(x, digits=2):
    return "–" if x is None else f"{x:.{digits}f}"


def report(results, out):
    lines = [f"Run {results['started']}, {results['threads']} threads, {results['cpu']}.", ""]
    peer = results["chat"].get("llama-server")
    if results["chat"]:
        lines += ["### Chat: 5 turns, ~1,500-token file in the system prompt, 32 new tokens a turn", "",
                  "| server | turn | TTFT s | total s | prompt tokens | cached | TTFT ÷ llama-server | TTFT ÷ own turn 1 |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name, runs in results["chat"].items():
            for i, r in enumerate(runs):
                vs_peer = r["ttft"] / peer[i]["ttft"] if peer else None
                vs_cold = r["ttft"] / runs[0]["ttft"]
                lines.append(f"| {name} | {i + 1} | {fmt(r['ttft'])} | {fmt(r['total'])} | {r['prompt_tokens'] or '–'} | "
                             f"{r['cached'] if r['cached'] is not None else '–'} | {fmt(vs_peer)} | {fmt(vs_cold)} |")
        lines.append("")
        lines += summary(results["chat"], peer, "chat")
    if results["agent"]:
        apeer = results["agent"].get("llama-server")
        lines += ["### Agent loop: one ~1,500-token system prompt, 8 short requests, 32 new tokens each", "",
                  "| server | request 1 TTFT s | requests 2-8 TTFT s (median) | total s (sum) | cached (requests 2-8) | median TTFT 2-8 ÷ llama-server |",
                  "| --- | ---: | ---: | ---: | --- | ---: |"]
        for name, runs in results["agent"].items():
            warm = statistics.median(r["ttft"] for r in runs[1:])
            peer_warm = statistics.median(r["ttft"] for r in apeer[1:]) if apeer else None
            cached = ", ".join(str(r["cached"]) for r in runs[1:])
            lines.append(f"| {name} | {fmt(runs[0]['ttft'])} | {fmt(warm)} | {fmt(sum(r['total'] for r in runs))} | {cached} | "
                         f"{fmt(warm / peer_warm if peer_warm else None)} |")
        lines.append("")
    if results["load"]:
        lines += ["### Concurrent chats (3 turns each, ~600-token file, 32 new tokens a turn)", "",
                  "| server | conversations | seconds | tokens | tokens/s |", "| --- | ---: | ---: | ---: | ---: |"]
        for name, rows in results["load"].items():
            for row in rows:
                lines.append(f"| {name} | {row['conversations']} | {fmt(row['seconds'])} | {row['tokens']} | {fmt(row['tokens_per_s'])} |")
        on, off = results["load"].get("specd one-process"), results["load"].get("specd one-process, cache off")
        if on and off:
            ratios = ", ".join(f"{a['conversations']}: {a['tokens_per_s'] / b['tokens_per_s']:.2f}" for a, b in zip(on, off))
            lines += ["", f"Cache on ÷ off, aggregate tokens/s by conversations: {ratios}."]
        lines.append("")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def summary(chat_results, peer, scenario):
    lines = []
    on = chat_results.get("specd one-process")
    off = chat_results.get("specd one-process, cache off")
    if on and off:
        same = all(a["text"] == b["text"] for a, b in zip(on, off))
        lines.append(f"Outputs with the prefix cache on and off: {'identical' if same else 'DIFFERENT'} on every turn.")
    for name, runs in chat_results.items():
        if name == "llama-server" or not peer:
            continue
        warm = [r["ttft"] / p["ttft"] for r, p in zip(runs[1:], peer[1:])]
        cold = [r["ttft"] / runs[0]["ttft"] for r in runs[1:]]
        lines.append(f"{name}: warm-turn TTFT {min(warm):.2f}-{max(warm):.2f}x llama-server's; "
                     f"{min(cold):.3f}-{max(cold):.3f}x its own cold turn.")
    lines.append("")
    return lines


if __name__ == "__main__":
    main()
