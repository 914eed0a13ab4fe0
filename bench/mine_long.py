"""Mining memory on long agent contexts: `tracemill mine` over a store whose every conversation carries a pasted
document and whose every tool result is as long as the collector keeps. Target: under 1 GB, as on `bench/mine.py`'s
store.

Real agent contexts reach 57k-128k tokens and tool results run to the collector's limit (`RESULT_LIMIT`), while
`bench/mine.py`'s store has conversations of 2.5 KB and results of 100 characters: a miner that holds a batch's
conversations or results at once passes there and runs out of memory on real traffic. This builds a SQLite store as
`bench/mine.py` does, with `--calls` calls, then puts a user message of `--context-chars` characters ahead of every
stored conversation (200,000 by default: about 50k tokens) and makes every tool result `RESULT_LIMIT` characters, and
runs `tracemill mine` on it as `bench/mine.py` does (a subprocess, its whole process tree's peak resident memory).

Run by hand, never in CI (bench/README.md, "Mine"), under the bench lock:

    flock /tmp/tracemill-bench.lock .venv/bin/python bench/mine_long.py --out bench/out/mine-long.json
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from pathlib import Path

from tracemill.collector.normalize import RESULT_LIMIT

from mine import build, loop_seconds, run_mine

MESSAGES = '"gen_ai.input.messages"'


def lengthen(path: Path, context_chars: int) -> dict[str, int]:
    """Every conversation given a first user message of `context_chars` characters, every tool result made
    RESULT_LIMIT characters; the counts changed."""
    document = json.dumps({"role": "user", "parts": [{"type": "text", "content": "doc " * (context_chars // 4)}]})
    result = ("result " * (RESULT_LIMIT // 7 + 1))[:RESULT_LIMIT]
    with sqlite3.connect(path) as db:
        # a conversation over PAYLOAD_MIN_CHARS is stored once in `payloads`, a shorter one inline in the attributes
        stored = db.execute(
            "UPDATE payloads SET body = '[' || ? || ',' || substr(body, 2), chars = chars + ? + 1 WHERE digest IN "
            f"(SELECT json_extract(attributes, '$.{MESSAGES}.\"$payload\"') FROM spans)",
            (document, len(document))).rowcount
        inline = db.execute(
            f"UPDATE spans SET attributes = json_set(attributes, '$.{MESSAGES}', "
            f"'[' || ? || ',' || substr(json_extract(attributes, '$.{MESSAGES}'), 2)) "
            f"WHERE json_type(attributes, '$.{MESSAGES}') = 'text'", (document,)).rowcount
        results = db.execute("UPDATE tool_calls SET execution_result = ? WHERE execution_result IS NOT NULL",
                             (result,)).rowcount
    return {"conversations_stored_once": stored, "conversations_inline": inline, "tool_results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=0, help="copied up to this many (0: the base corpus alone)")
    parser.add_argument("--context-chars", type=int, default=200_000)
    parser.add_argument("--episodes", type=int, default=3000, help="base corpus: episodes per profile")
    parser.add_argument("--store", type=Path, default=Path("bench/out/mine-long.db"), help="made anew")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    store = args.store.resolve()
    store.parent.mkdir(parents=True, exist_ok=True)
    for stale in (store, store.with_name(store.name + "-wal"), store.with_name(store.name + "-shm")):
        stale.unlink(missing_ok=True)
    url = f"sqlite:///{store}"
    print(f"building {args.calls} calls", file=sys.stderr)
    built = build(url, args.calls, args.episodes)
    started = time.perf_counter()
    changed = lengthen(store, args.context_chars)
    built.update(changed, lengthen_seconds=round(time.perf_counter() - started, 1), context_chars=args.context_chars,
                 result_chars=RESULT_LIMIT, store_bytes=store.stat().st_size)
    print("mining", file=sys.stderr)
    before = loop_seconds()
    mined = run_mine(url, Path("bench/out/mine-long"))
    figures = {"store": built, "mine": mined, "loop_seconds": [before, loop_seconds()]}
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
