"""`tracemill mine`: failed calls (and a share of valid ones) as RL prompt rows, split by trace, deduplicated, written
as JSON Lines and Parquet with a card, and recorded in `datasets`.

The store is read trace by trace (`queries.iter_traces`, pages of whole traces), so that an agent's repair is found
beside the call it repaired and memory stays flat however large the store. Everything the export holds follows from
the store and the options: rows come in trace order, valid calls are sampled by a hash of their id, traces go to eval
by a hash of their id (or, with `eval_after`, by when they began), and of two rows with the same prompt only the first
is kept. The export is written to a hidden folder beside `out` and renamed into place at the end: a run stopped
half-way leaves no export, and an earlier export at `out` stays whole until the new one replaces it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, and_, bindparam, insert, select, tuple_, update

from tracemill.miner.conversation import span_messages
from tracemill.miner.parquet import ParquetSplit
from tracemill.miner.repairs import find_repairs
from tracemill.miner.rows import build_row, reference_for
from tracemill.reviser_prompt import PromptSettings
from tracemill.store.payloads import resolve
from tracemill.store.queries import CallFilter, StoredCall, count_calls, iter_traces, toolsets
from tracemill.store.tables import DatasetRow, ReviewRow, SpanRow, ToolCallRow, utcnow
from tracemill.tools import Tool, tool_index

FORMAT = "tracemill.rl-prompts/1"
SPLITS = ("train", "eval")


class ExportError(ValueError):
    """An output folder that cannot take an export; the message names it."""


@dataclass(frozen=True, slots=True)
class MineOptions:
    where: CallFilter = CallFilter()
    since_last: bool = False  # only calls stored after the newest call the previous export read
    eval_after: datetime | None = None  # eval: the traces whose first call was made at or after this; else a hash
    eval_share: float = 0.1
    valid_share: float = 0.2  # of the rows: valid calls, labelled as such
    seed: int = 0
    prompt: PromptSettings = PromptSettings()
    batch: int = 5000


@dataclass(slots=True)
class ExportResult:
    path: Path
    dataset_id: int
    card: dict[str, Any]

    @property
    def rows(self) -> dict[str, int]:
        return {s: self.card["splits"][s]["rows"] for s in SPLITS}


def _unit(seed: int, what: str, key: str) -> float:
    """A number in [0, 1) fixed by the seed and the key: sampling and splitting that re-runs alike."""
    digest = hashlib.blake2b(f"{seed}:{what}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def is_export(path: Path) -> bool:
    try:
        return orjson.loads((path / "dataset.json").read_bytes()).get("format") == FORMAT
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return False


def check_out(out: Path) -> None:
    """Refuse an output folder that holds anything but an earlier export (it would be replaced)."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not is_export(out):
        raise ExportError(f"{out} exists and is not a Tracemill export (no dataset.json of format {FORMAT}); "
                          "choose another --out")


@dataclass(slots=True)
class _Split:
    name: str
    folder: Path
    jsonl: Any = None
    parquet: ParquetSplit | None = None
    digest: Any = field(default_factory=hashlib.sha256)
    rows: int = 0
    counts: dict[str, Counter[str]] = field(default_factory=lambda: {
        k: Counter() for k in ("failure_class", "provenance", "model", "harness_version")})

    def open(self) -> None:
        self.jsonl = open(self.folder / f"{self.name}.jsonl", "wb")
        self.parquet = ParquetSplit(self.folder / f"{self.name}.parquet")

    def add(self, row: dict[str, Any]) -> None:
        line = orjson.dumps(row) + b"\n"
        self.jsonl.write(line)
        self.digest.update(line)
        assert self.parquet is not None
        self.parquet.add(row)
        self.rows += 1
        for key, counter in self.counts.items():
            counter["none" if row[key] is None else str(row[key])] += 1

    def close(self) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
        if self.parquet is not None:
            self.parquet.close()

    def summary(self) -> dict[str, Any]:
        return {"rows": self.rows, "sha256": self.digest.hexdigest(),
                **{k: dict(sorted(c.items())) for k, c in self.counts.items()}}


class _Tools:
    """Tool indexes by toolset id, read once each."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.indexes: dict[int, dict[str, Tool]] = {}

    def for_calls(self, calls: Iterable[StoredCall]) -> dict[int, dict[str, Tool]]:
        wanted = {c.toolset_id for c in calls if c.toolset_id is not None} - set(self.indexes)
        if wanted:
            with self.engine.connect() as conn:
                for toolset_id, tools in toolsets(conn, wanted).items():
                    self.indexes[toolset_id] = tool_index(tools)
        return self.indexes


def _contexts(engine: Engine, calls: list[StoredCall]) -> dict[tuple[str, str], list[Any]]:
    keys = sorted({(c.trace_id, c.span_id) for c in calls})
    found: dict[tuple[str, str], list[Any]] = {}
    with engine.connect() as conn:
        for start in range(0, len(keys), 500):
            chunk = keys[start:start + 500]
            rows = conn.execute(select(SpanRow.trace_id, SpanRow.span_id, SpanRow.attributes)
                                .where(tuple_(SpanRow.trace_id, SpanRow.span_id).in_(chunk))).all()
            for row in rows:
                attributes = row.attributes if isinstance(row.attributes, dict) else {}
                found[(row.trace_id, row.span_id)] = span_messages(resolve(conn, attributes))
    return found


def _reviews(engine: Engine, ids: list[int]) -> dict[int, Any]:
    if not ids:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(select(ReviewRow.call_id, ReviewRow.after).where(
            ReviewRow.call_id.in_(ids), ReviewRow.decision.in_(("approve", "edit")))).all()
    return {row.call_id: row.after for row in rows}


def _valid_rate(engine: Engine, where: CallFilter, share: float) -> float:
    """The share of valid calls to sample so that they make `share` of the rows."""
    if share <= 0:
        return 0.0
    with engine.connect() as conn:
        failed = count_calls(conn, replace(where, failed=True))
        valid = count_calls(conn, replace(where, failed=False))
    if share >= 1 or valid == 0:
        return 1.0
    return min(1.0, share / (1 - share) * failed / valid)


def _normalised(prompt: list[dict[str, str]]) -> bytes:
    text = "\x1e".join(f"{m['role']}\x1f{m['content']}" for m in prompt)
    return hashlib.blake2b(re.sub(r"\s+", " ", text).strip().encode(), digest_size=16).digest()


def previous_call_id(engine: Engine) -> int | None:
    """The newest call the last export read (`--since last`); None when there was none."""
    with engine.connect() as conn:
        row = conn.execute(select(DatasetRow.last_call_id).order_by(DatasetRow.id.desc()).limit(1)).first()
    return row.last_call_id if row is not None else None


def mine(engine: Engine, out: Path, options: MineOptions = MineOptions(),
         progress: Callable[[int], None] | None = None) -> ExportResult:
    """Export the calls `options` select to `out` (see the module docstring); `progress` gets the calls read."""
    out = out.resolve()
    check_out(out)
    where = options.where
    since_id = previous_call_id(engine) if options.since_last else None
    if since_id is not None:
        where = replace(where, after_id=max(since_id, where.after_id or 0))
    valid_rate = _valid_rate(engine, where, options.valid_share)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        card = _write(engine, work, where, options, valid_rate, progress)
        card["name"] = out.name
        card["filters"] = {**where.to_dict(), "since_last": options.since_last}
        card["last_call_id"] = card["last_call_id"] or since_id
        (work / "dataset.json").write_bytes(orjson.dumps(card, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        _replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    dataset_id = _record(engine, out, card)
    return ExportResult(out, dataset_id, card)


def _replace(work: Path, out: Path) -> None:
    if not out.exists():
        os.replace(work, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, old / "export")
    os.replace(work, out)
    shutil.rmtree(old, ignore_errors=True)


def _write(engine: Engine, work: Path, where: CallFilter, options: MineOptions, valid_rate: float,
           progress: Callable[[int], None] | None) -> dict[str, Any]:
    splits = {name: _Split(name, work) for name in SPLITS}
    for split in splits.values():
        split.open()
    tools = _Tools(engine)
    seen: set[bytes] = set()
    stats: Counter[str] = Counter()
    last_id: int | None = None
    links: dict[int, int] = {}
    try:
        for traces in iter_traces(engine, where, options.batch):
            calls = [c for trace in traces for c in trace]
            stats["calls_read"] += len(calls)
            last_id = max([last_id or 0, *(c.id for c in calls)])
            indexes = tools.for_calls(calls)
            chosen: list[tuple[str, StoredCall, tuple[StoredCall, ...] | None]] = []
            for trace in traces:
                repairs = find_repairs(trace, indexes)
                split = "eval" if _in_eval(trace, options) else "train"
                for call in trace:
                    if call.toolset_id not in indexes:
                        stats["no_tools_known"] += 1
                        continue
                    repair = repairs.get(call.id)
                    if repair is not None:
                        links.update((c.id, call.id) for c in repair.calls)
                    if call.failed or _unit(options.seed, "valid", str(call.id)) < valid_rate:
                        chosen.append((split, call, repair.calls if repair is not None else None))
            contexts = _contexts(engine, [c for _, c, _ in chosen])
            reviews = _reviews(engine, [c.id for _, c, _ in chosen if c.failed])
            for split, call, repair in chosen:
                context = contexts.get((call.trace_id, call.span_id), [])
                index = indexes[call.toolset_id]  # type: ignore[index]
                reference = reference_for(call, index, context, reviews.get(call.id), repair)
                row = build_row(call, index, context, options.prompt, reference)
                digest = _normalised(row["prompt"])
                if digest in seen:
                    stats["duplicates_dropped"] += 1
                    continue
                seen.add(digest)
                splits[split].add(row)
            if progress is not None:
                progress(len(calls))
    finally:
        for split in splits.values():
            split.close()
    _link_repairs(engine, links)
    summaries = {name: split.summary() for name, split in splits.items()}
    content = hashlib.sha256("".join(f"{n}:{summaries[n]['sha256']}\n" for n in SPLITS).encode()).hexdigest()
    return {
        "format": FORMAT, "name": "", "created_at": datetime.now(UTC).isoformat(), "content_hash": content,
        "splits": summaries, "counts": _totals(summaries), "last_call_id": last_id,
        "split": {"by": "trace", "eval_after": options.eval_after.isoformat() if options.eval_after else None,
                  "eval_share": None if options.eval_after else options.eval_share, "seed": options.seed},
        "valid_share": options.valid_share, "valid_sample_rate": valid_rate, "repairs_linked": len(links),
        "prompt_settings": options.prompt.to_dict(), "calls_read": stats["calls_read"],
        "duplicates_dropped": stats["duplicates_dropped"], "no_tools_known": stats["no_tools_known"],
        "files": [f"{s}.{ext}" for s in SPLITS for ext in ("jsonl", "parquet")],
    }


def _in_eval(trace: list[StoredCall], options: MineOptions) -> bool:
    if options.eval_after is not None:
        after = options.eval_after if options.eval_after.tzinfo else options.eval_after.replace(tzinfo=UTC)
        return min(c.start_time_ns for c in trace) >= after.timestamp() * 1e9
    return _unit(options.seed, "split", trace[0].trace_id) < options.eval_share


def _totals(summaries: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {"rows": sum(s["rows"] for s in summaries.values())}
    for key in ("failure_class", "provenance", "model", "harness_version"):
        merged: Counter[str] = Counter()
        for s in summaries.values():
            merged.update(s[key])
        totals[key] = dict(sorted(merged.items()))
    return totals


def _writing(engine: Engine) -> Any:
    from contextlib import nullcontext

    from tracemill.store.sqlite_writer import WriteLock, database_path

    path = database_path(engine.url.render_as_string(hide_password=False))
    return WriteLock(path).held() if path is not None else nullcontext()


def _link_repairs(engine: Engine, links: dict[int, int]) -> None:
    """`tool_calls.repairs_id` of each repair found: the (latest) failed call it repaired."""
    if not links:
        return
    statement = (update(ToolCallRow).where(and_(ToolCallRow.id == bindparam("r"), ToolCallRow.repairs_id.is_(None)))
                 .values(repairs_id=bindparam("f")))
    items = sorted(links.items())
    with _writing(engine):
        for start in range(0, len(items), 5000):
            with engine.begin() as conn:
                conn.execute(statement, [{"r": r, "f": f} for r, f in items[start:start + 5000]])


def _record(engine: Engine, out: Path, card: dict[str, Any]) -> int:
    row = {"name": out.name, "path": str(out), "content_hash": card["content_hash"], "filters": card["filters"],
           "last_call_id": card["last_call_id"], "train_rows": card["splits"]["train"]["rows"],
           "eval_rows": card["splits"]["eval"]["rows"], "card": card, "created_at": utcnow()}
    with _writing(engine), engine.begin() as conn:
        inserted = conn.execute(insert(DatasetRow).values(**row).returning(DatasetRow.id)).scalar_one()
        return int(inserted)
