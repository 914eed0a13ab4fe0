"""The one settings object. `TRACEMILL_*` environment variables or a TOML file (`TRACEMILL_CONFIG`) set it."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource


def _default_database_url() -> str:
    return f"sqlite:///{Path('tracemill.db').resolve()}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRACEMILL_", extra="ignore")

    config: Path | None = Field(default=None, description="TOML file with these settings")
    database_url: str = Field(default_factory=_default_database_url)

    collector_host: str = "127.0.0.1"
    collector_port: int = 4318
    collector_workers: int = Field(default_factory=lambda: min(os.cpu_count() or 1, 8), ge=1,
                                   description="collector ingest processes (default: one per core, up to 8)")
    max_body_bytes: int = Field(default=32 * 1024 * 1024, description="requests larger than this get 413")
    max_attribute_bytes: int = Field(default=4 * 1024 * 1024, description="one attribute value larger than this is rejected")
    ingest_queue_spans: int = Field(default=10_000,
                                    description="spans being read, decoded or written before 503")
    max_inflight_bytes: int = Field(default=16 * 1024 * 1024,
                                    description="request bodies being read at once before 503")
    retry_after_seconds: int = 1

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
