"""Rates as MCP-Bench reports them: a share of what was counted, unknown (None, shown as "unknown") where
nothing was."""

from __future__ import annotations

UNKNOWN = "unknown"


def rate(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def percent(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:.1%}"
