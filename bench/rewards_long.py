"""Reward memory on long agent contexts: the GRPO reward functions (`trainer.rewards.REWARD_FUNCTIONS`), called as
TRL's GRPOTrainer calls them, over rows whose conversation carries a pasted document.

An exported row's `context` column holds the call's whole conversation, and real agent contexts reach 57k-128k tokens:
a reward that keeps the rows or the columns it has scored (to score a group's completions once) holds gigabytes before
a run is far along. The rows are the built-in suites' cases (`tracemill.trainer.fault_rows`: BFCL and MCP-Bench calls
corrupted by the weak-model profiles), each with a user message of `--context-chars` characters put ahead of its
conversation (200,000 by default: about 50k tokens). Each generation batch is `--prompts` rows with `--generations`
completions each (the reference call, the raw output, and calls with one argument changed), scored by every reward
function in turn, as TRL does; `--rows` rows in all. It prints, and writes with `--out`, the peak resident memory and
the seconds taken.

Run by hand, never in CI (bench/README.md, "Rewards on long contexts"):

    .venv/bin/python bench/rewards_long.py --out bench/out/rewards-long.json
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from tracemill.reviser_prompt import PromptSettings
from tracemill.trainer.fault_rows import fault_cases, prompt_row
from tracemill.trainer.rewards import REWARD_FUNCTIONS

from mine import machine

_DOCUMENT = ("Section 4.2 of the attached report: revenue grew 12.5 percent to 4,200 units across 17 regions, while "
             "returns fell to 310 units; the appendix lists every store by city and quarter. ")


def _completions(row: dict[str, Any], generations: int) -> list[str]:
    """A group: the reference calls, the raw output, and the reference with one argument changed (as many as asked)."""
    reference = json.loads(row["reference"]) if row["reference"] else []
    group = [json.dumps(reference[0] if len(reference) == 1 else reference), row["raw"]]
    n = 0
    while len(group) < generations:
        changed = [{**c, "arguments": {**c.get("arguments", {}), "note": f"variant {n}"}} for c in reference]
        group.append(json.dumps(changed or {"name": "none", "arguments": {"n": n}}))
        n += 1
    return group[:generations]


def run(rows: int, prompts: int, generations: int, context_chars: int) -> dict[str, Any]:
    cases = [c for c in fault_cases() if c.reference is not None]
    document = (_DOCUMENT * (context_chars // len(_DOCUMENT) + 1))[:context_chars]
    started = time.perf_counter()
    for start in range(0, rows, prompts):
        batch = []
        for n in range(start, min(start + prompts, rows)):
            row = prompt_row(cases[n % len(cases)], PromptSettings())
            # each row its own document (a new string, as each batch that TRL collates brings)
            context = [{"role": "user", "content": f"[{n}] {document}"}, *json.loads(row["context"] or "[]")]
            row["context"] = json.dumps(context)
            batch += [(row, completion) for completion in _completions(row, generations)]
        columns = {name: [row[name] for row, _ in batch] for name in ("raw", "tools", "context", "reference", "valid")}
        completions = [[{"role": "assistant", "content": completion}] for _, completion in batch]
        for reward in REWARD_FUNCTIONS.values():
            reward(prompts=[[]] * len(batch), completions=completions, **columns)
    return {"rows": rows, "prompts_per_batch": prompts, "generations": generations, "context_chars": context_chars,
            "seconds": round(time.perf_counter() - started, 1),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--prompts", type=int, default=16, help="rows a generation batch holds")
    parser.add_argument("--generations", type=int, default=8, help="completions a row gets (GRPO's group)")
    parser.add_argument("--context-chars", type=int, default=200_000)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    result = {"machine": machine(), **run(args.rows, args.prompts, args.generations, args.context_chars)}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
