"""A vLLM server's LoRA adapters, loaded and unloaded at run time.

vLLM exposes `POST /v1/load_lora_adapter` (`{"lora_name", "lora_path"}`) and `POST /v1/unload_lora_adapter`
(`{"lora_name"}`) only when started with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=true`; a loaded adapter
is listed by `GET /v1/models` and addressed as a request's `model`. Each version gets its own name (and its own path):
reloading a name in place would keep the prefix cache of the weights it replaced.
"""

from __future__ import annotations

import httpx

from tracemill.serving.deployments import Version

PREFIX = "tracemill-"


class AdapterError(RuntimeError):
    """vLLM refused or did not answer; the message says what was asked, of whom, and what came back."""


def adapter_name(version: Version) -> str:
    return f"{PREFIX}{version.name}"


class Adapters:
    """The adapters of one vLLM server (its OpenAI base URL, `.../v1`)."""

    def __init__(self, base_url: str, client: httpx.AsyncClient) -> None:
        self.base_url = base_url.rstrip("/")
        self.client = client

    async def _post(self, path: str, body: dict[str, str]) -> httpx.Response:
        url = f"{self.base_url}/{path}"
        try:
            response = await self.client.post(url, json=body, timeout=120)
        except httpx.HTTPError as exc:
            raise AdapterError(f"{url}: {type(exc).__name__}: {exc}") from None
        if response.status_code in (404, 405) and response.text.replace(" ", "") in ('{"detail":"NotFound"}',
                                                                               '{"detail":"MethodNotAllowed"}'):
            raise AdapterError(f"{url}: 404 — start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=true")
        return response

    async def loaded(self) -> set[str]:
        url = f"{self.base_url}/models"
        try:
            response = await self.client.get(url, timeout=30)
            response.raise_for_status()
            return {m["id"] for m in response.json().get("data", []) if isinstance(m, dict) and "id" in m}
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise AdapterError(f"{url}: cannot list the models ({exc})") from None

    async def load(self, version: Version) -> str:
        """Load a version's adapter unless the server has it already; its name."""
        name = adapter_name(version)
        if version.kind != "lora":
            raise AdapterError(f"{version.name} is a {version.kind or 'non-LoRA'} model: only LoRA adapters can be "
                               "loaded into a running vLLM (serve it on its own and use --reviser endpoint:URL)")
        if name in await self.loaded():
            return name
        response = await self._post("load_lora_adapter", {"lora_name": name, "lora_path": version.path})
        if response.status_code != 200:
            raise AdapterError(f"loading {name} from {version.path}: {response.status_code} {response.text[:300]}")
        return name

    async def unload(self, name: str) -> None:
        response = await self._post("unload_lora_adapter", {"lora_name": name})
        if response.status_code not in (200, 404):  # 404: already gone
            raise AdapterError(f"unloading {name}: {response.status_code} {response.text[:300]}")
