"""Engine configuration: argument names follow vLLM's so users can carry flags over.

``EngineArgs`` is the one declaration of the engine's settings: each field's metadata
(``engine_arg``) gives its ``octavo serve`` flag, help text and value type, from which
the command line, the ``OCTAVO_*`` environment variables and ``--help`` are derived.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from octavo.arg_types import (
    non_negative_int,
    one_of,
    parse_bool,
    parse_size,
    port_number,
    positive_float,
    positive_int,
)
from octavo.compilation.config import (
    LEVELS,
    CompilationConfig,
    parse_compilation_config,
    with_flags,
)
from octavo.distributed.node_layout import (
    DEFAULT_MASTER_ADDR,
    DEFAULT_MASTER_PORT,
    DEFAULT_NODE_JOIN_TIMEOUT,
    NodeLayout,
)
from octavo.engine.batch_defaults import (
    DEFAULT_MAX_NUM_SEQS,
    PERFORMANCE_MODES,
    default_max_num_seqs,
    default_token_budget,
)
from octavo.executor.step_timeout import DEFAULT_EXECUTE_MODEL_TIMEOUT
from octavo.kv_cache.block_hash import DEFAULT_HASH_ALGO, HASH_ALGOS
from octavo.kv_events.config import KVEventsConfig
from octavo.kv_transfer.config import KVTransferConfig
from octavo.lora_request import LoRAModulePath, parse_lora_module
from octavo.model_executor.hf_overrides import parse_hf_overrides
from octavo.model_executor.load_formats import LOAD_FORMATS
from octavo.multimodal.limits import DEFAULT_IMAGE_LIMIT, parse_limit_mm_per_prompt
from octavo.multimodal.local_media import media_root
from octavo.multimodal.processor_kwargs import parse_mm_processor_kwargs
from octavo.pooling.runner import RUNNERS, TASKS, parse_pooler_config
from octavo.spec_decode.config import SpeculativeConfig

if TYPE_CHECKING:
    import torch

DEFAULT_CPU_KV_CACHE_MEMORY = 2 * 1024**3  # bytes of KV cache on CPU when none is given
SUPPORTED_BLOCK_SIZES = (8, 16, 32, 64, 128, 256)  # vLLM's, less 1
# auto: Triton on CUDA, the native kernels (else torch) on CPU, which TRITON_ATTN and
# CPU_ATTN name; FLASH_ATTN: torch's FlashAttention-2 (attention/flash_backend.py), CUDA and
# --block-size 256 only
ATTENTION_BACKENDS = ("auto", "TRITON_ATTN", "FLASH_ATTN", "CPU_ATTN")
SUPPORTED_DTYPES = ("auto", "float32", "bfloat16", "float16")
# Each one's linear method is in model_executor/layers/quantization/registry.py.
QUANTIZATION_NAMES = ("int8", "fp8", "gptq", "awq", "gguf")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
DEFAULT_MAX_LOGPROBS = 20  # vLLM's --max-logprobs default
KWARG_ALIASES = {"kv_cache_memory_bytes": "kv_cache_memory"}  # LLM(...): vLLM 0.32's name
NGRAM_MODEL = "[ngram]"  # vLLM's older --speculative-model spelling of n-gram proposals

logger = logging.getLogger(__name__)


def backend_name(text: str) -> str:
    """An --attention-backend value as vLLM spells it (FLASH_ATTN; auto in lower case)."""
    return "auto" if text.lower() == "auto" else text.upper()


@dataclass(frozen=True)
class FlagSpec:
    """How an ``EngineArgs`` field appears on the command line."""

    help: str
    parse: Callable[[str], Any] = str
    choices: tuple[Any, ...] | None = None
    kind: str = "value"  # "value" or "bool" (--x / --no-x)
    aliases: tuple[str, ...] = ()  # short spellings (vLLM's -O)


def engine_arg(default: Any, help: str, parse: Callable[[str], Any] = str, **flag: Any) -> Any:
    """A field of ``EngineArgs`` that is also an ``octavo serve`` flag."""
    return field(default=default, metadata={"flag": FlagSpec(help, parse, **flag)})


def _flag_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as a flag type: its ValueError's message becomes the command line's error
    (argparse would otherwise only say the value is invalid)."""

    def flag_type(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return flag_type


@dataclass
class EngineArgs:
    """Everything that shapes an engine. Unset values are resolved from the model/device."""

    model: str | None = None  # the positional MODEL argument of ``octavo serve``
    revision: str | None = engine_arg(
        None, "hub models (hf://ORG/NAME): branch, tag or commit to load (default: main)"
    )
    tokenizer: str | None = engine_arg(
        None,
        "the tokenizer's folder or hf://ORG/NAME, when it is not the model's (default: the "
        "model's own)",
    )
    trust_remote_code: bool = engine_arg(
        False,
        "accepted for vLLM's command lines, but only false: Octavo never runs code that "
        "comes with a model",
        parse_bool,
        kind="bool",
    )
    generation_config: str = engine_arg(
        "auto",
        "default sampling settings: auto (the model's generation_config.json: temperature, "
        "top_p, top_k, min_p, repetition_penalty, max_new_tokens as the default max_tokens), "
        "vllm (none: vLLM's neutral defaults) or a folder holding a generation_config.json; "
        "a request's own values always win",
    )
    max_model_len: int | None = engine_arg(
        None,
        "context length (default: from the model's config, rope scaling included as vLLM "
        "derives it; a LongRoPE model's original_max_position_embeddings)",
        positive_int,
    )
    hf_overrides: dict | None = engine_arg(  # noqa: RUF009
        None,
        "JSON merged into the model's config.json before anything reads it (vLLM's flag), "
        'e.g. \'{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, '
        '"original_max_position_embeddings": 32768}}\' to serve past the checkpoint'
        "'s context; nested objects merge key by key, rope settings are replaced whole",
        _flag_type(parse_hf_overrides),
    )
    load_format: str = engine_arg(
        "auto",
        "how the weights are loaded (vLLM's flag): auto (the checkpoint's safetensors or "
        "GGUF) or dummy (random weights, no weight file read: the folder needs only "
        "config.json and a tokenizer; for benchmarks of a model's shape)",
        one_of(LOAD_FORMATS),
        choices=LOAD_FORMATS,
    )
    max_num_seqs: int = engine_arg(
        None,
        f"most sequences running at once (default: {DEFAULT_MAX_NUM_SEQS}, twice that with "
        "--performance-mode throughput)",
        positive_int,
    )
    max_num_batched_tokens: int | None = engine_arg(
        None,
        "token budget of one step (default: 512 on CPU, where a step of 2048 prompt tokens "
        "stalls every stream for about half a second; on GPU vLLM's: 8192 where the GPU has "
        "70 GiB or more and is not an A100, else 2048; the offline LLM class: 2048 on CPU, "
        "16384 / 8192 on GPU; each twice that with --performance-mode throughput)",
        positive_int,
    )
    enable_chunked_prefill: bool = engine_arg(
        True,
        "split long prompts over several steps, next to running decodes; with "
        "--no-enable-chunked-prefill a prompt is computed whole in one step (the token "
        "budget then defaults to at least the context length)",
        parse_bool,
        kind="bool",
    )
    limit_mm_per_prompt: dict | None = engine_arg(  # noqa: RUF009
        None,
        "most images one prompt may carry, as vLLM spells it: '{\"image\": N}' (default: "
        f"{DEFAULT_IMAGE_LIMIT}); more is refused with a message",
        _flag_type(parse_limit_mm_per_prompt),
    )
    mm_processor_kwargs: dict | None = engine_arg(  # noqa: RUF009
        None,
        "JSON object passed to every call of the model's HF processor (vLLM's flag), e.g. "
        "'{\"max_pixels\": 200704}' (Qwen2-VL) or '{\"do_image_splitting\": false}' (SmolVLM)",
        _flag_type(parse_mm_processor_kwargs),
    )
    allowed_media_domains: list[str] | None = engine_arg(  # noqa: RUF009
        None,
        "hosts that http(s):// image URLs may be fetched from (vLLM's flag), exact names "
        "such as upload.wikimedia.org; a redirect must stay among them (default: none, "
        "every http(s) image URL is refused)",
        str,
        kind="list",
    )
    allowed_local_media_path: str | None = engine_arg(
        None,
        "a folder file:// image URLs may read from (vLLM's flag); the real path, symlinks "
        "and .. resolved, must lie inside it (default: none, file:// URLs are refused)",
    )
    max_logprobs: int = engine_arg(
        DEFAULT_MAX_LOGPROBS,
        "most logprobs / prompt_logprobs / top_logprobs alternatives one request may ask for",
        int,
    )
    enforce_eager: bool = engine_arg(
        False,
        "run every step eagerly: no CUDA graphs of decode steps (on a GPU they are captured "
        "at start-up, for the batch sizes of --compilation-config); no effect on CPU",
        parse_bool,
        kind="bool",
    )
    async_scheduling: bool = engine_arg(
        False,
        "plan and prepare each step while the previous one runs (vLLM's flag): the host's "
        "scheduling, input preparation and detokenizing overlap the GPU's work, a decode "
        "taking its input token from the previous step's sampled ids on the device; a "
        "sequence that stops costs one discarded token. One rank, no speculative decoding",
        parse_bool,
        kind="bool",
    )
    stream_interval: int = engine_arg(
        1,
        "streamed outputs every this many tokens (vLLM's flag; the first and last at "
        "once): larger values send fewer, larger chunks, less host work per token at high "
        "concurrency; a request's stream_interval may raise it",
        positive_int,
    )
    performance_mode: str = engine_arg(
        "balanced",
        "vLLM's performance mode: balanced, interactivity (a graph for every batch size up "
        "to 32, so small batches replay without padding) or throughput (twice the default "
        "--max-num-seqs and --max-num-batched-tokens: larger batches and steps)",
        one_of(PERFORMANCE_MODES),
        choices=PERFORMANCE_MODES,
    )
    optimization_level: int | None = engine_arg(
        None,
        "vLLM's optimization level, also -O0 .. -O3: 0 runs every step eagerly (no graphs, "
        "nothing compiled), 1 takes graphs cut at attention only (PIECEWISE), 2 (the "
        "default) and 3 also whole graphs of decode steps (FULL_AND_PIECEWISE); what "
        "--compilation-config gives wins over the level",
        one_of(LEVELS, int),
        choices=LEVELS,
        aliases=("-O",),
    )
    # engine_arg's field() is evaluated once, like every other field's here
    compilation_config: CompilationConfig = engine_arg(  # noqa: RUF009
        None,
        "how the model runs, as vLLM's --compilation-config / -cc (also -O with JSON, and "
        "dotted: -cc.cudagraph_mode=FULL_DECODE_ONLY): JSON with cudagraph_mode "
        "(FULL_AND_PIECEWISE: whole graphs of decode steps and graphs cut at attention for "
        "the others; FULL_DECODE_ONLY, PIECEWISE or NONE; default: the optimization "
        "level's), cudagraph_capture_sizes, max_cudagraph_capture_size, level (the "
        "optimization level), mode (0: nothing compiled) and backend (CPU: inductor or "
        "eager)",
        parse_compilation_config,
        aliases=("-cc",),
    )
    cudagraph_capture_sizes: list[int] | None = engine_arg(  # noqa: RUF009
        None,
        "the decode batch sizes (and piecewise step sizes in tokens) captured as graphs "
        "(vLLM's flag; also its older --cuda-graph-sizes) (default: 1, 2, 4, 8, 16, 24, "
        "... 256, 272, ... up to --max-cudagraph-capture-size)",
        positive_int,
        kind="list",
        aliases=("--cuda-graph-sizes",),
    )
    cudagraph_metrics: bool = engine_arg(
        False,
        "log which graphs the steps replayed (vLLM's flag): every 10 seconds, a table of "
        "the steps by tokens, the capture size they were padded to and the runtime mode "
        "(FULL: a decode graph, PIECEWISE: graphs cut at attention, NONE: eager); not "
        "with --disable-log-stats",
        parse_bool,
        kind="bool",
    )
    disable_log_stats: bool = engine_arg(
        False,
        "no stats lines in the log (vLLM's flag): by default every 10 seconds with steps "
        "in them, prompt and generation throughput, running and waiting requests, "
        "preemptions, KV cache usage and prefix cache hit rate (as vLLM words them), and "
        "the speculative decoding and --cudagraph-metrics lines; the offline LLM class "
        "logs none unless given disable_log_stats=False",
        parse_bool,
        kind="bool",
    )
    max_cudagraph_capture_size: int | None = engine_arg(
        None,
        "the largest size of the default capture sizes (vLLM's flag) (default: "
        "--max-num-seqs decode rows, at most 512; on CPU at most 64)",
        positive_int,
    )
    block_size: int = engine_arg(
        16,
        "KV cache block size in tokens",
        one_of(SUPPORTED_BLOCK_SIZES, int),
        choices=SUPPORTED_BLOCK_SIZES,
    )
    attention_backend: str = engine_arg(
        "auto",
        "attention kernels (vLLM's flag): auto (TRITON_ATTN on a GPU, CPU_ATTN: the native "
        "kernels on CPU), or FLASH_ATTN (torch's FlashAttention-2, one launch a step over the "
        "paged cache: CUDA from Ampere on, 16-bit models, --block-size 256; layers with a "
        "window, soft-cap or sinks and fp8 caches keep the Triton kernels)",
        one_of(ATTENTION_BACKENDS, backend_name),
        choices=ATTENTION_BACKENDS,
    )
    kv_cache_memory: int | None = engine_arg(
        None,
        "KV cache size per worker (each tensor/pipeline rank holds its shard), in bytes or "
        "with a unit (e.g. 4GiB). Default: 2GiB on CPU; on GPU what --gpu-memory-utilization "
        "leaves after the weights and one step's activations. Given on a GPU, it replaces "
        "that sizing and is refused at start if it does not fit in the GPU's free memory "
        "(vLLM 0.32 spells it --kv-cache-memory-bytes)",
        parse_size,
        aliases=("--kv-cache-memory-bytes",),
    )
    kv_cache_dtype: str = engine_arg(
        "auto",
        "KV cache element type: auto (the model's dtype) or fp8 / fp8_e4m3 / fp8_e5m2 "
        "(8-bit floats with per-tensor scales: half the KV bytes of bf16)",
        one_of(KV_CACHE_DTYPES),
        choices=KV_CACHE_DTYPES,
    )
    gpu_memory_utilization: float = engine_arg(
        0.9,
        "this instance's fraction of GPU memory for its weights, activations and KV cache "
        "(as vLLM: other processes' memory is not subtracted, so two servers at 0.45 "
        "share one GPU)",
        positive_float,
    )
    enable_prefix_caching: bool = engine_arg(
        True, "reuse KV blocks of shared prompt prefixes", parse_bool, kind="bool"
    )
    prefix_caching_hash_algo: str = engine_arg(
        DEFAULT_HASH_ALGO,
        "hash of the prefix-cache blocks: sha256 (SHA-256 of the pickled block key) or "
        "sha256_cbor (SHA-256 of its canonical CBOR: reproducible outside Python)",
        one_of(HASH_ALGOS),
        choices=HASH_ALGOS,
    )
    kv_offloading_size: float | None = engine_arg(
        None,
        "GiB of host memory (over all tensor ranks, as vLLM) for a second tier of the prefix "
        "cache: blocks evicted from the KV cache are saved there (LRU) and loaded back on a "
        "later prefix hit instead of being recomputed. Default: no tier",
        positive_float,
    )
    kv_offloading_backend: str = engine_arg(
        "native",
        "the offload tier's implementation: native (Octavo's host-memory tier; vLLM's "
        "OffloadingConnector). lmcache is not supported",
        one_of(("native",)),
        choices=("native",),
    )
    dtype: str = engine_arg(
        "auto", "weight/activation dtype", one_of(SUPPORTED_DTYPES), choices=SUPPORTED_DTYPES
    )
    device: str = engine_arg("auto", "auto, cpu, cuda or cuda:N")
    seed: int = engine_arg(0, "seed of the random numbers drawn by requests without a seed", int)
    num_threads: int | None = engine_arg(
        None,
        "CPU threads of the model's compute, per worker (default: OMP_NUM_THREADS when set, "
        "else every CPU the process may use, its affinity mask capped by the cgroup CPU "
        "quota, i.e. a Kubernetes CPU limit, shared out among the tensor/pipeline-parallel "
        "workers)",
        positive_int,
    )
    tensor_parallel_size: int = engine_arg(
        1,
        "ranks each layer is split over (one worker process each; GPUs on a GPU machine)",
        positive_int,
    )
    quantization: str | None = engine_arg(
        None,
        "how the decoder's linear layers are quantized: int8 (W8A8, quantized at load), fp8 "
        "(FP8 weights per output channel, quantized at load), gptq / awq (4-bit checkpoints; "
        "detected from config.json without the flag), gguf (a .gguf file's blocks kept "
        "quantized; with no --model, the embedded SmolLM2 Q4_1 file)",
        one_of(QUANTIZATION_NAMES),
        choices=QUANTIZATION_NAMES,
    )
    pipeline_parallel_size: int = engine_arg(
        1,
        "stages the layers are split over (one worker process per stage and tensor rank)",
        positive_int,
    )
    enable_expert_parallel: bool = engine_arg(
        False,
        "mixture-of-experts models: place whole experts on each tensor-parallel rank "
        "(num_experts / tensor_parallel_size each) instead of splitting every expert over "
        "all ranks",
        parse_bool,
        kind="bool",
    )
    nnodes: int = engine_arg(
        1,
        "hosts the tensor × pipeline ranks are spread over (vLLM's multi-node mp backend): "
        "each runs tensor_parallel_size × pipeline_parallel_size / nnodes ranks, node R "
        "the ranks [R*L, (R+1)*L); node 0 is the leader (API server and engine core), the "
        "others run `octavo serve --headless` with the same flags and their own --node-rank",
        positive_int,
    )
    node_rank: int = engine_arg(
        0, "this host's index among the --nnodes hosts: 0 is the leader", non_negative_int
    )
    master_addr: str = engine_arg(
        DEFAULT_MASTER_ADDR,
        "the leader's address (a name or IP every host resolves to the leader, e.g. "
        "LeaderWorkerSet's LWS_LEADER_ADDRESS); one of the leader's own addresses: its "
        "torch.distributed store listens there only",
    )
    master_port: int = engine_arg(
        DEFAULT_MASTER_PORT,
        "the leader's node port: worker hosts connect to it (authenticated with the shared "
        "secret OCTAVO_NODE_KEY), and torch.distributed meets at the next port",
        port_number,
    )
    node_join_timeout: float = engine_arg(
        DEFAULT_NODE_JOIN_TIMEOUT,
        "seconds the leader waits for every worker host to join (and a worker host for the "
        "leader to answer) before it gives up and exits 1",
        positive_float,
    )
    execute_model_timeout_seconds: float = engine_arg(
        DEFAULT_EXECUTE_MODEL_TIMEOUT,
        "seconds every rank has to finish a step (with more than one rank; vLLM's "
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS): a rank that does not answer in time (stuck in "
        "a collective, its process or host stopped) stops the engine: /health turns 503, "
        "the workers are killed and the server exits 2",
        positive_float,
    )

    # engine_arg's field() is evaluated once, like every other field's here
    speculative_config: SpeculativeConfig | None = engine_arg(  # noqa: RUF009
        None,
        'speculative decoding, as JSON in vLLM\'s spelling: {"method": "ngram", '
        '"num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2} '
        '(proposals copied from the prompt and output) or {"model": "<folder>", '
        '"num_speculative_tokens": 4} (a small draft model of the same vocabulary)',
        SpeculativeConfig.parse,
    )

    speculative_model: str | None = engine_arg(
        None,
        "deprecated (vLLM's older spelling): a draft model folder, or [ngram], with "
        "--num-speculative-tokens; use --speculative-config",
    )
    num_speculative_tokens: int | None = engine_arg(
        None,
        "deprecated (vLLM's older spelling), with --speculative-model; use --speculative-config",
        positive_int,
    )

    runner: str = engine_arg(
        "auto",
        "generate (text; such a model also answers embedding requests from its final hidden "
        "states), pooling (embeddings only: no LM head, generation refused) or auto "
        "(pooling for a sentence-transformers folder or a *Model architecture, else generate)",
        one_of(RUNNERS),
        choices=RUNNERS,
    )
    task: str | None = engine_arg(
        None,
        "vLLM's older spelling of --runner: embed (= pooling), generate or auto",
        one_of(tuple(TASKS)),
        choices=tuple(TASKS),
    )
    pooler_config: dict | None = engine_arg(  # noqa: RUF009
        None,
        'pooling defaults as JSON in vLLM\'s spelling: {"pooling_type": "LAST"|"MEAN"|"CLS", '
        '"normalize": true|false} (default: the model\'s sentence-transformers config, else '
        "last token, normalised)",
        _flag_type(parse_pooler_config),
    )

    kv_events_config: KVEventsConfig | None = engine_arg(  # noqa: RUF009
        None,
        "publish KV cache events (blocks stored, removed, all cleared) for KV-aware routers "
        "such as llm-d's, as JSON in vLLM's spelling: "
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
        '"replay_endpoint": "tcp://*:5558", "buffer_steps": 10000, "hwm": 100000, '
        '"max_queue_size": 100000, "topic": "kv@POD@MODEL"} (all but the first optional; '
        "these are vLLM's defaults, except replay_endpoint: none, and topic: empty)",
        _flag_type(KVEventsConfig.parse),
    )
    kv_transfer_config: KVTransferConfig | None = engine_arg(  # noqa: RUF009
        None,
        "prefill/decode disaggregation in vLLM's spelling: "
        '{"kv_connector": "NixlConnector", "kv_role": "kv_both", "engine_id": ID, '
        '"kv_load_failure_policy": "fail"|"recompute", "kv_connector_extra_config": '
        '{"kv_lease_duration": 30}}: requests with kv_transfer_params keep their prompt\'s '
        "blocks for a remote decode, or pull them from a remote prefill, over a TCP side "
        "channel on VLLM_NIXL_SIDE_CHANNEL_HOST:VLLM_NIXL_SIDE_CHANNEL_PORT (localhost:5600)",
        _flag_type(KVTransferConfig.parse),
    )

    enable_lora: bool = engine_arg(
        False, "serve LoRA adapters on the base model (per request)", parse_bool, kind="bool"
    )
    max_loras: int = engine_arg(1, "most LoRA adapters in one step", positive_int)
    max_lora_rank: int = engine_arg(16, "largest LoRA rank an adapter may have", positive_int)
    max_cpu_loras: int | None = engine_arg(
        None, "LoRA adapters kept in CPU memory (default: max_loras)", positive_int
    )
    lora_modules: list[LoRAModulePath] | None = engine_arg(  # noqa: RUF009
        None,
        "LoRA adapters served from the start, each NAME=PATH (a PEFT folder or hf://ORG/NAME) "
        'or JSON {"name": NAME, "path": PATH}; requests pick one by its name in "model"; '
        "implies --enable-lora",
        parse_lora_module,
        kind="list",
    )

    def __post_init__(self) -> None:
        if self.speculative_config is not None and not isinstance(
            self.speculative_config, SpeculativeConfig
        ):  # LLM(speculative_config={...})
            self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        self._fold_legacy_speculative_flags()
        self.hf_overrides = parse_hf_overrides(self.hf_overrides)  # LLM(hf_overrides={...})
        self.limit_mm_per_prompt = parse_limit_mm_per_prompt(self.limit_mm_per_prompt)
        self.mm_processor_kwargs = parse_mm_processor_kwargs(self.mm_processor_kwargs)
        media_root(self.allowed_local_media_path)  # a folder, or a ValueError now
        self._fold_compilation_flags()
        if self.max_num_seqs is None:
            self.max_num_seqs = default_max_num_seqs(self.performance_mode)
        if self.pooler_config is not None:  # LLM(pooler_config={...})
            self.pooler_config = parse_pooler_config(self.pooler_config)
        if self.kv_events_config is not None:  # LLM(kv_events_config={...}) or the flag's
            self.kv_events_config = KVEventsConfig.parse(self.kv_events_config)
        if self.kv_transfer_config is not None:  # LLM(kv_transfer_config={...}) or the flag's
            self.kv_transfer_config = KVTransferConfig.parse(self.kv_transfer_config)
        if self.lora_modules:
            self.lora_modules = [
                m if isinstance(m, LoRAModulePath) else parse_lora_module(m)
                for m in self.lora_modules
            ]
            self.enable_lora = True
        self.validate()

    def _fold_compilation_flags(self) -> None:
        """``compilation_config`` (``LLM(compilation_config={...})``, 3 or the flag's) with
        the top-level flags for its keys folded in (-O, the capture sizes)."""
        config = parse_compilation_config(self.compilation_config)
        self.compilation_config = with_flags(
            config,
            self.optimization_level,
            self.cudagraph_capture_sizes,
            self.max_cudagraph_capture_size,
        )
        self.optimization_level = self.cudagraph_capture_sizes = None  # folded in once
        self.max_cudagraph_capture_size = None

    def _fold_legacy_speculative_flags(self) -> None:
        """``--speculative-model``/``--num-speculative-tokens`` -> ``speculative_config``."""
        if self.speculative_model is None and self.num_speculative_tokens is None:
            return
        _require(
            self.speculative_config is None,
            "give either --speculative-config or the deprecated --speculative-model / "
            "--num-speculative-tokens, not both",
        )
        _require(
            self.speculative_model is not None and self.num_speculative_tokens is not None,
            "--speculative-model and --num-speculative-tokens go together",
        )
        logger.warning(
            "--speculative-model and --num-speculative-tokens are deprecated (as in vLLM); "
            "use --speculative-config '%s'",
            _legacy_speculative_json(self.speculative_model, self.num_speculative_tokens),
        )
        self.speculative_config = SpeculativeConfig.parse(
            _legacy_speculative_json(self.speculative_model, self.num_speculative_tokens)
        )
        self.speculative_model = self.num_speculative_tokens = None  # folded in once

    def token_budget(self, device: torch.device, max_model_len: int | None = None) -> int:
        """``max_num_batched_tokens``, or its served default for the device
        (``batch_defaults``; the offline ``LLM`` sets its own). Without chunked prefill a
        whole prompt must fit in one step: the default grows to ``max_model_len``, and a
        smaller explicit budget is refused."""
        explicit = self.max_num_batched_tokens
        default = default_token_budget(device, offline=False, mode=self.performance_mode)
        budget = default if explicit is None else explicit
        if self.enable_chunked_prefill or max_model_len is None:
            return budget
        _require(
            explicit is None or explicit >= max_model_len,
            f"--max-num-batched-tokens ({explicit}) is smaller than max_model_len "
            f"({max_model_len}): without chunked prefill a prompt is computed whole in "
            "one step, so raise it, lower --max-model-len or enable chunked prefill",
        )
        return max(budget, max_model_len)

    def validate(self) -> None:
        """ValueError naming the first argument out of its choices or range."""
        self._check_choices()
        self._check_limits()
        self._check_parallel()

    def _check_choices(self) -> None:
        """Names and kinds: adapters, remote code, dtype, runner, task, quantization."""
        names = [module.name for module in self.lora_modules or []]
        _require(len(set(names)) == len(names), f"--lora-modules names repeat: {names}")
        _require(
            not self.trust_remote_code,
            "--trust-remote-code is not supported: Octavo never runs code shipped with a "
            "model; it loads the architectures it supports with its own code",
        )
        _require(
            self.kv_offloading_backend == "native",
            f"kv_offloading_backend {self.kv_offloading_backend!r}: only native is supported",
        )
        _require(
            self.dtype in SUPPORTED_DTYPES,
            f"dtype must be one of {SUPPORTED_DTYPES}, got {self.dtype!r}",
        )
        _require(self.runner in RUNNERS, f"runner must be one of {RUNNERS}, got {self.runner!r}")
        _require(
            self.attention_backend in ATTENTION_BACKENDS,
            f"attention_backend must be one of {ATTENTION_BACKENDS}, got "
            f"{self.attention_backend!r}",
        )
        _require(
            self.task is None or self.task in TASKS,
            f"task must be one of {tuple(TASKS)}, got {self.task!r}",
        )
        _require(
            self.quantization in (None, *QUANTIZATION_NAMES),
            f"unknown quantization {self.quantization!r}; supported: "
            f"{', '.join(QUANTIZATION_NAMES)}",
        )
        _require(
            self.prefix_caching_hash_algo in HASH_ALGOS,
            f"prefix_caching_hash_algo must be one of {', '.join(HASH_ALGOS)}, "
            f"got {self.prefix_caching_hash_algo!r}",
        )

    def _check_limits(self) -> None:
        """Sizes and counts: sequences, logprobs, tokens, blocks, memory."""
        _require(self.max_num_seqs >= 1, "max_num_seqs must be >= 1")
        _require(self.max_logprobs >= 0, "max_logprobs must be >= 0")
        _require(
            self.kv_offloading_size is None or self.kv_offloading_size > 0,
            "kv_offloading_size must be a positive number of GiB",
        )
        _require(
            self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
            "max_num_batched_tokens must be >= 1",
        )
        _require(
            self.block_size in SUPPORTED_BLOCK_SIZES,
            f"block_size must be one of {SUPPORTED_BLOCK_SIZES}, got {self.block_size}",
        )
        _require(
            0.0 < self.gpu_memory_utilization <= 1.0,
            "gpu_memory_utilization must be in (0, 1]",
        )
        _require(
            self.kv_cache_memory is None or self.kv_cache_memory > 0,
            "kv_cache_memory must be a positive number of bytes",
        )
        _require(
            self.max_model_len is None or self.max_model_len >= 1,
            "max_model_len must be >= 1",
        )

    def _check_parallel(self) -> None:
        """Ranks and nodes, and how long to wait for them."""
        _require(self.tensor_parallel_size >= 1, "tensor_parallel_size must be >= 1")
        _require(self.pipeline_parallel_size >= 1, "pipeline_parallel_size must be >= 1")
        _require(self.nnodes >= 1, "--nnodes must be >= 1")
        layout_problems = NodeLayout.of(self).problems()
        _require(not layout_problems, "; ".join(layout_problems))
        _require(self.node_join_timeout > 0, "--node-join-timeout must be > 0 seconds")
        _require(
            self.execute_model_timeout_seconds > 0,
            "--execute-model-timeout-seconds must be > 0 seconds",
        )

    @classmethod
    def from_kwargs(cls, model: str | None, kwargs: dict) -> EngineArgs:
        for alias, name in KWARG_ALIASES.items():  # vLLM's names for the same argument
            if alias in kwargs:
                _require(name not in kwargs, f"give {name} or {alias}, not both")
                kwargs = {**kwargs, name: kwargs[alias]}
                del kwargs[alias]
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        _require(not unknown, f"unknown engine arguments: {', '.join(unknown)}")
        return cls(model=model, **kwargs)


def flag_fields() -> list[tuple[dataclasses.Field, FlagSpec]]:
    """The ``EngineArgs`` fields that are command-line flags, with their flag specs."""
    return [(f, f.metadata["flag"]) for f in dataclasses.fields(EngineArgs) if "flag" in f.metadata]


def _legacy_speculative_json(model: str | None, num_tokens: int | None) -> str:
    if model == NGRAM_MODEL:
        return f'{{"method": "ngram", "num_speculative_tokens": {num_tokens}}}'
    return json.dumps({"model": model, "num_speculative_tokens": num_tokens})


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
