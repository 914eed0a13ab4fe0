"""Which reviser serves a request: the active version, or the canary for its share of conversations.

A conversation is named by the `X-Conversation-Id` header when the agent sends one, else by the request's `user`
field, else by the start of the conversation (its system prompt and first user turn), which every later turn of it
repeats. Its share is a hash of that name, so a conversation stays with one version for as long as the canary runs,
on every sidecar replica, and raising the canary's share keeps the conversations it already had.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tracemill.revisers import Reviser

CONVERSATION_HEADER = "x-conversation-id"


@dataclass(frozen=True, slots=True)
class Serving:
    """One reviser as served: its version's name, its role and the deployment that put it there."""

    version: str
    reviser: Reviser
    role: str = "static"  # active | canary | static (the --reviser of `tracemill serve`, nothing deployed)
    deployment_id: int | None = None
    adapter: str | None = None  # its LoRA adapter on the vLLM server, when it has one
    in_process: bool = True  # the rules: cheap enough to run on the event loop


@dataclass(frozen=True, slots=True)
class Plan:
    active: Serving
    canary: Serving | None = None
    canary_percent: float = 0.0

    def pick(self, conversation: str | None) -> Serving:
        if self.canary is None or conversation is None:
            return self.active
        return self.canary if share(conversation) < self.canary_percent else self.active

    def adapters(self) -> set[str]:
        return {s.adapter for s in (self.active, self.canary) if s is not None and s.adapter}


def share(conversation: str) -> float:
    """Where a conversation falls in [0, 100)."""
    digest = hashlib.blake2b(conversation.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 10_000 / 100


def _first(messages: Sequence[Any], role: str) -> Any:
    return next((m.get("content") for m in messages if isinstance(m, Mapping) and m.get("role") == role), None)


def conversation_of(headers: Mapping[str, str], body: Mapping[str, Any]) -> str:
    given = headers.get(CONVERSATION_HEADER)
    if given:
        return f"header:{given}"
    if isinstance(body.get("user"), str) and body["user"]:
        return f"user:{body['user']}"
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    return "start:" + orjson.dumps([_first(messages, "system"), _first(messages, "user")], default=str).decode()
