"""One ready server pod's LoRA adapter routes, over HTTP to its pod IP.

``GET /v1/models`` says which adapters the pod serves (the cards with a ``parent``) and
from where (``root``); ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``
change that. The API key of ``spec.apiKeySecretRef`` is sent when the service has one.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

LIST_TIMEOUT_SECONDS = 5
LOAD_TIMEOUT_SECONDS = 120  # an hf:// adapter is downloaded by the pod while we wait


class PodUnreachable(Exception):
    """The pod's server did not answer (not listening yet, gone, or a network policy)."""


@dataclass(frozen=True)
class PodAdapterAPI:
    base_url: str  # http://POD_IP:PORT
    api_key: str | None = None

    def served(self) -> dict[str, str]:
        """Adapter name -> the path it was loaded from."""
        listing = self._call("GET", "/v1/models", None, LIST_TIMEOUT_SECONDS)
        return {
            card["id"]: card.get("root", "")
            for card in listing.get("data", [])
            if card.get("parent")
        }

    def load(self, name: str, path: str) -> None:
        body = {"lora_name": name, "lora_path": path}
        self._call("POST", "/v1/load_lora_adapter", body, LOAD_TIMEOUT_SECONDS)

    def unload(self, name: str) -> None:
        self._call("POST", "/v1/unload_lora_adapter", {"lora_name": name}, LIST_TIMEOUT_SECONDS)

    def _call(self, method: str, path: str, body: Any, timeout: float) -> dict[str, Any]:
        """The JSON answer (text answers give {}); ValueError with the server's message on
        a 4xx/5xx, PodUnreachable when nothing answered."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return _json_or_empty(response.read())
        except urllib.error.HTTPError as error:
            raise ValueError(_error_message(error)) from None
        except (urllib.error.URLError, OSError) as error:
            raise PodUnreachable(str(getattr(error, "reason", error))) from None


def _json_or_empty(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _error_message(error: urllib.error.HTTPError) -> str:
    body = _json_or_empty(error.read())
    message = (body.get("error") or {}).get("message") if body else None
    return f"HTTP {error.code}: {message or error.reason}"
