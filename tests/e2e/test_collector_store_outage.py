"""A store that cannot be reached is a reason to retry, never to drop: every endpoint answers 503 with Retry-After
while PostgreSQL refuses connections, and the collector stores again once it is back."""

from __future__ import annotations

import json

import httpx
import pytest
from google.rpc.status_pb2 import Status
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tracemill.store.engine import make_engine

from support import export_request, make_span, refused_connections

pytestmark = pytest.mark.postgres

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}


def json_body(span_id: str) -> bytes:
    span = {"traceId": "ee" * 16, "spanId": span_id, "name": "chat", "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000000100000000"}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


def stored_spans(db_url: str) -> int:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        count = conn.execute(text("select count(*) from spans")).scalar_one()
    engine.dispose()
    return count


def test_store_outage_answers_503_with_retry_after_on_every_endpoint(postgres_url: str, postgres_admin,
                                                                   start_collector) -> None:  # type: ignore[no-untyped-def]
    collector = start_collector(postgres_url, TRACEMILL_RETRY_AFTER_SECONDS="3")
    traces = f"{collector.url}/v1/traces"

    # From its first request on: the collector has not read its API keys yet.
    with refused_connections(postgres_admin, make_url(postgres_url).database):
        protobuf = httpx.post(traces, content=export_request([make_span("dd" * 16, "02" * 8, "chat", {})]),
                              headers=PROTOBUF)
        assert protobuf.status_code == 503, protobuf.text
        assert protobuf.headers["Retry-After"] == "3"
        assert "store" in Status.FromString(protobuf.content).message

        answer = httpx.post(traces, content=json_body("03" * 8), headers=JSON)
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "3"
        assert "store" in answer.json()["message"]

        health = httpx.get(f"{collector.url}/healthz")
        assert health.status_code == 503 and health.headers["Retry-After"] == "3"
        assert "store" in health.json()["status"]

    # Back: the next requests are stored (the first ones may still find connections the outage closed).
    for attempt in range(20):
        answer = httpx.post(traces, content=json_body("04" * 8), headers=JSON)
        if answer.status_code == 200:
            break
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "3"
    assert answer.status_code == 200
    assert httpx.get(f"{collector.url}/healthz").status_code == 200
    assert stored_spans(postgres_url) == 1
