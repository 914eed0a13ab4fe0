"""What `tracemill simulate` injected, read back from the `tracemill.sim.*` attributes of the stored spans: the ground
truth the miner's export is checked against."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from tracemill.store.engine import make_engine
from tracemill.store.payloads import resolve
from tracemill.store.tables import SpanRow


@dataclass(frozen=True)
class Output:
    """One simulated model output (a chat span) and what was done to it."""

    trace_id: str
    span_id: str
    faults: tuple[str, ...]
    intended: tuple[dict[str, Any], ...]
    upstream_error: bool  # one of its calls was correct and failed anyway when it ran

    @property
    def injected(self) -> bool:
        return bool(self.faults) or self.upstream_error


def simulated_outputs(db_url: str) -> dict[tuple[str, str], Output]:
    engine = make_engine(db_url)
    chats: dict[tuple[str, str], dict[str, Any]] = {}
    upstream: set[tuple[str, str]] = set()  # (trace, tool call id) of correct calls that failed when run
    ids: dict[tuple[str, str], tuple[str, str]] = {}  # (trace, tool call id) -> its chat span
    with engine.connect() as conn:
        for trace_id, span_id, attributes in conn.execute(select(SpanRow.trace_id, SpanRow.span_id,
                                                                 SpanRow.attributes)):
            attrs = resolve(conn, attributes)
            if "tracemill.sim.intended" in attrs:
                chats[(trace_id, span_id)] = attrs
                for message in json.loads(attrs.get("gen_ai.output.messages") or "[]"):
                    for part in message.get("parts", []):
                        if part.get("type") == "tool_call" and part.get("id"):
                            ids[(trace_id, part["id"])] = (trace_id, span_id)
            elif attrs.get("tracemill.sim.execution") == "upstream_error":
                upstream.add((trace_id, attrs["gen_ai.tool.call.id"]))
    engine.dispose()
    erred = {ids[k] for k in upstream if k in ids}
    return {key: Output(key[0], key[1], tuple(a["tracemill.sim.faults"]),
                        tuple(json.loads(a["tracemill.sim.intended"])), key in erred)
            for key, a in chats.items()}
