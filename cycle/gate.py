"""The gate: a candidate replaces the active reviser only when, on the same held-out cases (the mined eval split, which
no candidate trained on), all of these hold:

- there are at least `min_held_out_cases` of them: on a handful one case decides (0/1 -> 1/1 reads as a gain of
  100 points), so fewer are refused, saying how many there were and how many it takes;
- its reference match and input schema compliance are each at least the active reviser's plus the margin, the bar
  capped at 100%: an active reviser already perfect on these cases can be matched but not beaten, so a candidate that
  matches it passes that check and is judged by the others (without the cap none could ever pass);
- it changes no valid call, on the held-out split and on each `[eval]` suite: a reviser must do no harm.
"""

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
    if old is None:
        return Check(name, HELD_OUT, new, old, "a figure for both", False)
    needed = min(old + margin, 1.0)
    said = f"at least {percent(old)} + {percent(margin)}"
    if needed < old + margin:
        said += f", capped at {percent(1.0)}"
    return Check(name, HELD_OUT, new, old, said, new is not None and new >= needed - 1e-12)


def judge(figures: Mapping[str, Mapping[str, Any]], gate: Gate) -> GateResult:
    """`figures`: per suite, `{"candidate": metrics, "baseline": metrics}` (`tracemill eval`'s metrics)."""
    held_out = figures.get(HELD_OUT)
    cases = (held_out[CANDIDATE].get("cases") or 0) if held_out else 0
    if not cases:
        return GateResult(False, "no held-out cases to measure the candidate on (the mined eval split is empty)", ())
    if cases < gate.min_held_out_cases:
        return GateResult(False, f"refused: {cases} held-out case(s), at least {gate.min_held_out_cases} needed "
                                 "(min_held_out_cases) to tell the candidate from the active reviser", ())
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
