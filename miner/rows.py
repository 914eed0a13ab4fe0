"""One RL prompt row (DESIGN.md, "RL prompt rows") from one stored call: the prompt the reviser sees
(`tracemill.reviser_prompt.build_prompt`), the call's verdict, and its reference with the reference's provenance.

References, best first: `gold` (a reviewer approved or edited the call: the review's `after`), `silver` (the agent's
own later repair in the same trace, `tracemill.miner.repairs`), `bronze` (the deterministic reviser made the output
valid). A failed call may have none: GRPO learns from the verifier alone. A valid row's reference is the call as sent
(a reviser must return it unchanged), with no provenance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import orjson

from tracemill.miner.conversation import Conversation
from tracemill.miner.failures import failure_key
from tracemill.reader import Reading
from tracemill.repair import revise
from tracemill.reviser_prompt import ReviserPrompt
from tracemill.store.queries import StoredCall
from tracemill.tools import Tool
from tracemill.verify import ToolCall, parse_call

COLUMNS = ("id", "prompt", "raw", "tools", "context", "reference", "provenance", "valid", "failure_class", "stage",
           "violations", "model", "harness_version", "domain", "trace_id", "call_id", "created_at")


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def review_calls(after: Any) -> list[dict[str, Any]] | None:
    """A review's approved call(s) as `{"name", "arguments"}` dicts; None when they cannot be read as calls."""
    items = after if isinstance(after, list) else [after]
    calls = [parse_call(item) for item in items if item is not None]
    if not calls or not all(isinstance(c, ToolCall) for c in calls):
        return None
    return [c.to_dict() for c in calls if isinstance(c, ToolCall)]


@dataclass(frozen=True, slots=True)
class Reference:
    calls: list[dict[str, Any]]
    provenance: str | None  # gold | silver | bronze; None for a valid row's own call


def reference_for(call: StoredCall, index: Mapping[str, Tool], context: Sequence[Any],
                  review: Any | None, repair: Sequence[StoredCall] | None,
                  reading: Reading | None = None) -> Reference | None:
    if not call.failed:
        return Reference([{"name": call.name, "arguments": call.arguments}], None)
    if review is not None and (approved := review_calls(review)) is not None:
        return Reference(approved, "gold")
    if repair:
        return Reference([{"name": c.name, "arguments": c.arguments} for c in repair], "silver")
    if call.stage is None:  # valid as sent and failed when it ran: the rules have nothing to fix
        return None
    revision = revise(call.raw, index, list(context), reading)
    if revision.ok and revision.changed:
        return Reference([c.to_dict() for c in revision.calls], "bronze")
    return None


def build_row(call: StoredCall, prompt: ReviserPrompt, context: Conversation,
              reference: Reference | None) -> dict[str, Any]:
    """`prompt`: `build_prompt`'s for the call, with the settings the export records."""
    key = failure_key(call.name, call.stage, call.violations, call.execution_status, call.execution_error)
    return {
        "id": str(call.id),
        "prompt": prompt.to_list(),
        "raw": call.raw,
        "tools": prompt.tools_json,
        "context": context.to_json(),
        "reference": _json(reference.calls) if reference is not None else None,
        "provenance": reference.provenance if reference is not None else None,
        "valid": key is None,
        "failure_class": key.failure_class if key is not None else "valid",
        "stage": key.stage if key is not None else None,
        "violations": _json(call.violations),
        "model": call.model,
        "harness_version": call.harness_version,
        "domain": call.domain,
        "trace_id": call.trace_id,
        "call_id": call.id,
        "created_at": (call.created_at if call.created_at.tzinfo else call.created_at.replace(tzinfo=UTC)).isoformat(),
    }
