"""A request's ``kv_transfer_params`` (vLLM's NixlConnector contract), checked and typed.

The llm-d routing sidecar sends a prefill engine ``{"do_remote_decode": true, ...}`` with
``max_tokens: 1``; the prefill engine keeps the prompt's blocks and answers the dict made by
``answer_params``; the sidecar hands that dict, untouched, to a decode engine, which reads
it back with ``parse_kv_transfer_params``. Keys are vLLM's, plus two of ours that the router
passes through opaquely: ``remote_lease_generation`` (which grant of the blocks a read names,
so a decode engine never reads blocks freed and reused since) and ``remote_num_tokens``
(prompt tokens the blocks hold). Unknown keys are ignored, as vLLM does (newer versions add
keys); a wrong type or a missing field is a ``ValueError`` (HTTP 400).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUIRED_REMOTE_FIELDS = (
    "remote_engine_id",
    "remote_request_id",
    "remote_block_ids",
    "remote_host",
    "remote_port",
    "remote_lease_generation",
    "remote_num_tokens",
)


@dataclass(frozen=True)
class RemotePrefill:
    """Where a decode request's prompt blocks wait: a prefill engine's held lease."""

    engine_id: str
    request_id: str
    block_ids: tuple[int, ...]
    host: str
    port: int
    tp_size: int
    generation: int
    num_tokens: int


@dataclass(frozen=True)
class TransferRequest:
    """What a request's ``kv_transfer_params`` ask: keep the prompt's blocks for a remote
    decode (``do_remote_decode``), or pull them from a remote prefill (``remote``)."""

    do_remote_decode: bool = False
    remote: RemotePrefill | None = None


def parse_kv_transfer_params(raw: Any) -> TransferRequest | None:
    """The checked request, or None when it asks for no transfer (absent, or both flags false)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"kv_transfer_params must be a JSON object, got {_kind(raw)}")
    decode = _flag(raw, "do_remote_decode")
    prefill = _flag(raw, "do_remote_prefill")
    if decode and prefill:
        raise ValueError(
            "kv_transfer_params: do_remote_decode and do_remote_prefill cannot both be true"
        )
    if decode:
        return TransferRequest(do_remote_decode=True)
    if prefill:
        return TransferRequest(remote=_remote_prefill(raw))
    return None


def answer_params(
    remote: RemotePrefill,
) -> dict[str, Any]:
    """The dict a prefill engine answers (``kv_transfer_params`` of its response)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": remote.engine_id,
        "remote_request_id": remote.request_id,
        "remote_block_ids": list(remote.block_ids),
        "remote_host": remote.host,
        "remote_port": remote.port,
        "tp_size": remote.tp_size,
        "remote_lease_generation": remote.generation,
        "remote_num_tokens": remote.num_tokens,
    }


def _remote_prefill(raw: dict[str, Any]) -> RemotePrefill:
    missing = [name for name in REQUIRED_REMOTE_FIELDS if raw.get(name) is None]
    if missing:
        raise ValueError(
            f"kv_transfer_params: do_remote_prefill needs {missing} (pass the prefill "
            "server's kv_transfer_params answer unchanged)"
        )
    port = _int(raw, "remote_port", 1)
    if port > 65535:
        raise ValueError(f"kv_transfer_params: remote_port must be at most 65535, got {port}")
    return RemotePrefill(
        engine_id=_text(raw, "remote_engine_id"),
        request_id=_text(raw, "remote_request_id"),
        block_ids=_block_ids(raw["remote_block_ids"]),
        host=_text(raw, "remote_host"),
        port=port,
        tp_size=_int(raw, "tp_size", 1) if raw.get("tp_size") is not None else 1,
        generation=_int(raw, "remote_lease_generation", 0),
        num_tokens=_int(raw, "remote_num_tokens", 1),
    )


def _block_ids(value: Any) -> tuple[int, ...]:
    """A flat list of block ids, or vLLM's per-KV-cache-group form with one group."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]
    if not isinstance(value, list) or not value:
        raise ValueError(
            f"kv_transfer_params: remote_block_ids must be a non-empty list of block ids, "
            f"got {_kind(value)}"
        )
    if not all(_is_int(block) and block >= 0 for block in value):
        raise ValueError("kv_transfer_params: remote_block_ids must hold non-negative integers")
    return tuple(value)


def _flag(raw: dict[str, Any], name: str) -> bool:
    value = raw.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"kv_transfer_params: {name} must be true or false, got {_kind(value)}")
    return value


def _text(raw: dict[str, Any], name: str) -> str:
    value = raw[name]
    if not isinstance(value, str) or not value:
        raise ValueError(f"kv_transfer_params: {name} must be a non-empty string")
    return value


def _int(raw: dict[str, Any], name: str, least: int) -> int:
    value = raw[name]
    if not _is_int(value) or value < least:
        raise ValueError(f"kv_transfer_params: {name} must be an integer >= {least}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def wants_transfer(params: Any) -> bool:
    """Do a request's sampling params ask for a KV transfer either way?"""
    return parse_kv_transfer_params(getattr(params, "kv_transfer_params", None)) is not None
