"""Engine configuration: argument names follow vLLM's so users can carry flags over."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DEFAULT_CPU_KV_CACHE_MEMORY = 2 * 1024**3  # bytes of KV cache on CPU when none is given
SUPPORTED_BLOCK_SIZES = (8, 16, 32)
SUPPORTED_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class EngineArgs:
    """Everything that shapes an engine. Unset values are resolved from the model/device."""

    model: str | None = None
    revision: str | None = None  # hub models: branch, tag or commit (default main)
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        _require(self.max_num_seqs >= 1, "max_num_seqs must be >= 1")
        _require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1")
        _require(
            self.block_size in SUPPORTED_BLOCK_SIZES,
            f"block_size must be one of {SUPPORTED_BLOCK_SIZES}, got {self.block_size}",
        )
        _require(
            0.0 < self.gpu_memory_utilization <= 1.0,
            "gpu_memory_utilization must be in (0, 1]",
        )
        _require(
            self.dtype in SUPPORTED_DTYPES,
            f"dtype must be one of {SUPPORTED_DTYPES}, got {self.dtype!r}",
        )
        _require(
            self.kv_cache_memory is None or self.kv_cache_memory > 0,
            "kv_cache_memory must be a positive number of bytes",
        )
        _require(
            self.max_model_len is None or self.max_model_len >= 1,
            "max_model_len must be >= 1",
        )
        _require(
            self.tensor_parallel_size == 1,
            "tensor_parallel_size > 1 is not supported yet; use 1",
        )

    @classmethod
    def from_kwargs(cls, model: str | None, kwargs: dict) -> EngineArgs:
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        _require(not unknown, f"unknown engine arguments: {', '.join(unknown)}")
        return cls(model=model, **kwargs)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
