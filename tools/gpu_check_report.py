"""Tables from tools/gpu_check.sh's runs.jsonl (one `specd generate --json` run per line).

  python3 tools/gpu_check_report.py RUNS.jsonl [--ref REF.json] [--ref-out REF.json]

Correctness: per case, the CUDA tokens against the CPU tokens of the same run (and against
REF.json, CPU tokens from another machine), with the first position where they differ, and each
device's tokens against its plain run of the same group (speculative decoding must not change
them). Speed: decode tokens/s per run, and against the group's plain run on the same device.
--ref-out writes the CPU runs' tokens as REF.json for a later run on another machine.
"""

from __future__ import annotations

import argparse
import json
import sys


def first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(a: list[int] | None, b: list[int] | None) -> str:
    if a is None or b is None:
        return "-"
    i = first_diff(a, b)
    if i is None:
        return f"same ({len(a)})"
    x = a[i] if i < len(a) else "end"
    y = b[i] if i < len(b) else "end"
    return f"differ at {i} ({x} vs {y})"


def tokens(run: dict | None) -> list[int] | None:
    if run is None or run["rc"] != 0 or not run["result"]:
        return None
    return run["result"].get("tokens")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs")
    ap.add_argument("--ref")
    ap.add_argument("--ref-out")
    args = ap.parse_args()
    runs = [json.loads(line) for line in open(args.runs) if line.strip()]
    by = {(r["case"], r["device"]): r for r in runs}
    ref = json.load(open(args.ref)) if args.ref else {}
    if args.ref_out:
        out = {r["case"]: tokens(r) for r in runs if r["device"] == "cpu" and tokens(r)}
        json.dump(out, open(args.ref_out, "w"), indent=0)
    cases = list(dict.fromkeys(r["case"] for r in runs))

    print("| case | cuda | cpu | cuda vs cpu | cuda vs cpu elsewhere | cuda spec = plain | cpu spec = plain | accepted/round (cuda) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for case in cases:
        cu, cp = by.get((case, "cuda")), by.get((case, "cpu"))
        if cu is None and cp is None:
            continue

        def status(r: dict | None) -> str:
            if r is None:
                return "-"
            if r["rc"] == 0:
                return "ok"
            err = (r["error"] or "").splitlines()
            return f"rc={r['rc']}: {err[-1][:90] if err else ''}"

        def lossless(r: dict | None) -> str:
            if r is None or r["case"] == r["group"]:
                return ""
            return compare(tokens(by.get((r["group"], r["device"]))), tokens(r))

        acc = ""
        if cu and cu["rc"] == 0 and cu["result"]:
            m = cu["result"]["stats"].get("mean_accepted_tokens_per_round")
            acc = f"{m:.2f}" if isinstance(m, (int, float)) and cu["case"] != cu["group"] else ""
        print(
            f"| {case} | {status(cu)} | {status(cp)} | {compare(tokens(cp), tokens(cu))} "
            f"| {compare(ref.get(case), tokens(cu)) if case in ref else '-'} | {lossless(cu)} "
            f"| {lossless(cp)} | {acc} |"
        )

    print()
    print("| run | device | decode tokens/s | ratio to plain run | target step ms (probe) | accepted/round | rounds | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in runs:
        if r["rc"] != 0 or not r["result"]:
            continue
        speed, stats = r["result"].get("speed", {}), r["result"].get("stats", {})
        rate = speed.get("decode_tokens_per_s")
        plain = by.get((r["group"], r["device"]))
        base = plain["result"]["speed"].get("decode_tokens_per_s") if plain and plain["rc"] == 0 and plain["result"] else None
        ratio = f"{rate / base:.2f}x" if rate and base and r["case"] != r["group"] else ""
        step = speed.get("plain_step_ms")
        acc = stats.get("mean_accepted_tokens_per_round")
        print(
            f"| {r['case']} | {r['device']} | {rate:.1f} | {ratio} | "
            f"{'' if step is None else f'{step:.2f}'} | "
            f"{'' if acc is None or r['case'] == r['group'] else f'{acc:.2f}'} | "
            f"{stats.get('rounds', '')} | {r['wall_s']:.1f} |"
            if rate
            else f"| {r['case']} | {r['device']} | - | | | | | {r['wall_s']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
