"""The gate: a candidate replaces the active reviser only when, on the same held-out cases, it is better by the
configured margins on reference match and input schema compliance and changes no valid call."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tracemill.cycle.settings import Gate
from tracemill.rates import percent

HELD_OUT = "eval"  # the suite of the dataset's eval split: the cases no candidate trained on
CANDIDATE, BASELINE = "candidate", "baseline"


@dataclass(frozen=True, slots=True)
class Check:
    name: str  # reference_match | input_schema_compliance | valid_changed
    suite: str
    candidate: float | None
    baseline: float | None
    needed: str  # what passing takes, in words
    passed: bool


@dataclass(frozen=True, slots=True)
class GateResult:
    passed: bool
    reason: str
    checks: tuple[Check, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason, "checks": [asdict(c) for c in self.checks]}


def _gain(name: str, candidate: Mapping[str, Any], baseline: Mapping[str, Any], margin: float) -> Check:
    new, old = candidate.get(name), baseline.get(name)
    passed = new is not None and old is not None and new >= old + margin - 1e-12
    return Check(name, HELD_OUT, new, old, f"at least {percent(old)} + {percent(margin)}" if old is not None
                 else "a figure for both", passed)


def judge(figures: Mapping[str, Mapping[str, Any]], gate: Gate) -> GateResult:
    """`figures`: per suite, `{"candidate": metrics, "baseline": metrics}` (`tracemill eval`'s metrics)."""
    held_out = figures.get(HELD_OUT)
    if not held_out or not held_out[CANDIDATE].get("cases"):
        return GateResult(False, "no held-out cases to measure the candidate on (the mined eval split is empty)", ())
    new, old = held_out[CANDIDATE], held_out[BASELINE]
    checks = [_gain("reference_match", new, old, gate.reference_margin),
              _gain("input_schema_compliance", new, old, gate.schema_margin)]
    for suite, pair in figures.items():
        changed = pair[CANDIDATE].get("valid_changed")
        checks.append(Check("valid_changed", suite, changed, pair[BASELINE].get("valid_changed"), "0",
                            not changed))
    failed = [c for c in checks if not c.passed]
    if failed:
        said = "; ".join(f"{c.name.replace('_', ' ')} on {c.suite}: {percent(c.candidate)} vs {percent(c.baseline)}, "
                         f"needed {c.needed}" for c in failed)
        return GateResult(False, f"refused: {said}", tuple(checks))
    return GateResult(True, f"passed: reference match {percent(old.get('reference_match'))} -> "
                            f"{percent(new.get('reference_match'))}, schema compliance "
                            f"{percent(old.get('input_schema_compliance'))} -> "
                            f"{percent(new.get('input_schema_compliance'))}, no valid call changed", tuple(checks))
