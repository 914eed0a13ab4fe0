"""Reviser latency: time per `tracemill.repair.revise` call on the built-in `bfcl` and `mcp-bench` suites (model
outputs corrupted by the seeded fault library, about 40 % of them not valid as sent), with the tool index built once per
case as a caller that revises many calls against one tool list does. Target: median under 1 ms.

Run by hand, never in CI (see bench/README.md, "Reviser"):

    .venv/bin/python bench/revise.py --out bench/out/revise.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from tracemill.repair import revise
from tracemill.revisers import strict_calls
from tracemill.suites import bfcl_suite, mcp_bench_suite
from tracemill.tools import tool_index
from tracemill.verify import verify


def _summary(micros: list[float]) -> dict[str, float]:
    ordered = sorted(micros)
    return {"calls": len(ordered), "median_us": statistics.median(ordered),
            "p95_us": ordered[int(len(ordered) * 0.95)], "p99_us": ordered[int(len(ordered) * 0.99)],
            "max_us": ordered[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="passes over the cases; each call's time is its median")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()

    cases = bfcl_suite(args.seed) + mcp_bench_suite(args.seed)
    indexes = [tool_index(c.tools) for c in cases]
    valid = []
    for case, index in zip(cases, indexes, strict=True):
        calls = strict_calls(case.raw)
        valid.append(calls is not None and all(verify(c, index).ok for c in calls))
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(args.repeat):
        for i, (case, index) in enumerate(zip(cases, indexes, strict=True)):
            start = time.perf_counter_ns()
            revise(case.raw, index)
            times[i].append((time.perf_counter_ns() - start) / 1000)
    per_call = [statistics.median(t) for t in times]
    figures = {
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "system": platform.platform()},
        "repeat": args.repeat,
        "all": _summary(per_call),
        "valid_as_sent": _summary([t for t, v in zip(per_call, valid, strict=True) if v]),
        "not_valid_as_sent": _summary([t for t, v in zip(per_call, valid, strict=True) if not v]),
    }
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
