"""Near-miss tool names: which offered tool a model meant when the name it wrote is not among them.

A match is found in tiers, and a tier with two candidates matches none: the same name up to case and separators;
the same name up to a server or namespace prefix (`Server:tool`, `functions.tool`, `mcp__server__tool`); then the one
clearly closest name. The reviser's reader and its fixing both ask this module, so they agree on what a name means."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tracemill.tools import Tool, base_key, name_key, name_parts

try:  # difflib's own algorithm, compiled: the same ratios, about four times faster; difflib where no wheel is built
    from cydifflib import SequenceMatcher
except ImportError:  # a Python that cydifflib publishes no wheel for
    from difflib import SequenceMatcher


def similarity(a: str, b: str) -> float:
    """difflib's ratio of two names (twice the matched characters over both lengths), no junk heuristic."""
    return SequenceMatcher(None, a, b, autojunk=False).ratio()


def _bases(name: str) -> set[str]:
    """Keys of a name and of every suffix after a server or namespace separator (`:`, `.`, `/`, `__`)."""
    parts = name_parts(name)
    return {name_key("".join(parts[i:])) for i in range(len(parts))} - {""}


def unique_closest(name: str, candidates: Sequence[str], cutoff: float) -> str | None:
    """The one candidate clearly closest to `name`; None when none is close or two are equally close."""
    key = name_key(name)
    scored = []
    for c in candidates:
        matcher = SequenceMatcher(None, key, name_key(c), autojunk=False)
        if matcher.real_quick_ratio() >= cutoff and matcher.quick_ratio() >= cutoff:
            scored.append((matcher.ratio(), c))
    scored.sort(reverse=True)
    if not scored or scored[0][0] < cutoff or (len(scored) > 1 and scored[1][0] >= scored[0][0] - 0.02):
        return None
    return scored[0][1]


def match_tool(name: str, index: Mapping[str, Tool]) -> tuple[str, str] | None:
    """(tool name, why) for a near-miss of exactly one offered tool; None when there is none or it is ambiguous."""
    key = name_key(name)
    same = [t for t in index if name_key(t) == key]
    if same:
        return (same[0], "same tool name up to case and separators") if len(same) == 1 else None
    bases = _bases(name)
    for tier in ((lambda t: name_key(t) in bases or key in _bases(t)),
                 (lambda t: base_key(t) == base_key(name))):
        found = [t for t in index if tier(t)]
        if found:
            return (found[0], "same tool name up to a server or namespace prefix") if len(found) == 1 else None
    close = unique_closest(name, list(index), 0.85)
    return (close, "the one clearly closest tool name") if close else None
