"""The deterministic reviser."""

from __future__ import annotations

import re

_SEPARATORS = re.compile(r"[\s_\-.:/]+")


def name_key(name: str) -> str:
    """A name with case and separators (`_ - . : /`, spaces) folded away: `Get-Weather` and `get_weather` share a key."""
    return _SEPARATORS.sub("", name).casefold()
