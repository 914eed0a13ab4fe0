"""The one settings object. `TRACEMILL_*` environment variables or a TOML file (`TRACEMILL_CONFIG`) set it."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource


def _default_database_url() -> str:
    return f"sqlite:///{Path('tracemill.db').resolve()}"


class ReviewRule(BaseModel):
    """Tool calls this rule sends to human review, as `domain`: a tool on one of `servers` (the part before ':' of
    `Server:tool`, any case), whose name matches one of `tools` (shell patterns, any case), or whose description holds
    one of `words` (whole words, any case)."""

    domain: str
    servers: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    words: list[str] = Field(default_factory=list)


GUESSING_STEPS = ["tool_name", "param_name", "default", "drop_unknown", "model"]


class LowConfidenceRule(BaseModel):
    """Revisions this rule sends to human review as `low_confidence`: those that took any of `steps` (the reviser's
    step kinds, `tracemill.revision.StepKind`). `source` says whose revisions: `sidecar`, what `tracemill serve`
    revised and served (read from its traced `revise` spans; the call the upstream sent is queued, with the sidecar's
    call as the proposal), of a reviser version matching one of `versions` (shell patterns; `rules` is the rules
    reviser alone); or `rules`, a stored failed call that the deterministic reviser would fix only so."""

    source: Literal["sidecar", "rules"]
    steps: list[str] = Field(default_factory=lambda: list(GUESSING_STEPS))
    versions: list[str] = Field(default_factory=lambda: ["*"])

    @field_validator("steps")
    @classmethod
    def _known_steps(cls, steps: list[str]) -> list[str]:
        from tracemill.revision import StepKind

        known = {k.value for k in StepKind}
        if unknown := [s for s in steps if s not in known]:
            raise ValueError(f"no reviser step {', '.join(map(repr, unknown))}; steps: {', '.join(sorted(known))}")
        return steps


def _default_review_rules() -> list[ReviewRule]:
    return [ReviewRule(domain="medical", servers=["Medical Calculator", "BioMCP"]),
            ReviewRule(domain="legal", tools=["*lawsuit*", "*court*", "*legal*"], words=["lawsuit", "court", "legal"])]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRACEMILL_", extra="ignore")

    config: Path | None = Field(default=None, description="TOML file with these settings")
    database_url: str = Field(default_factory=_default_database_url)

    collector_host: str = "127.0.0.1"
    collector_port: int = 4318
    collector_grpc_port: int = Field(default=4317, ge=0, description="OTLP/gRPC port; 0: no gRPC receiver")
    collector_workers: int = Field(default_factory=lambda: min(os.cpu_count() or 1, 8), ge=1,
                                   description="collector ingest processes (default: one per core, up to 8)")
    max_body_bytes: int = Field(default=32 * 1024 * 1024, description="requests larger than this get 413")
    max_attribute_bytes: int = Field(default=4 * 1024 * 1024,
                                     description="one attribute value larger than this is rejected")
    ingest_queue_spans: int = Field(default=10_000,
                                    description="spans being read, decoded or written before 503")
    max_inflight_bytes: int = Field(default=16 * 1024 * 1024,
                                    description="bytes of request bodies being read at once before 503")
    body_read_timeout_seconds: float = Field(default=30.0, gt=0,
                                             description="a request body not received within this gets 408")
    retry_after_seconds: int = 1
    miner_api_key: str | None = Field(default=None, description="API key of the endpoint `mine-agent` talks to")

    # The UI (`tracemill ui`): where it listens, who may sign in, and what waits for human review.
    ui_host: str = Field(default="127.0.0.1", description="interface `tracemill ui` listens on")
    ui_port: int = 8501
    review_domains: list[str] = Field(default_factory=lambda: ["medical", "legal"],
                                      description="domains whose calls wait for review and are masked for viewers")
    review_rules: list[ReviewRule] = Field(default_factory=_default_review_rules)
    review_low_confidence: list[LowConfidenceRule] = Field(
        default_factory=lambda: [LowConfidenceRule(source="rules"), LowConfidenceRule(source="sidecar")],
        description="revisions that wait for review: by the sidecar, or by the rules on a stored failed call")
    review_reservation_seconds: int = Field(default=600, ge=30, description="how long an opened item stays reserved")
    sign_in_attempts: int = Field(default=5, ge=1, description="failed sign-ins for one name before a pause")
    sign_in_window_seconds: int = Field(default=900, ge=1, description="the pause, and the window failures count in")

    # The sidecar (`tracemill serve`).
    serve_host: str = "127.0.0.1"
    serve_port: int = 8000
    serve_timeout_seconds: float = Field(default=300.0, gt=0, description="how long the sidecar waits for the "
                                         "upstream (to connect: 10 s at most; then between bytes)")
    serve_poll_seconds: float = Field(default=1.0, gt=0, description="how often `tracemill serve` looks for a new "
                                      "deployment")
    serve_collector: str | None = Field(default=None, description="the collector `tracemill serve` traces to")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml_file = os.environ.get("TRACEMILL_CONFIG")
        if toml_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
