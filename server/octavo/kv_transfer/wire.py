"""The side channel's frames: a JSON header and raw tensor bytes, length-prefixed.

One frame is a 4-byte big-endian header length, the JSON header (an object with an
``op`` and, when tensors follow, ``tensors``: each one's ``shape``, ``dtype`` and
``nbytes``), then each tensor's bytes in order. Never pickle: the peer is not trusted,
so a frame is checked before anything is allocated for it (the header's size, the
declared total, known dtypes, sizes that match their shapes) and a bad one is a
``ProtocolError`` naming what was wrong.
"""

from __future__ import annotations

import json
import math
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

HEADER_LENGTH = struct.Struct(">I")
MAX_HEADER_BYTES = 64 * 2**20  # block id lists of the longest prompts fit many times over
MAX_FRAME_BYTES = 4 * 2**30  # the tensors' declared total
CHUNK_BYTES = 4 * 2**20  # received in pieces this big at most

DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in (
        "float32",
        "float16",
        "bfloat16",
        "float64",
        "float8_e4m3fn",
        "float8_e5m2",
        "int8",
        "uint8",
        "int16",
        "int32",
        "int64",
    )
    if hasattr(torch, name)
}


class ProtocolError(Exception):
    """A frame that breaks the protocol (too big, not JSON, sizes that do not add up)."""


class ConnectionClosed(Exception):
    """The peer closed the connection between frames (a clean end, not an error)."""


@dataclass
class Frame:
    header: dict[str, Any]
    tensors: list[torch.Tensor] = field(default_factory=list)


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of ``dtype`` ("bfloat16"); ValueError for a dtype the wire lacks."""
    name = str(dtype).removeprefix("torch.")
    if DTYPES.get(name) != dtype:
        raise ValueError(f"the side channel cannot carry {dtype} tensors")
    return name


def send_frame(
    sock: socket.socket, header: dict[str, Any], tensors: Sequence[torch.Tensor] = ()
) -> None:
    """Write one frame: ``header`` (its ``tensors`` entry is filled in) and the tensors' bytes."""
    raws = [_raw_bytes(tensor) for tensor in tensors]
    header = dict(header)
    if tensors:
        header["tensors"] = [
            {"shape": list(tensor.shape), "dtype": dtype_name(tensor.dtype), "nbytes": raw.nbytes}
            for tensor, raw in zip(tensors, raws, strict=True)
        ]
    encoded = json.dumps(header, separators=(",", ":")).encode()
    sock.sendall(HEADER_LENGTH.pack(len(encoded)) + encoded)
    for raw in raws:
        if raw.nbytes:
            sock.sendall(memoryview(raw.numpy()))


def recv_frame(
    sock: socket.socket,
    max_bytes: int = MAX_FRAME_BYTES,
    max_header_bytes: int = MAX_HEADER_BYTES,
    max_tensors: int | None = None,
) -> Frame:
    """Read one frame of at most ``max_header_bytes`` of header, ``max_tensors`` tensors
    (None: any number) and ``max_bytes`` of tensor bytes; ``ConnectionClosed`` at a clean
    end, ``ProtocolError`` for a bad one (and ``OSError``/``TimeoutError`` from the socket)."""
    prefix = _recv_exactly(sock, HEADER_LENGTH.size, at_boundary=True)
    (length,) = HEADER_LENGTH.unpack(prefix)
    if length > max_header_bytes:
        raise ProtocolError(f"a frame header of {length} bytes is over {max_header_bytes}")
    header = parse_header(_recv_exactly(sock, length))
    specs = tensor_specs(header, max_bytes, max_tensors)
    tensors = [_recv_tensor(sock, shape, dtype, nbytes) for shape, dtype, nbytes in specs]
    return Frame(header, tensors)


def parse_header(data: bytes) -> dict[str, Any]:
    """The JSON object of a header, with a string ``op``."""
    try:
        header = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ProtocolError(f"the frame header is not JSON: {error}") from None
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise ProtocolError("the frame header is not a JSON object with a string 'op'")
    return header


def tensor_specs(
    header: dict[str, Any], max_bytes: int, max_tensors: int | None = None
) -> list[tuple[list[int], torch.dtype, int]]:
    """The tensors a header declares, checked: at most ``max_tensors`` of them, known
    dtypes, non-negative shapes whose sizes match ``nbytes``, and no more than
    ``max_bytes`` in all."""
    entries = header.get("tensors", [])
    if not isinstance(entries, list):
        raise ProtocolError("'tensors' is not a list")
    if max_tensors is not None and len(entries) > max_tensors:
        raise ProtocolError(f"the frame declares {len(entries)} tensors, over {max_tensors}")
    specs = [_tensor_spec(entry) for entry in entries]
    total = sum(nbytes for _, _, nbytes in specs)
    if total > max_bytes:
        raise ProtocolError(f"the frame declares {total} bytes of tensors, over {max_bytes}")
    return specs


def _tensor_spec(entry: Any) -> tuple[list[int], torch.dtype, int]:
    if not isinstance(entry, dict):
        raise ProtocolError("a tensor entry is not an object")
    shape, name, nbytes = entry.get("shape"), entry.get("dtype"), entry.get("nbytes")
    if not isinstance(shape, list) or not all(_count(size) for size in shape):
        raise ProtocolError(f"a tensor's shape {shape!r} is not a list of non-negative integers")
    if name not in DTYPES:
        raise ProtocolError(f"unknown tensor dtype {name!r}")
    dtype = DTYPES[name]
    expected = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if not _count(nbytes) or nbytes != expected:
        raise ProtocolError(f"a {name} tensor of shape {shape} is {expected} bytes, not {nbytes!r}")
    return shape, dtype, nbytes


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat uint8 CPU tensor (any dtype, bfloat16 and fp8 too)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _recv_tensor(sock: socket.socket, shape: list[int], dtype: torch.dtype, nbytes: int):
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    buffer = bytearray(nbytes)
    _recv_into(sock, memoryview(buffer))
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(shape)


def _recv_exactly(sock: socket.socket, size: int, at_boundary: bool = False) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    received = sock.recv_into(view, size) if size else 0
    if size and received == 0:
        if at_boundary:
            raise ConnectionClosed("the peer closed the connection")
        raise ProtocolError("the peer closed the connection inside a frame")
    _recv_into(sock, view[received:])
    return bytes(buffer)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    while len(view):
        received = sock.recv_into(view, min(len(view), CHUNK_BYTES))
        if received == 0:
            raise ProtocolError("the peer closed the connection inside a frame")
        view = view[received:]
