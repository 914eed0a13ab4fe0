"""Weak-model profiles: how often each fault kind happens to a model's tool calls, and drawing faults at those rates."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from tracemill.faults.kinds import EXCLUDES, KINDS


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    rates: Mapping[str, float] = field(default_factory=dict)
    description: str = ""


PROFILES: dict[str, Profile] = {
    "clean": Profile("clean", {}, "A model that always emits a valid native tool call."),
    "llama3.1-8b": Profile("llama3.1-8b", {
        "tool_name_case": 0.02, "tool_name_separator": 0.03, "tool_name_prefix": 0.03, "param_name": 0.04,
        "enum_case": 0.05, "number_as_string": 0.08, "array_as_string": 0.06, "extra_param": 0.04,
        "missing_required": 0.04, "omitted_value": 0.03, "synonym_param": 0.03, "swapped_args": 0.02,
        "wrong_format": 0.03, "wrong_tool": 0.02, "pythonic": 0.08, "wrapper": 0.06,
        "python_literals": 0.03, "double_encoded": 0.04,
        "concatenated": 0.03, "missing_brace": 0.04, "truncated": 0.01, "python_tag": 0.12, "tool_call_tag": 0.02,
        "fence": 0.04, "prose": 0.06,
    }, "Llama 3.1 8B through a generic parser: tool calls leak as text, pythonic calls, loose types."),
    "gemma3-27b": Profile("gemma3-27b", {
        "tool_name_case": 0.01, "tool_name_separator": 0.02, "tool_name_prefix": 0.02, "param_name": 0.02,
        "enum_case": 0.03, "number_as_string": 0.04, "array_as_string": 0.03, "extra_param": 0.02,
        "missing_required": 0.02, "omitted_value": 0.02, "synonym_param": 0.02, "swapped_args": 0.01,
        "wrong_format": 0.02, "wrong_tool": 0.01, "pythonic": 0.10, "wrapper": 0.03,
        "python_literals": 0.02, "double_encoded": 0.01,
        "concatenated": 0.01, "missing_brace": 0.02, "truncated": 0.005, "tool_call_tag": 0.02, "fence": 0.15,
        "prose": 0.10,
    }, "Gemma 3 27B, no native tool-call format: fenced JSON or code with prose around it."),
    "qwen3": Profile("qwen3", {
        "tool_name_case": 0.005, "tool_name_separator": 0.01, "tool_name_prefix": 0.01, "param_name": 0.01,
        "enum_case": 0.02, "number_as_string": 0.03, "array_as_string": 0.03, "extra_param": 0.01,
        "missing_required": 0.01, "omitted_value": 0.01, "synonym_param": 0.01, "swapped_args": 0.005,
        "wrong_format": 0.01, "wrong_tool": 0.01, "double_encoded": 0.02, "concatenated": 0.01, "missing_brace": 0.01,
        "truncated": 0.005, "tool_call_tag": 0.05, "prose": 0.03,
    }, "Qwen3: mostly native calls; Hermes <tool_call> text leaks when the parser misses, loose types."),
}


WEAK_PROFILES: tuple[str, ...] = ("llama3.1-8b", "gemma3-27b", "qwen3")  # the open models the suites and demo use


def _profile(profile: str | Profile) -> Profile:
    if isinstance(profile, Profile):
        return profile
    try:
        return PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown model profile {profile!r}; known: {', '.join(sorted(PROFILES))}") from None


def sample_faults(profile: str | Profile, rng: random.Random, n_calls: int | None = None) -> list[str]:
    """Draw each kind independently at the profile's rate, then drop kinds excluded by one drawn earlier. With
    `n_calls=1` (an output known to hold one intended call) `concatenated`, which joins several calls, is not drawn."""
    rates = _profile(profile).rates
    drawn = [k for k in KINDS if rng.random() < rates.get(k, 0.0)]
    if n_calls == 1:
        drawn = [k for k in drawn if k != "concatenated"]
    kept: list[str] = []
    for kind in drawn:
        if not any(kind in EXCLUDES.get(k, ()) for k in kept):
            kept.append(kind)
    return kept
