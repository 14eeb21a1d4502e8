"""The engine settings of `InferenceService` (`spec.engine`), declared once.

Each `EngineField` is a property of `spec.engine` and the `octavo serve` flag it becomes.
Everything else is derived from ENGINE_FIELDS: the CRD schema (engine_schema.py), the
parsed settings with their defaults (`Engine` in spec.py) and the Deployment's flags
(builders/engine_flags.py). tests/test_operator_engine_flags.py checks the flags, defaults
and allowed values against the server's own options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .schema import Schema, integer, obj, rule, string

DTYPES = ("auto", "float32", "bfloat16", "float16")
BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
# octavo.config.ATTENTION_BACKENDS (checked by a test)
ATTENTION_BACKENDS = ("auto", "TRITON_ATTN", "FLASH_ATTN", "CPU_ATTN")
# octavo.config.QUANTIZATION_NAMES (checked by a test)
QUANTIZATION_METHODS = ("int8", "fp8", "gptq", "awq", "gguf")
# octavo.spec_decode.config.METHODS and MAX_SPECULATIVE_TOKENS (checked by a test)
SPECULATIVE_METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class EngineField:
    """One `spec.engine` property: its camelCase `name`, the `flag` that receives it, its
    OpenAPI `schema` (type, description, bounds, default), whether it is passed only to
    replicas with GPUs, and the only values allowed (checked by a CEL rule) if restricted."""

    name: str
    flag: str
    schema: Schema
    needs_gpu: bool = False
    allowed: tuple[Any, ...] = ()

    @property
    def default(self) -> Any:
        """The value when the spec leaves the field out; None: the flag is not passed."""
        return self.schema.get("default")

    @property
    def is_switch(self) -> bool:
        """A boolean, passed as `--flag` or `--no-flag`."""
        return self.schema["type"] == "boolean"

    @property
    def choices(self) -> tuple[Any, ...]:
        """The values the apiserver accepts, from the schema's enum or the CEL rule."""
        return tuple(self.schema.get("enum", ())) or self.allowed


def speculative_config_schema() -> Schema:
    """vLLM's `--speculative-config` keys, checked by the apiserver, passed on as JSON."""
    count = MAX_SPECULATIVE_TOKENS
    return obj(
        "speculative decoding, in vLLM's spelling: {method: ngram, num_speculative_tokens, "
        "prompt_lookup_max, prompt_lookup_min} copies proposals from the prompt and output; "
        "{model, num_speculative_tokens} runs a small draft model of the same tokenizer (a "
        "folder in the container or hf://ORG/NAME)",
        {
            "method": string(
                "ngram or draft_model (the default with a model)", enum=list(SPECULATIVE_METHODS)
            ),
            "model": string("the draft model", maxLength=512),
            "num_speculative_tokens": integer(1, count, description="tokens proposed a step"),
            "prompt_lookup_max": integer(1, 64, description="ngram: longest suffix matched"),
            "prompt_lookup_min": integer(1, 64, description="ngram: shortest suffix matched"),
        },
        required=["num_speculative_tokens"],
        **{
            "x-kubernetes-validations": [
                rule(
                    "has(self.method) || has(self.model)", "give a method (ngram) or a draft model"
                ),
                rule(
                    "!has(self.method) || self.method != 'draft_model' || has(self.model)",
                    "method draft_model needs a model",
                ),
                rule(
                    "!has(self.method) || self.method != 'ngram' || !has(self.model)",
                    "method ngram takes no model",
                ),
                rule(
                    "!has(self.prompt_lookup_min) || !has(self.prompt_lookup_max) || "
                    "self.prompt_lookup_min <= self.prompt_lookup_max",
                    "prompt_lookup_min must not exceed prompt_lookup_max",
                ),
            ]
        },
    )


ENGINE_FIELDS: tuple[EngineField, ...] = (
    EngineField(
        "maxModelLen",
        "--max-model-len",
        integer(16, 1048576, description="context length in tokens"),
    ),
    EngineField(
        "maxNumSeqs",
        "--max-num-seqs",
        integer(1, 4096, description="most sequences running at once"),
    ),
    EngineField(
        "maxNumBatchedTokens",
        "--max-num-batched-tokens",
        integer(16, 1048576, description="token budget of a step"),
    ),
    EngineField(
        "blockSize",
        "--block-size",
        integer(description="KV cache block size in tokens", default=16),
        allowed=BLOCK_SIZES,
    ),
    EngineField(
        "attentionBackend",
        "--attention-backend",
        string(
            "attention kernels on GPU replicas: auto (TRITON_ATTN), or FLASH_ATTN (torch's "
            "FlashAttention-2 over the paged cache; needs blockSize 256, Ampere or newer, a "
            "bf16 or fp16 model); CPU replicas run their native kernels. Unset: auto",
            enum=list(ATTENTION_BACKENDS),
        ),
        needs_gpu=True,
    ),
    EngineField(
        "gpuMemoryUtilization",
        "--gpu-memory-utilization",
        {
            "type": "number",
            "description": "fraction of GPU memory for weights and KV cache, in (0, 1]",
            "default": 0.9,
        },
        needs_gpu=True,
    ),
    EngineField(
        "enablePrefixCaching",
        "--enable-prefix-caching",
        {
            "type": "boolean",
            "description": "reuse KV blocks of shared prompt prefixes",
            "default": True,
        },
    ),
    EngineField(
        "dtype",
        "--dtype",
        string("weights and activations", enum=list(DTYPES), default="auto"),
    ),
    EngineField(
        "tensorParallelSize",
        "--tensor-parallel-size",
        integer(
            1,
            64,
            description="ranks each layer is split over; the model's attention heads, "
            "intermediate size and vocabulary must divide by it, and its KV heads divide "
            "by it or it by them (checked by the server at start-up)",
            default=1,
        ),
    ),
    EngineField(
        "quantization",
        "--quantization",
        string(
            "how the decoder's linear layers are quantized: int8 (W8A8) and fp8 quantize a "
            "float checkpoint at load; gptq and awq checkpoints are detected without it; gguf "
            "keeps a .gguf file's blocks (the embedded model's Q4_1 when no model is set); "
            "unset serves the checkpoint as it is",
            enum=list(QUANTIZATION_METHODS),
        ),
    ),
    EngineField(
        "pipelineParallelSize",
        "--pipeline-parallel-size",
        integer(
            1,
            64,
            description="stages the layers are split over; a replica uses "
            "tensorParallelSize × pipelineParallelSize GPUs",
            default=1,
        ),
    ),
    EngineField(
        "runner",
        "--runner",
        string(
            "generate (text; such a model also answers /v1/embeddings from its final hidden "
            "states), pooling (embedding models, encoders and classifiers: /v1/embeddings, "
            "/v1/score, /v1/rerank, /classify and /pooling; no LM head) or auto (pooling for "
            "a sentence-transformers folder, an encoder such as BERT or XLM-R, a "
            "*ForSequenceClassification or a *Model architecture, else generate); unset: auto",
            enum=["auto", "generate", "pooling"],
        ),
    ),
    EngineField("speculativeConfig", "--speculative-config", speculative_config_schema()),
    EngineField(
        "maxLoras",
        "--max-loras",
        integer(1, 256, description="most LoRA adapters in one step (with spec.adapters)"),
    ),
    EngineField(
        "maxLoraRank",
        "--max-lora-rank",
        integer(1, 512, description="largest LoRA rank an adapter may have (server: 16)"),
    ),
    EngineField(
        "maxCpuLoras",
        "--max-cpu-loras",
        integer(1, 4096, description="LoRA adapters kept in CPU memory (server: maxLoras)"),
    ),
    EngineField(
        "logFormat",
        "--log-format",
        string(
            "text (human-readable lines) or json (one JSON object per line with the request "
            "fields, for a log pipeline); unset: text",
            enum=["text", "json"],
        ),
    ),
)


def engine_field(name: str) -> EngineField:
    """The field called NAME (a KeyError for a name that is not declared)."""
    return {f.name: f for f in ENGINE_FIELDS}[name]


def engine_settings(engine_spec: dict[str, Any]) -> dict[str, Any]:
    """{name: value} for every field of a `spec.engine`, defaults filled in (None where a
    field has no default): the apiserver applies them too, but objects written before a
    default existed, and unit tests, are parsed without."""
    return {f.name: engine_spec.get(f.name, f.default) for f in ENGINE_FIELDS}
