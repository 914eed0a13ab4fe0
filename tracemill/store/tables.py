"""The store's tables (SQLAlchemy 2 ORM). One schema for SQLite and PostgreSQL; Alembic migrations change it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JSONType = JSON().with_variant(JSONB(), "postgresql")
# JSON kept as it was written, key order included (PostgreSQL's `json`; JSONB sorts keys): what agents sent (spans, log
# events: a conversation can come as a map), tool schemas and calls, whose order a model was shown and is shown again in
# reviser prompts, exports and the UI
WrittenJSON = JSON()


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class SpanRow(Base):
    """A raw OTLP span, as received. Idempotent on (trace_id, span_id): exporters retry.

    A string attribute of `PAYLOAD_MIN_CHARS` or more (tool definitions, conversations) is stored once in `payloads`
    and appears in `attributes` as `{"$payload": sha256, "chars": n}` (a long conversation as the parts it was cut
    into, `{"$parts": [[sha256, chars], ...], "chars": n}`); `tracemill.store.payloads` reads it back."""

    __tablename__ = "spans"
    __table_args__ = (
        UniqueConstraint("trace_id", "span_id", name="uq_spans_trace_span"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    trace_id: Mapped[str] = mapped_column(String(32))
    span_id: Mapped[str] = mapped_column(String(16))
    parent_span_id: Mapped[str | None] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(Text)
    kind: Mapped[int] = mapped_column(Integer)
    start_time_ns: Mapped[int] = mapped_column(BigInteger)
    end_time_ns: Mapped[int] = mapped_column(BigInteger)
    status_code: Mapped[int] = mapped_column(Integer)
    status_message: Mapped[str] = mapped_column(Text)
    service_name: Mapped[str | None] = mapped_column(Text)
    scope_name: Mapped[str] = mapped_column(Text)
    attributes: Mapped[dict[str, Any]] = mapped_column(WrittenJSON)
    resource: Mapped[dict[str, Any]] = mapped_column(WrittenJSON)
    events: Mapped[list[Any]] = mapped_column(WrittenJSON)
    links: Mapped[list[Any]] = mapped_column(WrittenJSON)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class PayloadRow(Base):
    """A large attribute value, stored once however many spans carry it (agents resend the same tool definitions
    with every model call)."""

    __tablename__ = "payloads"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the UTF-8 text
    body: Mapped[str] = mapped_column(Text)
    chars: Mapped[int] = mapped_column(Integer)


class ToolsetRow(Base):
    """A distinct list of tools offered to a model, stored once (by hash)."""

    __tablename__ = "toolsets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    tools: Mapped[list[dict[str, Any]]] = mapped_column(WrittenJSON)
    tool_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ToolCallRow(Base):
    """One tool call a model emitted, verified at ingest against the tools it was offered."""

    __tablename__ = "tool_calls"
    __table_args__ = (
        UniqueConstraint("trace_id", "span_id", "call_index", name="uq_tool_calls_span_index"),
        # a call's twins in other traces, found by the writer of the next sighting (`collector.same_call`)
        Index("ix_tool_calls_tool_call_id", "tool_call_id"),
        Index("ix_tool_calls_response_id", "response_id", sqlite_where=text("response_id IS NOT NULL"),
              postgresql_where=text("response_id IS NOT NULL")),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    trace_id: Mapped[str] = mapped_column(String(32))
    span_id: Mapped[str] = mapped_column(String(16))
    call_index: Mapped[int] = mapped_column(Integer)
    tool_call_id: Mapped[str | None] = mapped_column(Text)
    # of a call written as text (no tool call id): the model response that holds it, where the span records one
    response_id: Mapped[str | None] = mapped_column(Text)
    raw: Mapped[str] = mapped_column(Text)
    name: Mapped[str | None] = mapped_column(Text)
    arguments: Mapped[dict[str, Any] | None] = mapped_column(WrittenJSON)
    toolset_id: Mapped[int | None] = mapped_column(ForeignKey("toolsets.id"))
    parsed: Mapped[bool] = mapped_column(Boolean)
    name_valid: Mapped[bool | None] = mapped_column(Boolean)  # None: the span did not say which tools were offered
    schema_valid: Mapped[bool | None] = mapped_column(Boolean)
    stage: Mapped[str | None] = mapped_column(String(16))
    violations: Mapped[list[dict[str, Any]]] = mapped_column(WrittenJSON)
    execution_status: Mapped[str | None] = mapped_column(String(16))  # success | error, None while unknown
    execution_error: Mapped[str | None] = mapped_column(Text)
    execution_result: Mapped[str | None] = mapped_column(Text)
    execution_span_id: Mapped[str | None] = mapped_column(String(16))
    model: Mapped[str | None] = mapped_column(Text)
    harness_version: Mapped[str | None] = mapped_column(Text)
    domain: Mapped[str | None] = mapped_column(String(32))
    # the service whose span holds the call (`service.name`): with the reviser sidecar in front of a model, the store
    # holds the model's answer as sent (`tracemill-serve`) and what the agent got (the agent's service)
    service_name: Mapped[str | None] = mapped_column(Text)
    repairs_id: Mapped[int | None] = mapped_column(ForeignKey("tool_calls.id"))
    start_time_ns: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ToolExecutionRow(Base):
    """A tool execution (execute_tool span, MCP tools/call, OpenInference TOOL span), kept so that a model call that
    arrives after its execution is still linked to it."""

    __tablename__ = "tool_executions"
    __table_args__ = (
        UniqueConstraint("trace_id", "span_id", name="uq_tool_executions_trace_span"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    trace_id: Mapped[str] = mapped_column(String(32))
    span_id: Mapped[str] = mapped_column(String(16))
    tool_call_id: Mapped[str | None] = mapped_column(Text)
    tool_name: Mapped[str | None] = mapped_column(Text)
    arguments: Mapped[str | None] = mapped_column(Text)
    ok: Mapped[bool] = mapped_column(Boolean)
    error: Mapped[str | None] = mapped_column(Text)
    result: Mapped[str | None] = mapped_column(Text)


class ApiKeyRow(Base):
    """A collector API key. Only its SHA-256 is kept; the key itself is shown once, when created."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


# --- the learning half of the loop: what was mined, reviewed, trained and deployed ----------------------------------

class DatasetRow(Base):
    """One `tracemill mine` export: where it is, what went in (filters, the newest call it read), and its card."""

    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    path: Mapped[str] = mapped_column(Text)  # the export folder: train.jsonl, eval.jsonl, Parquet, dataset.json
    content_hash: Mapped[str] = mapped_column(String(64))  # of the exported rows, as the card states it
    filters: Mapped[dict[str, Any]] = mapped_column(JSONType)
    last_call_id: Mapped[int | None] = mapped_column(BigInteger)  # the newest tool_calls.id read: `--since last`
    train_rows: Mapped[int] = mapped_column(Integer)
    eval_rows: Mapped[int] = mapped_column(Integer)
    card: Mapped[dict[str, Any]] = mapped_column(JSONType)  # dataset.json: counts, provenance, prompt settings, ...
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ReviewRow(Base):
    """A person's decision on one tool call (append-only audit: rows are never updated or deleted). The first decision
    on a call stands: a second one for the same call is refused by the unique key."""

    __tablename__ = "reviews"
    __table_args__ = (UniqueConstraint("call_id", name="uq_reviews_call"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    call_id: Mapped[int] = mapped_column(ForeignKey("tool_calls.id"))
    reviewer: Mapped[str] = mapped_column(Text)
    decision: Mapped[str] = mapped_column(String(16))  # approve | reject | edit (edited, then approved)
    before: Mapped[dict[str, Any] | None] = mapped_column(WrittenJSON)  # the call shown to the reviewer
    after: Mapped[dict[str, Any] | None] = mapped_column(WrittenJSON)  # the approved call (approve, edit); None: reject
    note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class FindingRow(Base):
    """What a miner agent found that rules cannot label: a hypothesis, its evidence, and what to change. Consolidated
    by `key`: the same finding seen again is merged into its row, a stale one expires."""

    __tablename__ = "findings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    hypothesis: Mapped[str] = mapped_column(Text)
    evidence: Mapped[list[Any]] = mapped_column(JSONType)  # span and trace ids
    suggestion: Mapped[str | None] = mapped_column(Text)  # a harness change (prompt, tool description)
    examples: Mapped[list[Any]] = mapped_column(JSONType)  # labelled examples
    status: Mapped[str] = mapped_column(String(16))  # open | merged | expired
    seen: Mapped[int] = mapped_column(Integer)
    first_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ModelRow(Base):
    """A trained reviser version: its base, its weights or adapter, the data and config it was trained with, and its
    training and eval figures."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)  # the version's name, e.g. reviser-0003
    base_model: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(16))  # lora | full
    path: Mapped[str] = mapped_column(Text)  # the adapter or model directory
    dataset_id: Mapped[int | None] = mapped_column(ForeignKey("datasets.id"))
    dataset_hash: Mapped[str | None] = mapped_column(String(64))
    config: Mapped[dict[str, Any]] = mapped_column(JSONType)  # the training config, prompt settings included
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONType)  # training: reward per term, KL, ...
    evaluation: Mapped[dict[str, Any]] = mapped_column(JSONType)  # `tracemill eval` figures beside `rules`
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class DeploymentRow(Base):
    """One change of what a sidecar serves (append-only: the newest row per role is what is served now). A rollback is
    a new row naming the version it goes back to."""

    __tablename__ = "deployments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id"))  # None: the rules reviser alone
    role: Mapped[str] = mapped_column(String(16))  # active | canary
    canary_percent: Mapped[float | None] = mapped_column(Float)
    action: Mapped[str] = mapped_column(String(16))  # deploy | canary | rollback | end_canary
    actor: Mapped[str] = mapped_column(Text)  # who
    justification: Mapped[dict[str, Any]] = mapped_column(JSONType)  # the eval figures that justified it
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


# --- the UI: who may sign in, and the human review queue -------------------------------------------------------------

class UserRow(Base):
    """A person who may use the UI, with one role (viewer | reviewer | admin). Only an argon2 hash of the password is
    kept; a user without one signs in through single sign-on, matched by `email`."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    role: Mapped[str] = mapped_column(String(16))
    password_hash: Mapped[str | None] = mapped_column(Text)
    email: Mapped[str | None] = mapped_column(Text, unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    disabled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SignInFailureRow(Base):
    """One failed sign-in, by the name that was tried (kept only as long as the rate limit's window needs)."""

    __tablename__ = "sign_in_failures"
    __table_args__ = (Index("ix_sign_in_failures_name_at", "name", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ReviewQueueRow(Base):
    """A call waiting for a person: in a sensitive domain, or a revision of low confidence. A call is queued once."""

    __tablename__ = "review_queue"
    __table_args__ = (UniqueConstraint("call_id", name="uq_review_queue_call"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    call_id: Mapped[int] = mapped_column(ForeignKey("tool_calls.id"))
    reason: Mapped[str] = mapped_column(String(32))  # medical | legal | ... | low_confidence
    detail: Mapped[str] = mapped_column(Text)  # which rule queued it
    queued_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ReviewClaimRow(Base):
    """A queued call a reviewer has open, reserved for them until `expires_at`."""

    __tablename__ = "review_claims"

    call_id: Mapped[int] = mapped_column(ForeignKey("tool_calls.id"), primary_key=True)
    reviewer: Mapped[str] = mapped_column(Text)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ReviewScanRow(Base):
    """How far the queue's rules (by their digest) have read `tool_calls`."""

    __tablename__ = "review_scans"

    rules: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_call_id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))
    scanned_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


# --- the retrain-and-deploy cycle ------------------------------------------------------------------------------------

class CycleRow(Base):
    """One `tracemill cycle` iteration: each step it reached and its figures (`tracemill.cycle.record` reads it)."""

    __tablename__ = "cycles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16))  # running | done | interrupted | failed
    step: Mapped[str] = mapped_column(String(16))  # the step it is at, or ended at: mine | decide | train | ...
    holder: Mapped[str] = mapped_column(Text)  # host:pid of the process that ran it
    forced: Mapped[bool] = mapped_column(Boolean, default=False)  # --force: trained whatever the decision said
    since_call_id: Mapped[int | None] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))  # read after this
    last_call_id: Mapped[int | None] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))  # newest read
    new_calls: Mapped[int] = mapped_column(Integer, default=0)
    new_failures: Mapped[int] = mapped_column(Integer, default=0)
    dataset_id: Mapped[int | None] = mapped_column(ForeignKey("datasets.id"))  # what it mined
    decision: Mapped[str | None] = mapped_column(String(16))  # train | harness | wait
    reason: Mapped[str | None] = mapped_column(Text)  # the decision in a sentence, with the rates
    harness_rates: Mapped[list[Any]] = mapped_column(JSONType, default=list)  # failure rate per harness version
    top_modes: Mapped[list[Any]] = mapped_column(JSONType, default=list)  # the failure modes to fix first
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id"))  # the candidate it trained
    baseline: Mapped[str | None] = mapped_column(Text)  # the active version it was measured against
    figures: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)  # per suite: candidate and baseline
    gate: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)  # passed, and each check with its figures
    deployed: Mapped[bool] = mapped_column(Boolean, default=False)
    deployment_id: Mapped[int | None] = mapped_column(ForeignKey("deployments.id"))
    error: Mapped[str | None] = mapped_column(Text)  # why it failed or was interrupted


class LockRow(Base):
    """A named lock held by one process until `expires_at`; the holder renews it while it works, so a lock whose
    holder was killed expires instead of blocking forever."""

    __tablename__ = "locks"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(Text)  # host:pid:token
    acquired_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class LogEventRow(Base):
    """A GenAI event (`gen_ai.*`) sent as an OTLP log record, kept with the span it belongs to: instrumentations such
    as OpenTelemetry's openai-v2 put the model's messages there rather than on the span. Whichever of the span and its
    events arrives second makes the span's tool_calls rows (`collector.joins`). Idempotent on the record's content."""

    __tablename__ = "log_events"
    __table_args__ = (
        UniqueConstraint("trace_id", "span_id", "digest", name="uq_log_events_trace_span_digest"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    trace_id: Mapped[str] = mapped_column(String(32))
    span_id: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(String(64))  # sha256 of the record as decoded: a re-sent record is one row
    event_name: Mapped[str] = mapped_column(Text)
    time_ns: Mapped[int] = mapped_column(BigInteger)
    attributes: Mapped[dict[str, Any]] = mapped_column(WrittenJSON)
    body: Mapped[Any] = mapped_column(WrittenJSON, nullable=True)  # the record's body (AnyValue) decoded
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
