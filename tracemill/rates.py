"""Rates as MCP-Bench reports them: a share of what was counted, unknown (None, shown as "unknown") where
nothing was."""

from __future__ import annotations

from collections.abc import Sequence

UNKNOWN = "unknown"
BARS = "▁▂▃▄▅▆▇█"


def rate(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def percent(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:.1%}"


def sparkline(values: Sequence[float | None]) -> str:
    """A bar a value, from zero to the highest of them (a steady rate is a level row of full bars, not its noise drawn
    tall); a space where a value is unknown."""
    top = max((v for v in values if v is not None), default=0.0)
    return "".join(" " if v is None else BARS[min(len(BARS) - 1, int(v / top * len(BARS)))] if top > 0 else BARS[0]
                   for v in values)
