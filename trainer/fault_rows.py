"""RL prompt rows made from the fault library, in the format `tracemill mine` writes (DESIGN.md, "RL prompt rows"):
the trainer's tests and benchmarks use them where no store of real traffic is at hand, and the tiny model's tokenizer
learns its text from them.

Each row is one case with the reviser prompt built for it by `tracemill.reviser_prompt.build_prompt`: an eval-suite
case (`tracemill.suites`: BFCL v4 ground truth and MCP-Bench example calls, corrupted by `tracemill.faults` under the
weak-model profiles), or a sampled call to one of a few small tools (`sampled_cases`: many calls, few tools, for
benchmarks a tiny model can learn in minutes). The reference is the call the case was corrupted from. Beside the
miner's columns a row has `faults`, the fault kinds applied (a list), for benchmarks that report by kind.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from tracemill.bfcl import load_bfcl
from tracemill.examples import request_words, sampled_arguments
from tracemill.faults import WEAK_PROFILES, corrupt_calls, sample_faults
from tracemill.reviser_prompt import PromptSettings, build_prompt
from tracemill.revisers import no_reviser
from tracemill.suites import Case, bfcl_suite, mcp_bench_suite
from tracemill.tools import Tool, tool_index
from tracemill.trainer.dataset import CARD, EVAL, TRAIN
from tracemill.verify import ToolCall, verify


def fault_cases(seed: int = 0, sources: Sequence[str] = ("bfcl", "mcp-bench"), max_calls: int | None = None
                ) -> list[Case]:
    """The built-in suites' cases (BFCL with the user's question as its conversation), `max_calls` reference calls at
    most."""
    cases: list[Case] = []
    if "bfcl" in sources:
        cases += bfcl_suite(seed)
    if "mcp-bench" in sources:
        cases += mcp_bench_suite(seed)
    return [c for c in cases if max_calls is None or len(c.reference or ()) <= max_calls]


def _simple(tool: Tool, max_params: int) -> bool:
    props = tool.input_schema.get("properties") or {}
    flat = all(isinstance(p, dict) and p.get("type") in ("string", "integer", "number") for p in props.values())
    return 0 < len(props) <= max_params and flat


def sampled_cases(n: int, seed: int = 0, n_tools: int = 12, max_params: int = 3,
                  profiles: Sequence[str] = WEAK_PROFILES) -> list[Case]:
    """`n` cases over a few small BFCL tools (flat parameters, `max_params` at most), each a call with sampled values
    (`tracemill.examples.sampled_arguments`) written by a weak-model profile: many different calls to few tools."""
    found = {t.name: t for c in load_bfcl(["simple_python"]) for t in c.tools if _simple(t, max_params)}
    tools = list(found.values())[:n_tools]
    rng = random.Random(seed)
    cases: list[Case] = []
    while len(cases) < n:
        tool = rng.choice(tools)
        call = ToolCall(tool.name, sampled_arguments(tool.input_schema, request_words(tool.description), rng,
                                                     optional_rate=0.3))
        if not verify(call, tools).ok:
            continue
        profile = profiles[len(cases) % len(profiles)]
        bad = corrupt_calls([call], tools, sample_faults(profile, rng, n_calls=1), rng)
        cases.append(Case(f"{tool.name}/{len(cases)}/{profile}", tuple(tools), bad.raw, (call,), None, None,
                          bad.recoverable, bad.kinds))
    return cases


def _failure_class(case: Case) -> tuple[bool, str, str | None, list[dict[str, Any]]]:
    revision = no_reviser(case.raw, tool_index(case.tools))
    if revision.ok:
        return True, "valid", None, []
    verdict = next(v for v in revision.verdicts if not v.ok)
    first = verdict.violations[0]
    return False, f"{first.stage.value}:{first.kind}", verdict.stage.value if verdict.stage else None, [
        v.to_dict() for v in verdict.violations]


def prompt_row(case: Case, settings: PromptSettings) -> dict[str, Any]:
    """One RL prompt row for a case."""
    prompt = build_prompt(case.raw, tool_index(case.tools), case.context, settings)
    valid, failure_class, stage, violations = _failure_class(case)
    source, _, model = case.id.rpartition("/")
    return {
        "id": case.id, "prompt": prompt.to_list(), "raw": case.raw,
        "tools": prompt.tools_json,
        "context": json.dumps(case.context) if case.context is not None else None,
        "reference": json.dumps([c.to_dict() for c in case.reference]) if case.reference is not None else None,
        "provenance": "gold" if case.reference is not None else None,
        "valid": valid, "failure_class": failure_class, "stage": stage, "violations": json.dumps(violations),
        "model": model, "harness_version": None, "domain": "mcp-bench" if ":" in source else "bfcl",
        "trace_id": None, "call_id": None, "created_at": None,
        "faults": list(case.faults),
    }


def _jsonl(rows: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def write_rows(out: Path, cases: Sequence[Case], settings: PromptSettings, eval_share: float = 0.2,
               seed: int = 0) -> Path:
    """`train.jsonl`, `eval.jsonl` and the card `dataset.json` in `out`: a seeded `eval_share` of the cases go to
    eval."""
    order = list(cases)
    random.Random(seed).shuffle(order)
    cut = int(len(order) * eval_share)
    evaluation = [prompt_row(c, settings) for c in order[:cut]]
    train = [prompt_row(c, settings) for c in order[cut:]]
    out.mkdir(parents=True, exist_ok=True)
    (out / TRAIN).write_bytes(train_bytes := _jsonl(train))
    (out / EVAL).write_bytes(eval_bytes := _jsonl(evaluation))
    counts: dict[str, int] = {}
    for row in train + evaluation:
        counts[row["failure_class"]] = counts.get(row["failure_class"], 0) + 1
    card = {"name": out.name, "source": "fault library (tracemill.trainer.fault_rows)", "seed": seed,
            "split": {"train": len(train), "eval": len(evaluation)}, "failure_classes": dict(sorted(counts.items())),
            "prompt_settings": settings.to_dict(),
            "content_hash": hashlib.sha256(train_bytes + eval_bytes).hexdigest()}
    (out / CARD).write_bytes(orjson.dumps(card, option=orjson.OPT_INDENT_2))
    return out
