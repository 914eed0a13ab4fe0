"""Instructions an ingest process executes per span (decode, extract and verify, commit), counted by valgrind:
`bench/ingest_cpu.py`'s work, but a count that other work on the machine does not move, so that commits can be
compared on a shared one.

Each target runs this checkout's `bench/ingest_cpu.py` (so its `Bodies`: the same workload for every target) under
`valgrind --tool=cachegrind --cache-sim=no`, twice: with `--requests N` and `--requests 2N` after the same warmup.
What both runs share (start-up, imports, migrations, building the bodies, the warmup, exit) cancels out of the
difference, which is what N requests cost. Run by hand (see bench/README.md, "Ingest"):

    .venv/bin/python bench/ingest_instructions.py --target base=/work/wt/base/.venv/bin/python \\
        --target main=.venv/bin/python --out bench/results/ingest_instructions.json

A target is LABEL=PYTHON (the collector that virtual environment imports) or LABEL=PYTHON@CHECKOUT (that
checkout's collector, imported ahead of the environment's own, with the environment's packages).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
REPEATABLE = 0.005  # two repeats of one target further apart than this (relative) are reported as not repeatable


@dataclass(frozen=True)
class Target:
    label: str
    python: str
    checkout: Path | None  # imported ahead of the environment's own collector (PYTHONPATH), when given


def parse_target(text: str) -> Target:
    label, sep, rest = text.partition("=")
    if not sep or not label or not rest:
        raise argparse.ArgumentTypeError(f"expected LABEL=PYTHON[@CHECKOUT], got {text!r}")
    python, _, checkout = rest.partition("@")
    return Target(label, python, Path(checkout).resolve() if checkout else None)


def import_tree(checkout: Path, into: Path) -> Path:
    """A directory which, first on PYTHONPATH, makes `import tracemill` (and its subpackages) load `checkout`'s code:
    the package layout of its pyproject.toml (`tracemill.collector` is `collector/`, ...), made of symbolic links."""
    mapping = tomllib.loads((checkout / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = into / "tracemill"
    root.mkdir(parents=True)
    for entry in (checkout / mapping["tracemill"]).iterdir():
        (root / entry.name).symlink_to(entry)
    for name, source in sorted(mapping.items(), key=lambda item: item[0].count(".")):
        place = into.joinpath(*name.split("."))
        if not place.exists():  # a subpackage inside a linked one (ui/pages in ui) is there already
            place.symlink_to(checkout / source)
    return into


def count(target: Target, tree: Path | None, warmup: int, requests: int, spans: int, workdir: Path,
          keep: Path | None) -> dict:
    """Instructions of one valgrind run of bench/ingest_cpu.py, and the tracemill it imported."""
    out = (keep or workdir) / f"cachegrind.{target.label}.{requests}.{time.monotonic_ns()}"
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
    if tree is not None:
        env["PYTHONPATH"] = f"{tree}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(tree)
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
           f"--log-file={out}.log", target.python, str(BENCH / "ingest_cpu.py"), "--warmup", str(warmup),
           "--requests", str(requests), "--spans-per-request", str(spans)]
    started = time.monotonic()
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if run.returncode:
        raise SystemExit(f"{target.label}: {' '.join(cmd)} failed ({run.returncode}):\n{run.stderr[-3000:]}")
    summary = re.search(r"^summary:\s+(\d+)", out.read_text(), re.MULTILINE)
    if summary is None:
        raise SystemExit(f"{target.label}: no summary line in {out}")
    imported = re.search(r"^tracemill from (\S+), collector from (\S+)", run.stdout, re.MULTILINE)
    if imported is None:
        raise SystemExit(f"{target.label}: bench/ingest_cpu.py did not say which tracemill it imported")
    Path(f"{out}.log").unlink()
    if keep is None:
        out.unlink()
    return {"requests": requests, "instructions": int(summary.group(1)), "tracemill": imported.group(1),
            "collector": imported.group(2), "wall_s": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=parse_target, action="append", required=True,
                        help="LABEL=PYTHON or LABEL=PYTHON@CHECKOUT (repeat; the first is what the others are "
                             "compared with)")
    parser.add_argument("--requests", type=int, default=40, help="N: the runs ingest N and 2N requests (default 40)")
    parser.add_argument("--warmup", type=int, default=10, help="requests ingested first by both runs (default 10)")
    parser.add_argument("--spans-per-request", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2, help="difference measured this many times (default 2)")
    parser.add_argument("--jobs", type=int, default=2, help="valgrind runs at once (default 2; counts do not move)")
    parser.add_argument("--out", type=Path, help="write the figures here (JSON)")
    parser.add_argument("--keep", type=Path, help="keep valgrind's per-function counts in this directory: "
                                                  "`cg_diff` of a target's N and 2N files is what N requests cost")
    args = parser.parse_args()

    per_span = args.requests * args.spans_per_request
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-instructions-") as tmp:
        workdir = Path(tmp)
        trees = {t.label: import_tree(t.checkout, workdir / f"tree-{t.label}") if t.checkout else None
                 for t in args.target}
        runs = [(t, n) for _ in range(args.repeats) for t in args.target for n in (args.requests, 2 * args.requests)]
        with ThreadPoolExecutor(args.jobs) as pool:
            counted = list(pool.map(lambda tn: count(tn[0], trees[tn[0].label], args.warmup, tn[1],
                                                     args.spans_per_request, workdir, args.keep), runs))
    results: dict[str, dict] = {}
    for index, target in enumerate(args.target):
        mine = [c for (t, _), c in zip(runs, counted, strict=True) if t is target]
        pairs = list(zip(mine[::2], mine[1::2], strict=True))
        figures = [(long["instructions"] - short["instructions"]) / per_span for short, long in pairs]
        spread = (max(figures) - min(figures)) / min(figures)
        results[target.label] = {
            "python": target.python, "checkout": str(target.checkout) if target.checkout else None,
            "tracemill": mine[0]["tracemill"], "collector": mine[0]["collector"],
            "commit": subprocess.run(["git", "-C", mine[0]["collector"], "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True, check=False).stdout.strip(),
            "instructions_per_span": [round(f) for f in figures], "median": round(statistics.median(figures)),
            "repeat_spread": round(spread, 5), "runs": mine}
        if any(c["collector"] != mine[0]["collector"] for c in mine):
            raise SystemExit(f"{target.label}: its runs imported different collectors")
        line = (f"{target.label:>12}: {statistics.median(figures):,.0f} instructions a span "
                f"(repeats {', '.join(f'{f:,.0f}' for f in figures)}; spread {100 * spread:.2f} %)")
        if index:
            first = results[args.target[0].label]["median"]
            results[target.label]["vs_first"] = round(statistics.median(figures) / first - 1, 4)
            line += f", {100 * (statistics.median(figures) / first - 1):+.1f} % against {args.target[0].label}"
        if spread > REPEATABLE:
            line += "  NOT REPEATABLE"
        print(line)
        print(f"{'':>14}tracemill from {mine[0]['tracemill']}", file=sys.stderr)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "method": "valgrind --tool=cachegrind --cache-sim=no; (Ir of --requests 2N) - (Ir of --requests N), "
                      "same --warmup, divided by N x spans per request",
            "requests": args.requests, "warmup": args.warmup, "spans_per_request": args.spans_per_request,
            "bench_commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True, check=False).stdout.strip(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
