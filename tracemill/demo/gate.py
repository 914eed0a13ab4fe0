"""The demo's deployment gate: the candidate's figures beside the active reviser's (the rules) on the same held-out
cases, the eval split the trainer measured both on (`models.evaluation["eval"]`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracemill.rates import percent


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    candidate: float | None
    active: float | None
    passed: bool
    rule: str

    def describe(self) -> str:
        return f"{self.name}: {percent(self.candidate)} vs {percent(self.active)} ({self.rule})"


@dataclass(frozen=True, slots=True)
class Verdict:
    candidate: str
    cases: int
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def reasons(self) -> list[str]:
        return [c.describe() for c in self.checks if not c.passed]


def _at_least(name: str, candidate: float | None, active: float | None, margin: float) -> Check:
    passed = candidate is not None and (active is None or candidate >= active + margin)
    return Check(name, candidate, active, passed, f"must be at least {percent(margin)} above" if margin
                 else "must not be lower")


def judge(candidate: str, evaluation: Mapping[str, Any], margin: float) -> Verdict:
    """Better by `margin` on reference match and on schema compliance, and not one valid call changed."""
    held_out = evaluation.get("eval") or {}
    model, rules = held_out.get("model") or {}, held_out.get("rules") or {}
    changed = model.get("valid_changed")
    checks = (
        _at_least("reference match", model.get("reference_match"), rules.get("reference_match"), margin),
        _at_least("schema compliance", model.get("input_schema_compliance"), rules.get("input_schema_compliance"),
                  margin),
        Check("valid calls changed", changed, rules.get("valid_changed"), not changed, "must be 0"),
    )
    return Verdict(candidate, int(held_out.get("cases") or 0), checks if model else ())
