#!/usr/bin/env python3
"""The checks of tools/compose_smoke.sh, with the `openai` client an operator's users have.

  compose_smoke.py reference --base-url URL --out FILE
      the requests of CASES against a specd run in one process, decoding plainly; their
      streamed answers written to FILE.
  compose_smoke.py served --base-url URL --ca CA --api-key KEY --reference FILE
                          --project NAME --prometheus URL --max-kv-tokens N --batch-max-rows N
      the same requests against the compose services, plus the operator's checks; prints
      one line per check and exits 1 at the first that fails, naming it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import httpx
from openai import APIStatusError, AuthenticationError, OpenAI

# The served model's id, as /v1/models lists it (set by the first listing).
MODEL = ""
# Greedy and seeded sampling: both must come out of the split services exactly as out of one
# process. `long` is the stream a drafter is killed in the middle of.
CASES = {
    "greedy": {
        "messages": [
            {
                "role": "user",
                "content": "Write a Python function that checks whether a string is a "
                "palindrome, ignoring case and spaces, with a docstring.",
            }
        ],
        "max_tokens": 128,
        "temperature": 0,
    },
    "seeded": {
        "messages": [
            {"role": "user", "content": "Describe a harbour town at dawn in a short paragraph."}
        ],
        "max_tokens": 96,
        "temperature": 0.8,
        "top_p": 0.95,
        "seed": 7,
    },
    "long": {
        "messages": [
            {
                "role": "user",
                "content": "Write a Python class implementing an LRU cache with get and put, "
                "type hints, docstrings and a short usage example.",
            }
        ],
        "max_tokens": 320,
        "temperature": 0,
        # A fixed block: the stream speculates whatever the load, so a drafter holds it.
        "extra_body": {"specd": {"block_size": 4}},
    },
}
# Different prompts at once, so that the router's least-loaded choice spreads the sessions.
SPREAD_PROMPTS = [
    "Write a Python function that merges two sorted lists.",
    "Write a Rust function that reverses the words of a sentence.",
    "Write a SQL query that lists the ten most recent orders per customer.",
    "Write a JavaScript function that debounces another function.",
]
DRAFTER_SLOTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]


class CheckFailed(Exception):
    pass


def check(name: str, ok: bool, detail: str = "") -> None:
    if not ok:
        raise CheckFailed(f"{name}: {detail}" if detail else name)
    print(f"  ok  {name}" + (f" ({detail})" if detail else ""), flush=True)


def check_same(name: str, answer: dict, want: dict) -> None:
    """A streamed answer must be the reference's: the same text and finish reason."""
    same = answer["text"] == want["text"] and answer["finish_reason"] == want["finish_reason"]
    check(
        name,
        same,
        f"{len(answer['text'])} characters in {answer['chunks']} chunks"
        if same
        else f"got {answer['text']!r}, want {want['text']!r}",
    )


def use_model(models: list[str]) -> None:
    global MODEL
    MODEL = models[0]


def stream(client: OpenAI, case: dict, on_chunk=None) -> dict:
    """One streamed chat completion: its text, finish reason and chunk count."""
    text, finish, chunks = [], None, 0
    response = client.chat.completions.create(model=MODEL, stream=True, **case)
    for chunk in response:
        chunks += 1
        for choice in chunk.choices:
            if choice.delta.content:
                text.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
        if on_chunk:
            on_chunk(chunks)
    return {"text": "".join(text), "finish_reason": finish, "chunks": chunks}


def reference(args) -> int:
    client = OpenAI(base_url=args.base_url, api_key="unused", timeout=600, max_retries=0)
    models = sorted(m.id for m in client.models.list().data)
    use_model(models)
    # Plain decoding: what every speculative answer must equal.
    plain = {"extra_body": {"specd": {"speculative": False}}}
    answers = {name: stream(client, {**case, **plain}) for name, case in CASES.items()}
    for name, answer in answers.items():
        print(f"  reference {name}: {len(answer['text'])} characters, {answer['finish_reason']}")
    with open(args.out, "w") as out:
        json.dump({"models": models, "answers": answers}, out)
    return 0


# ------------------------------------------------------------------------------ served


def metrics(url: str) -> dict[str, float]:
    """A Prometheus text exposition as {series: value}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            values[series] = float(value)
    return values


def metric_sum(values: dict[str, float], name: str) -> float:
    return sum(v for series, v in values.items() if series.split("{")[0] == name)


def drafter_metrics(slot: str) -> dict[str, float] | None:
    try:
        return metrics(f"http://{slot}:9092/metrics")
    except OSError:
        return None


def draft_calls(slot: str) -> float:
    values = drafter_metrics(slot) or {}
    return sum(
        v
        for series, v in values.items()
        if series.startswith("specd_draft_duration_seconds_count") and 'side="server"' in series
    )


# The compose files of the run (for `up`; the other commands need the project's name only).
COMPOSE_FILES: list[str] = []


def compose(project: str, *args: str) -> str:
    files = [arg for f in COMPOSE_FILES for arg in ("-f", f)]
    return subprocess.run(
        ["docker", "compose", "-p", project, *files, *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def drafter_containers(project: str) -> dict[str, str]:
    """slot address -> container id of the running drafter replicas."""
    slots = {}
    for container in compose(project, "ps", "-q", "drafter").split():
        slot = subprocess.run(
            ["docker", "exec", container, "cat", "/tmp/specd-slot"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if slot:
            slots[slot] = container
    return slots


def spread(client: OpenAI, running: dict[str, str]) -> dict[str, float]:
    """Draft calls each running drafter served for SPREAD_PROMPTS sent at once."""
    before = {slot: draft_calls(slot) for slot in running}
    with ThreadPoolExecutor(len(SPREAD_PROMPTS)) as pool:
        list(
            pool.map(
                lambda prompt: client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=48,
                    temperature=0,
                    # Under the default policy a 2-core box decodes this many clients
                    # plainly (speculation would be slower there): no drafter would be asked.
                    extra_body={"specd": {"block_size": 4}},
                ),
                SPREAD_PROMPTS,
            )
        )
    return {slot: draft_calls(slot) - before[slot] for slot in running}


def served(args) -> int:
    with open(args.reference) as f:
        reference = json.load(f)
    http = httpx.Client(verify=args.ca, timeout=600)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, http_client=http, max_retries=0)

    # API keys.
    stranger = OpenAI(
        base_url=args.base_url, api_key="sk-not-a-key", http_client=http, max_retries=0
    )
    try:
        stranger.models.list()
        check("a wrong API key is refused", False, "it was served")
    except AuthenticationError as error:
        check("a wrong API key is refused", error.status_code == 401, f"HTTP {error.status_code}")

    models = sorted(m.id for m in client.models.list().data)
    check("models listed", models == reference["models"], f"{models}")
    use_model(models)

    # Streamed answers equal to one process's.
    for name in ("greedy", "seeded"):
        answer = stream(client, CASES[name])
        want = reference["answers"][name]
        check_same(f"streamed chat ({name}) equals the one-process plain answer", answer, want)

    # Both drafters serve; Prometheus scrapes every service.
    running = drafter_containers(args.project)
    check("two drafter replicas hold a slot each", len(running) == 2, f"{sorted(running)}")
    calls = spread(client, running)
    check(
        "concurrent requests spread over both drafters",
        all(n > 0 for n in calls.values()),
        ", ".join(f"{slot}: {int(n)} draft calls" for slot, n in sorted(calls.items())),
    )
    check_prometheus(args.prometheus, sorted(running))

    # The verifier's limits as configured, and its K/V budget enforced.
    logs = compose(args.project, "logs", "--no-color", "verifier")
    limits = [line for line in logs.splitlines() if "verifier limits" in line]
    want = [f"max_kv_tokens={args.max_kv_tokens}", f"batch_max_rows={args.batch_max_rows}"]
    check(
        "the verifier runs with the configured limits",
        bool(limits) and all(w in limits[-1] for w in want),
        limits[-1].split("verifier limits")[-1].strip() if limits else "no 'verifier limits' line",
    )
    try:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count to ten."}],
            max_tokens=args.max_kv_tokens,
            temperature=0,
        )
        check("a request beyond the K/V budget is refused", False, "it was served")
    except APIStatusError as error:
        check(
            "a request beyond the K/V budget is refused",
            error.status_code == 429,
            f"HTTP {error.status_code}: {str(error.message)[:120]}",
        )

    kill_drafter_mid_stream(args, client, reference["answers"]["long"])
    return 0


def check_prometheus(url: str, drafters: list[str]) -> None:
    """Every specd service is a target that is up (the drafters: the two slots held)."""
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(f"{url}/api/v1/targets?state=active", timeout=10) as r:
            targets = json.load(r)["data"]["activeTargets"]
        up = {
            (t["labels"]["job"], t["labels"]["instance"])
            for t in targets
            if t["health"] == "up"
        }
        want = {("specd-router", "router:9090"), ("specd-verifier", "verifier:9091")}
        want |= {("specd-drafter", f"{slot}:9092") for slot in drafters}
        if want <= up or time.monotonic() > deadline:
            break
        time.sleep(2)
    check(
        "Prometheus scrapes the router, the verifier and both drafters",
        want <= up,
        f"{len(up)} targets up" if want <= up else f"missing {sorted(want - up)}",
    )
    # A series from each service, read back through Prometheus' query API.
    query = urllib.parse.quote("count by (job) (specd_wire_bytes_total)")
    with urllib.request.urlopen(f"{url}/api/v1/query?query={query}", timeout=10) as r:
        jobs = {s["metric"].get("job") for s in json.load(r)["data"]["result"]}
    check(
        "Prometheus holds specd series of every service",
        {"specd-router", "specd-verifier", "specd-drafter"} <= jobs,
        f"jobs {sorted(j for j in jobs if j)}",
    )


def kill_drafter_mid_stream(args, client: OpenAI, want: dict) -> None:
    """Kills the drafter container serving a stream after its first chunks; the stream must
    go on and end exactly as the one-process answer."""
    running = drafter_containers(args.project)
    router_before = metrics("http://127.0.0.1:9090/metrics")
    killed: list[str] = []

    def on_chunk(n: int) -> None:
        if n != 12:
            return
        # The replica holding the session: the one with an open session now.
        for slot, container in running.items():
            values = drafter_metrics(slot) or {}
            if metric_sum(values, "specd_drafter_sessions") > 0:
                subprocess.run(["docker", "kill", container], check=True, capture_output=True)
                killed.append(slot)
                return

    answer = stream(client, CASES["long"], on_chunk)
    check("a drafter was killed mid-stream", len(killed) == 1, f"killed the one on {killed}")
    check_same("the stream survives the kill and equals the one-process plain answer", answer, want)
    router_after = metrics("http://127.0.0.1:9090/metrics")
    moved = {
        series: value - router_before.get(series, 0)
        for series, value in router_after.items()
        if series.startswith("specd_fallbacks_total") and value > router_before.get(series, 0)
    }
    check("the router counted the lost drafter", bool(moved), f"{moved}")
    # The other replica keeps serving.
    (left,) = [slot for slot in running if slot not in killed]
    before = draft_calls(left)
    answer = stream(client, CASES["long"])
    check(
        "the remaining drafter serves the next stream, equal to the one-process plain answer",
        answer["text"] == want["text"] and draft_calls(left) > before,
        f"{int(draft_calls(left) - before)} draft calls on {left}",
    )

    # `up` again brings the pool back to two: the new replica claims the address the killed
    # one held (the kernel dropped its lock) and the router's re-resolved pool uses it again.
    compose(args.project, "up", "-d", "--no-build", "--scale", "drafter=2", "--wait",
            "--wait-timeout", "300")
    running = drafter_containers(args.project)
    check(
        "a replacement replica claims the freed address",
        len(running) == 2 and killed[0] in running,
        f"{sorted(running)}",
    )
    # The router leaves a failed drafter out for a while and re-resolves the name
    # periodically: give it that long to take the replacement in.
    deadline = time.monotonic() + 60
    while True:
        calls = spread(client, running)
        if all(n > 0 for n in calls.values()) or time.monotonic() > deadline:
            break
        time.sleep(5)
    check(
        "requests spread over the replacement and the survivor",
        all(n > 0 for n in calls.values()),
        ", ".join(f"{slot}: {int(n)} draft calls" for slot, n in sorted(calls.items())),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ref = sub.add_parser("reference")
    ref.add_argument("--base-url", required=True)
    ref.add_argument("--out", required=True)
    srv = sub.add_parser("served")
    srv.add_argument("--base-url", required=True)
    srv.add_argument("--ca", required=True)
    srv.add_argument("--api-key", required=True)
    srv.add_argument("--reference", required=True)
    srv.add_argument("--project", required=True)
    srv.add_argument("--prometheus", required=True)
    srv.add_argument("--max-kv-tokens", type=int, required=True)
    srv.add_argument("--batch-max-rows", type=int, required=True)
    srv.add_argument("--compose-file", action="append", default=[])
    args = parser.parse_args()
    if args.command == "served":
        COMPOSE_FILES.extend(args.compose_file)
    try:
        return reference(args) if args.command == "reference" else served(args)
    except CheckFailed as failed:
        print(f"  FAILED  {failed}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
