"""After training: `tracemill eval` of the new model beside `rules`, on the dataset's eval split and the built-in
suites, and the version's row in `models`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from tracemill.evaluation import Report, evaluate
from tracemill.revisers import Reviser, rules_reviser
from tracemill.suites import Case, load_suite, read_cases
from tracemill.trainer.run import EVAL, Plan


def eval_suites(plan: Plan) -> dict[str, list[Case]]:
    """The cases the new model is measured on: `eval` (the dataset's eval split, whole) and each configured suite
    (its first `eval.limit` cases)."""
    suites: dict[str, list[Case]] = {}
    if plan.rows.eval_path is not None:
        suites["eval"] = read_cases(plan.rows.eval_path)
    for name in plan.config.eval.suites:
        cases = load_suite(name, plan.config.grpo.seed)
        suites[name] = cases[: plan.config.eval.limit] if plan.config.eval.limit else cases
    return suites


def write_report(folder: Path, report: Report) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_bytes(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2))
    (folder / "table.md").write_text(report.markdown() + "\n")
    (folder / "results.jsonl").write_bytes(b"".join(orjson.dumps(asdict(r)) + b"\n" for r in report.results))


def figures(report: Report) -> dict[str, Any]:
    """A report as the registry keeps it: `{"cases", "broken_cases", REVISER: {metric: value}}`."""
    shown = report.to_dict()
    out: dict[str, Any] = {"cases": shown["cases"], "broken_cases": shown["broken_cases"]}
    for metrics in shown["revisers"]:
        out[metrics.pop("reviser")] = metrics
    return out


def evaluate_model(plan: Plan, model: Reviser, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Each suite's figures, `model` beside `rules`; the whole reports are written to OUTPUT/eval/SUITE/."""
    evaluation: dict[str, Any] = {}
    for suite, cases in eval_suites(plan).items():
        report = evaluate(cases, {"rules": rules_reviser, "model": model}, suite)
        write_report(plan.out / EVAL / suite, report)
        evaluation[suite] = figures(report)
        echo(f"\n{suite}: {report.cases} cases, {report.broken} not valid as sent\n{report.markdown()}")
    return evaluation


def register(plan: Plan, model_dir: Path, metrics: dict[str, Any], evaluation: dict[str, Any],
             db_url: str | None) -> Any:
    """The version's row in `models`. Its base is the model training started from (the warm-up's, when there was
    one): what a LoRA adapter applies to."""
    from tracemill.store.cli import open_store
    from tracemill.trainer.registry import NewModel, register_model

    config = plan.config.model_dump(mode="json")
    config["prompt_settings"] = plan.rows.prompt_settings.to_dict()
    engine = open_store(db_url or plan.config.output.database_url)
    try:
        return register_model(engine, NewModel(plan.start_model, plan.config.model.kind, str(model_dir),
                                               plan.rows.content_hash, config, metrics, evaluation,
                                               plan.config.output.name))
    finally:
        engine.dispose()
