"""The `tracemill` command. Each subcommand lives in the module that owns it and is imported only when it runs, so
`tracemill --help` stays fast."""

from __future__ import annotations

import importlib

import click

# name -> (module, attribute, one-line help). Add a line here to add a command.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "collector": ("tracemill.collector.cli", "collector", "Run the OTLP collector (HTTP and gRPC)."),
    "cycle": ("tracemill.cycle.cli", "cycle", "Mine, decide, train, gate and deploy a reviser: one cycle, or --every."),
    "db": ("tracemill.store.cli", "db", "Manage the store's schema."),
    "demo": ("tracemill.demo.cli", "demo", "The whole loop on SQLite and the CPU: sidecar, mine, train, deploy."),
    "deploy": ("tracemill.serving.cli", "deploy", "Make a reviser version active, or a canary."),
    "deployments": ("tracemill.serving.cli", "deployments", "What the sidecars serve, and the deployment history."),
    "eval": ("tracemill.evaluation", "eval_command", "Measure tool-call revisers on BFCL, MCP-Bench or your cases."),
    "failures": ("tracemill.miner.cli", "failures",
                 "Failure modes: failed calls clustered by tool, stage and violation."),
    "keys": ("tracemill.collector.cli", "keys", "Manage collector API keys."),
    "mine": ("tracemill.miner.cli", "mine", "Export failed and repaired tool calls as RL prompts."),
    "mine-agent": ("tracemill.miner.cli", "mine_agent", "An LLM agent that finds what rules miss, read-only."),
    "models": ("tracemill.trainer.registry", "models", "The trained reviser versions (tracemill models list)."),
    "rollback": ("tracemill.serving.cli", "rollback", "End the canary, or go back to the previous reviser version."),
    "serve": ("tracemill.serving.cli", "serve", "Run the reviser sidecar in front of any OpenAI-compatible server."),
    "simulate": ("tracemill.simulate.cli", "simulate", "Send a realistic agent workload to a collector."),
    "stats": ("tracemill.stats", "stats", "MCP-Bench's rule-based metrics over the stored tool calls."),
    "tiny-model": ("tracemill.trainer.tiny", "tiny_model", "Build a tiny reviser model from a config (tests, demo)."),
    "train": ("tracemill.trainer.cli", "train_command", "Train a reviser with GRPO on a mined dataset (train extra)."),
    "ui": ("tracemill.ui.cli", "ui", "Run the UI: traces, failure modes, review queue, datasets, models."),
    "users": ("tracemill.ui.cli", "users", "Manage who may sign in to the UI."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[cmd_name]
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx: click.Context):  # type: ignore[no-untyped-def]
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except Exception as exc:
            message = _user_error(exc)
            if message is None:
                raise
            raise click.ClickException(message) from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _user_error(exc: Exception) -> str | None:
    """A one-line message for the errors a user causes (a bad URL, a database that is not there), else None."""
    from tracemill.store.engine import StoreURLError

    if isinstance(exc, StoreURLError):
        return str(exc)
    if type(exc).__module__.startswith("sqlalchemy") and type(exc).__name__ == "OperationalError":
        detail = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        return f"cannot use the database: {detail}"
    return None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tracemill")
def main() -> None:
    """Tracemill: store, verify, mine and repair the tool calls of production LLM agents."""


if __name__ == "__main__":
    main()
