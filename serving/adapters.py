"""A vLLM server's LoRA adapters, loaded and unloaded at run time.

vLLM exposes `POST /v1/load_lora_adapter` (`{"lora_name", "lora_path"}`) and `POST /v1/unload_lora_adapter`
(`{"lora_name"}`) only when started with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=true`; a loaded adapter
is listed by `GET /v1/models` and addressed as a request's `model`. Each version gets its own name (and its own path):
reloading a name in place would keep the prefix cache of the weights it replaced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from tracemill.serving.deployments import Version

PREFIX = "tracemill-"


class AdapterError(RuntimeError):
    """vLLM refused or did not answer; the message says what was asked, of whom, and what came back."""


def adapter_name(version: Version) -> str:
    return f"{PREFIX}{version.name}"


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    text: str


class Adapters:
    """The adapters of one vLLM server (its OpenAI base URL, `.../v1`)."""

    def __init__(self, base_url: str, session: Callable[[], aiohttp.ClientSession]) -> None:
        self.base_url = base_url.rstrip("/")
        self._session = session

    async def _ask(self, method: str, path: str, body: dict[str, str] | None = None) -> _Reply:
        url = f"{self.base_url}/{path}"
        try:
            async with self._session().request(method, url, json=body,
                                               timeout=aiohttp.ClientTimeout(total=120)) as response:
                return _Reply(response.status, await response.text())
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise AdapterError(f"{url}: {type(exc).__name__}: {exc}") from None

    async def _post(self, path: str, body: dict[str, str]) -> _Reply:
        reply = await self._ask("POST", path, body)
        if reply.status in (404, 405) and reply.text.replace(" ", "") in ('{"detail":"NotFound"}',
                                                                          '{"detail":"MethodNotAllowed"}'):
            raise AdapterError(f"{self.base_url}/{path}: {reply.status} — start vLLM with --enable-lora and "
                               "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true")
        return reply

    async def _models(self) -> list[dict[str, Any]]:
        """`GET /v1/models`: the base model (its `root`: the weights vLLM loaded) and the adapters (with a `parent`)."""
        reply = await self._ask("GET", "models")
        try:
            models = orjson.loads(reply.text)["data"] if reply.status == 200 else None
            return [m for m in models if isinstance(m, dict) and "id" in m]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise AdapterError(f"{self.base_url}/models: cannot list the models ({reply.status}: {exc})") from None

    async def load(self, version: Version) -> str:
        """Load a version's adapter unless the server has it already; its name. An adapter is loaded only into the
        base model it was trained on (`Version.base_model`, a warm-up's checkpoint where the run had one): on
        other weights of the same shape vLLM would load it and serve what no evaluation measured."""
        name = adapter_name(version)
        if version.kind != "lora":
            raise AdapterError(f"{version.name} is a {version.kind or 'non-LoRA'} model: only LoRA adapters can be "
                               "loaded into a running vLLM (serve it on its own and use --reviser endpoint:URL)")
        models = await self._models()
        if name in {m["id"] for m in models}:
            return name
        bases = [m for m in models if not m.get("parent")]
        if version.base_model and bases and not any(version.base_model in (m["id"], m.get("root")) for m in bases):
            served = ", ".join(str(m.get("root") or m["id"]) for m in bases)
            raise AdapterError(f"{version.name} is a LoRA adapter of {version.base_model}, and the vLLM at "
                               f"{self.base_url} serves {served}: start vLLM with that base model (the same weights "
                               f"under another name: add --served-model-name '{version.base_model}')")
        reply = await self._post("load_lora_adapter", {"lora_name": name, "lora_path": version.path})
        if reply.status != 200:
            raise AdapterError(f"loading {name} from {version.path}: {reply.status} {reply.text[:300]}")
        return name

    async def unload(self, name: str) -> None:
        reply = await self._post("unload_lora_adapter", {"lora_name": name})
        if reply.status not in (200, 404):  # 404: already gone
            raise AdapterError(f"unloading {name}: {reply.status} {reply.text[:300]}")
