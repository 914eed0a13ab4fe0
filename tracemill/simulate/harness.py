"""Simulated harness versions: what a change to the agent's prompt or tool descriptions does to a weak model's calls.

Each version keeps the changes of the versions before it and scales the rates of the fault kinds its change is
about (`tracemill simulate --harness-version NAME`). So `tracemill failures --compare` shows each change paying, then a
plateau once the harness has done what it can: what is left (missing values, context-only faults, cut outputs) is what
a trained reviser is for. A name not in the table is simulated as `prompt-v1`.

The table, one entry per version: its change, then the fault kinds it makes rarer (rate ×).

- prompt-v1: the baseline prompt and the servers' own tool descriptions
  rarer: —
- prompt-v2: tool descriptions give each tool's exact name, with its server, and its parameters' names
  rarer: tool names ×0.25, parameter names ×0.4, wrong tool of the right server ×0.6
- prompt-v3: the system prompt asks for the tool call alone, as JSON, with no prose or code fences
  rarer: prose ×0.25, fence ×0.25, tool-call tags ×0.5, pythonic ×0.5, wrapper ×0.5
- prompt-v4: each tool description shows a typed example call (numbers as numbers, arrays as arrays)
  rarer: number as string ×0.3, array as string ×0.3, Python literals ×0.5, wrong format ×0.6
- prompt-v5: the system prompt reworded for clarity
  rarer: — (the plateau)
- prompt-v6: the tool descriptions shortened
  rarer: —
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tracemill.faults import Profile

_TOOL_NAMES = ("tool_name_case", "tool_name_separator", "tool_name_prefix")


@dataclass(frozen=True, slots=True)
class HarnessVersion:
    name: str
    change: str
    factors: Mapping[str, float] = field(default_factory=dict)  # fault kind -> rate multiplier, this change alone


HARNESS_VERSIONS: tuple[HarnessVersion, ...] = (
    HarnessVersion("prompt-v1", "the baseline prompt and the servers' own tool descriptions"),
    HarnessVersion("prompt-v2", "tool descriptions give each tool's exact name, with its server, and its parameters' "
                   "names", {**dict.fromkeys(_TOOL_NAMES, 0.25), "param_name": 0.4, "synonym_param": 0.4,
                             "wrong_tool": 0.6}),
    HarnessVersion("prompt-v3", "the system prompt asks for the tool call alone, as JSON, with no prose or code fences",
                   {"prose": 0.25, "fence": 0.25, "tool_call_tag": 0.5, "python_tag": 0.5, "pythonic": 0.5,
                    "wrapper": 0.5}),
    HarnessVersion("prompt-v4", "each tool description shows a typed example call (numbers as numbers, arrays as "
                   "arrays)", {"number_as_string": 0.3, "array_as_string": 0.3, "python_literals": 0.5,
                               "wrong_format": 0.6}),
    HarnessVersion("prompt-v5", "the system prompt reworded for clarity"),
    HarnessVersion("prompt-v6", "the tool descriptions shortened"),
)
_BY_NAME = {v.name: i for i, v in enumerate(HARNESS_VERSIONS)}


def factors(harness_version: str) -> dict[str, float]:
    """The rate multipliers of a version with those of every version before it; none for a name not in the table."""
    upto = _BY_NAME.get(harness_version, 0)
    found: dict[str, float] = {}
    for version in HARNESS_VERSIONS[: upto + 1]:
        for kind, factor in version.factors.items():
            found[kind] = found.get(kind, 1.0) * factor
    return found


def under_harness(profile: Profile, harness_version: str) -> Profile:
    """The profile's fault rates as the model shows them under this harness version."""
    scale = factors(harness_version)
    if not scale:
        return profile
    rates = {kind: rate * scale.get(kind, 1.0) for kind, rate in profile.rates.items()}
    return Profile(profile.name, rates, profile.description)
