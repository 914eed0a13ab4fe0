"""Mining memory on long agent contexts: `tracemill mine` over a store whose every conversation carries a pasted
document and whose every tool result is as long as the collector keeps. Target: under 1 GB, as on `bench/mine.py`'s
store.

Real agent contexts reach 57k-128k tokens and tool results run to the collector's limit (`RESULT_LIMIT`), while
`bench/mine.py`'s store has conversations of 2.5 KB and results of 100 characters: a miner that holds a batch's
conversations or results at once passes there and runs out of memory on real traffic. This builds a store anew as
`bench/mine.py` does (SQLite, or PostgreSQL: `--db`), with `--calls` calls, then puts a user message of
`--context-chars` characters ahead of every stored conversation (200,000 by default: about 50k tokens) and makes every
tool result `RESULT_LIMIT` characters, and runs `tracemill mine` on it as `bench/mine.py` does (a subprocess, its whole
process tree's peak resident memory).

Run by hand, never in CI (bench/README.md, "Mine"), under the bench lock:

    flock /tmp/tracemill-bench.lock .venv/bin/python bench/mine_long.py --db sqlite:///$PWD/bench/out/mine-long.db \\
        --db postgresql+psycopg://postgres@127.0.0.1:5432/tracemill_bench_mine_long --out bench/out/mine-long.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from tracemill.collector.normalize import RESULT_LIMIT
from tracemill.store.engine import make_engine

from mine import build, machine, measure, save

MESSAGES = "gen_ai.input.messages"

# a conversation over PAYLOAD_MIN_CHARS is stored once in `payloads` (a long one in parts: the document goes at the
# start of the first), a shorter one inline in the span's attributes
_LENGTHEN = {
    "sqlite": (
        ("UPDATE payloads SET body = '[' || :document || ',' || substr(body, 2), chars = chars + :chars + 1 "
         f"WHERE digest IN (SELECT json_extract(attributes, '$.\"{MESSAGES}\".\"$payload\"') FROM spans "
         f"UNION SELECT json_extract(attributes, '$.\"{MESSAGES}\".\"$parts\"[0][0]') FROM spans)"),
        (f"UPDATE spans SET attributes = json_set(attributes, '$.\"{MESSAGES}\"', "
         f"'[' || :document || ',' || substr(json_extract(attributes, '$.\"{MESSAGES}\"'), 2)) "
         f"WHERE json_type(attributes, '$.\"{MESSAGES}\"') = 'text'"),
    ),
    "postgresql": (
        ("UPDATE payloads SET body = '[' || :document || ',' || substr(body, 2), chars = chars + :chars + 1 "
         f"WHERE digest IN (SELECT attributes -> '{MESSAGES}' ->> '$payload' FROM spans "
         f"UNION SELECT attributes -> '{MESSAGES}' -> '$parts' -> 0 ->> 0 FROM spans)"),
        (f"UPDATE spans SET attributes = jsonb_set(attributes::jsonb, '{{{MESSAGES}}}', "
         f"to_jsonb('[' || :document || ',' || substr(attributes ->> '{MESSAGES}', 2)))::json "
         f"WHERE json_typeof(attributes -> '{MESSAGES}') = 'string'"),
    ),
}


def fresh(url: str) -> None:
    """The store at `url` removed, so that `build` makes it anew."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = Path(parsed.database or "")
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            stale.unlink(missing_ok=True)
        return
    admin = make_engine(parsed.set(database="postgres").render_as_string(hide_password=False))
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{parsed.database}" WITH (FORCE)'))
    admin.dispose()


def lengthen(url: str, context_chars: int) -> dict[str, int]:
    """Every conversation given a first user message of `context_chars` characters, every tool result made
    RESULT_LIMIT characters; the counts changed."""
    document = json.dumps({"role": "user", "parts": [{"type": "text", "content": "doc " * (context_chars // 4)}]})
    result = ("result " * (RESULT_LIMIT // 7 + 1))[:RESULT_LIMIT]
    engine = make_engine(url)
    stored_once, inline = _LENGTHEN[engine.dialect.name]
    with engine.begin() as conn:
        changed = {
            "conversations_stored_once": conn.execute(text(stored_once),
                                                      {"document": document, "chars": len(document)}).rowcount,
            "conversations_inline": conn.execute(text(inline), {"document": document}).rowcount,
            "tool_results": conn.execute(text("UPDATE tool_calls SET execution_result = :result "
                                              "WHERE execution_result IS NOT NULL"), {"result": result}).rowcount,
        }
    engine.dispose()
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", action="append", help="a store URL, made anew (repeat for several; default: "
                        "sqlite:///bench/out/mine-long.db)")
    parser.add_argument("--calls", type=int, default=0, help="copied up to this many (0: the base corpus alone)")
    parser.add_argument("--context-chars", type=int, default=200_000)
    parser.add_argument("--episodes", type=int, default=3000, help="base corpus: episodes per profile")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    figures: dict[str, Any] = {"machine": machine(), "stores": {}}
    for url in args.db or [f"sqlite:///{Path('bench/out/mine-long.db').resolve()}"]:
        backend = make_url(url).get_backend_name()
        fresh(url)
        print(f"{backend}: building", file=sys.stderr)
        built = build(url, args.calls, args.episodes)
        started = time.perf_counter()
        built.update(lengthen(url, args.context_chars), lengthen_seconds=round(time.perf_counter() - started, 1),
                     context_chars=args.context_chars, result_chars=RESULT_LIMIT)
        figures["stores"][backend] = measure(url, built, Path(f"bench/out/mine-long-{backend}"))
    save(figures, args.out)


if __name__ == "__main__":
    main()
