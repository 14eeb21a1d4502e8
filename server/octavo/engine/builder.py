"""Assembling an engine's parts from its arguments: tokenizer, executor, KV blocks, scheduler."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from octavo.arg_types import parse_size
from octavo.compilation.compiled_model import CompileSettings, compile_decision
from octavo.compilation.config import cpu_graphs_at_first_use
from octavo.config import DEFAULT_CPU_KV_CACHE_MEMORY, EngineArgs
from octavo.distributed.node_layout import NodeLayout
from octavo.distributed.parallel_config import ParallelConfig
from octavo.engine.device import select_device, select_dtype
from octavo.engine.encoder_settings import encoder_settings, encoder_token_budget
from octavo.engine.kv_groups import kv_cache_groups_for
from octavo.executor.executor import Executor, create_executor
from octavo.executor.node_channel import require_node_key
from octavo.kernels.cpu_count import default_threads
from octavo.kv_cache.block_hash import BlockHasher
from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.cache_tensors import bytes_per_block
from octavo.kv_cache.group_coordinator import KVCacheCoordinator
from octavo.kv_cache.kv_cache_groups import KVCacheGroups, blocks_per_sequence
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.kv_cache.sliding_window import max_blocks_per_sequence
from octavo.kv_cache.state_slots import StateSlots
from octavo.kv_events.events import MEDIUM_CPU, MEDIUM_STORAGE
from octavo.lora.config import LoRAConfig
from octavo.model_executor.context_length import context_length_of
from octavo.model_executor.hub import served_name
from octavo.model_executor.loader import load_tokenizer, resolve_model_folder
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.registry import (
    has_state_layers,
    is_pooling_architecture,
    keeps_images_whole,
    model_class,
)
from octavo.model_executor.quantized_checkpoint import resolve_quantization
from octavo.pooling.model_defaults import read_pooler_config
from octavo.pooling.runner import RunnerSettings, resolve_runner
from octavo.scheduler.scheduler import Scheduler
from octavo.scheduler.stop_checker import StopLimits
from octavo.spec_decode.config import SpeculativeConfig
from octavo.spec_decode.draft_checks import resolve_draft
from octavo.worker.worker import KVBudget, WorkerConfig

logger = logging.getLogger(__name__)

KV_CACHE_MEMORY_ENV = "OCTAVO_KV_CACHE_MEMORY"


@dataclass
class EngineParts:
    config: ModelConfig
    tokenizer: object
    executor: Executor
    scheduler: Scheduler
    pool: BlockPool
    max_model_len: int
    device: torch.device
    dtype: torch.dtype
    model_name: str
    folder: Path  # the model's files (structured output compiles against its tokenizer)
    runner: RunnerSettings  # generate or pooling, and the model's pooling defaults


def build_engine_parts(args: EngineArgs) -> EngineParts:
    layout = leader_layout(args)
    folder = resolve_model_folder(args.model, args.revision)
    config = ModelConfig.from_folder(folder, args.hf_overrides)
    config.enable_expert_parallel = args.enable_expert_parallel
    encoder = encoder_settings(args, config)
    runner = runner_settings(args, folder, config)
    config.pooling_only = not runner.generates
    quantization = resolve_quantization(folder, args.quantization)
    device = select_device(args.device)
    dtype = select_dtype(args.dtype, device)
    parallel = ParallelConfig(args.tensor_parallel_size, args.pipeline_parallel_size, args.nnodes)
    parallel.check(config, device)
    max_model_len = max_model_len_of(args, config)
    tokenizer = load_tokenizer(folder, args.tokenizer)
    eos = frozenset(i for i in _eos_token_ids(config, tokenizer) if i < config.vocab_size)
    threads = args.num_threads or default_threads(parallel.local_world_size)
    speculative = args.speculative_config
    draft = resolve_draft(speculative, config, max_model_len, parallel)
    states = state_layer_settings(args, config, device)
    groups = kv_cache_groups_for(config, parallel.pipeline_parallel_size, draft is not None, states)
    compiled = compiles_layers(args, device, parallel, quantization)
    decodes = runner.generates and not (states or encoder)  # a pooling model never decodes
    graphs = graph_sizes(args, device, parallel, speculative, compiled) if decodes else ()
    if groups is not None and graphs:
        logger.info("decode graphs off: their buffers hold one block table per sequence")
        graphs = ()
    pieces = piecewise_sizes(args, device, parallel, compiled, max_model_len) if decodes else ()
    spec = WorkerConfig(
        folder,
        config,
        dtype,
        device,
        max_model_len + 1,
        args.block_size,
        eos,
        args.seed,
        threads,
        quantization,
        speculative,
        draft,
        lora_config(args),
        args.kv_cache_dtype,
        args.tokenizer,
        graphs,
        args.load_format,
        compile_layers=compiled,
        kv_groups=groups,
        piecewise_sizes=pieces,
        graphs_at_first_use=device.type == "cpu" and cpu_graphs_at_first_use(),
    )
    spec.kv_offload_blocks = offload_blocks(args, spec, bool(states or encoder or groups))
    hasher = BlockHasher.create(args.prefix_caching_hash_algo)  # before workers start
    executor = create_executor(
        spec, layout, args.node_join_timeout, args.execute_model_timeout_seconds
    )
    lookahead = speculative.num_speculative_tokens if speculative is not None else 0
    window = config.uniform_sliding_window if draft is None else None  # a draft reads it all
    try:
        num_blocks = _initialize_cache(
            executor, args, device, max_model_len, lookahead, window, groups
        )
    except BaseException:
        executor.shutdown()
        raise
    events = args.kv_events_config
    pool = BlockPool(
        num_blocks,
        args.enable_prefix_caching and not states and not encoder,
        events is not None and events.publishes,
    )
    if spec.kv_offload_blocks:
        block_bytes = bytes_per_block(config, args.block_size, spec.cache_dtype)
        medium = MEDIUM_STORAGE if device.type == "cpu" else MEDIUM_CPU  # a mapped file on CPU
        pool.attach_offload(spec.kv_offload_blocks, args.block_size, block_bytes, medium)
    kv: KVCacheManager | KVCacheCoordinator = KVCacheManager(pool, args.block_size, window, hasher)
    if groups is not None:  # a block table per group over the one pool
        kv = KVCacheCoordinator(pool, args.block_size, groups, hasher)
    if states:  # one per sequence max_num_seqs runs, and the null slot 0
        kv.state_slots = StateSlots(args.max_num_seqs + 1)
    limits = StopLimits(eos, max_model_len)
    ahead = lookahead if draft is not None else 0  # slots the draft model writes ahead
    budget = args.token_budget(device, max_model_len)
    if encoder:
        budget = encoder_token_budget(budget, max_model_len)
    scheduler = Scheduler(
        kv, args.max_num_seqs, budget, limits, ahead, chunked_prefill=args.enable_chunked_prefill
    )
    scheduler.max_loras = args.max_loras
    scheduler.whole_images = keeps_images_whole(config.architecture)
    scheduler.whole_prompts = encoder
    scheduler.overlapped = overlaps_steps(args, parallel)
    name = served_name(args.model) if args.model else folder.name
    return EngineParts(
        config,
        tokenizer,
        executor,
        scheduler,
        pool,
        max_model_len,
        device,
        dtype,
        name,
        folder,
        runner,
    )


def state_layer_settings(args: EngineArgs, config: ModelConfig, device: torch.device) -> bool:
    """Does the model have state layers (LFM2, Granite 4.0 hybrid, Qwen3-Next)? Then
    speculative decoding is refused (a state cannot take back rejected proposals), and
    prefix caching and decode CUDA graphs are off, one line each (states are not
    checkpointed at block boundaries; the mixers run eagerly)."""
    if not has_state_layers(config):
        return False
    name = config.architecture
    if args.speculative_config is not None:
        raise ValueError(
            f"speculative decoding is not supported for {name}: its state layers keep one "
            "state per sequence, which cannot take back rejected proposals"
        )
    if args.enable_prefix_caching:
        logger.info("prefix caching off: %s's state layers are not checkpointed per block", name)
    if device.type == "cuda" and not args.enforce_eager:
        logger.info("decode CUDA graphs off: %s's state layers run eagerly", name)
    return True


def overlaps_steps(args: EngineArgs, parallel: ParallelConfig) -> bool:
    """``--async-scheduling``, where it applies: one rank (the worker in this process) and
    no speculative decoding (a step's proposals come from the previous step's output)."""
    if not args.async_scheduling:
        return False
    if parallel.world_size > 1 or args.speculative_config is not None:
        logger.warning(
            "--async-scheduling needs one rank and no speculative decoding: steps run in turn"
        )
        return False
    return True


def graph_sizes(
    args: EngineArgs,
    device: torch.device,
    parallel: ParallelConfig,
    speculative: SpeculativeConfig | None,
    compiled_layers: bool = False,
) -> tuple[int, ...]:
    """The decode batch sizes captured as graphs (CUDA graphs on a GPU, recorded op calls
    on CPU: ``cpu_graphs``): none with --enforce-eager, level 0 or cudagraph_mode NONE,
    (for now) with LoRA or more than one rank, and on CPU with torch.compiled layers
    (inductor's kernels run outside the dispatcher a recording sees)."""
    compilation = args.compilation_config
    if (
        device.type not in ("cuda", "cpu")
        or (device.type == "cpu" and compiled_layers)
        or not compilation.full_decode_graphs
        or not graphs_allowed(args, parallel)
    ):
        return ()
    rows_per_seq = 1 + (speculative.num_speculative_tokens if speculative else 0)
    return tuple(compilation.capture_sizes(args.max_num_seqs * rows_per_seq, device.type))


def graphs_allowed(args: EngineArgs, parallel: ParallelConfig) -> bool:
    """What both kinds of graphs need: no --enforce-eager, one rank, no LoRA (for now)."""
    return not args.enforce_eager and parallel.world_size == 1 and not args.enable_lora


def piecewise_sizes(
    args: EngineArgs,
    device: torch.device,
    parallel: ParallelConfig,
    compiled_layers: bool,
    max_model_len: int,
) -> tuple[int, ...]:
    """The step sizes (tokens) captured as graphs cut at attention (``piecewise_graphs``):
    on a GPU with a piecewise ``cudagraph_mode`` (the default), one rank, no LoRA, no
    --enforce-eager; the capture sizes up to the step budget, at most 512 by default."""
    compilation = args.compilation_config
    if (
        device.type != "cuda"
        or compiled_layers
        or not compilation.piecewise_graphs
        or not graphs_allowed(args, parallel)
    ):
        return ()
    return tuple(compilation.capture_sizes(args.token_budget(device, max_model_len)))


def compiles_layers(
    args: EngineArgs, device: torch.device, parallel: ParallelConfig, quantization: str | None
) -> bool:
    """Whether the workers torch.compile the decoder layers (``compile_decision``)."""
    compilation = args.compilation_config
    settings = CompileSettings(
        device.type,
        compilation.level,
        compilation.backend,
        args.enforce_eager,
        parallel.world_size,
        args.enable_lora,
        quantization,
    )
    decision = compile_decision(settings)
    logger.info("torch.compile of the decoder layers: %s (%s)", decision.enabled, decision.reason)
    return decision.enabled


def leader_layout(args: EngineArgs) -> NodeLayout:
    """The engine's layout; an engine runs on node 0 only (ValueError elsewhere), and
    across hosts only with ``OCTAVO_NODE_KEY`` (``NodeKeyMissing``, a ValueError)."""
    layout = NodeLayout.of(args)
    if layout.node_rank != 0:
        raise ValueError(
            f"node_rank {layout.node_rank} is a worker host: run it as `octavo serve "
            "--headless`; the engine runs on node 0, the leader"
        )
    require_node_key(layout.nnodes)
    return layout


def runner_settings(args: EngineArgs, folder: Path, config: ModelConfig) -> RunnerSettings:
    """``--runner`` (or ``--task``) resolved for this model, with its pooling defaults."""
    pooling_architecture = is_pooling_architecture(config.architecture)
    kind = resolve_runner(args.runner, args.task, folder, pooling_architecture)
    if kind == "generate" and pooling_architecture:
        raise ValueError(
            f"{config.architecture} checkpoints have no LM head: serve them with --runner pooling"
        )
    defaults = model_class(config.architecture).pooler_defaults(config)
    pooler = read_pooler_config(folder, config.hidden_size, args.pooler_config, defaults)
    logger.info("runner: %s (pooling: %s)", kind, pooler)
    return RunnerSettings(kind, pooler)


def lora_config(args: EngineArgs) -> LoRAConfig | None:
    if not args.enable_lora:
        return None
    return LoRAConfig(args.max_loras, args.max_lora_rank, args.max_cpu_loras or args.max_loras)


def kv_budget(
    args: EngineArgs, device: torch.device, num_speculative_tokens: int, max_model_len: int
) -> KVBudget:
    """The workers' KV budget: ``--kv-cache-memory`` bytes wherever it is given (on CPU
    else ``$OCTAVO_KV_CACHE_MEMORY``, the server's variable, for the offline ``LLM`` too;
    else 2 GiB), else on a GPU the ``--gpu-memory-utilization`` share."""
    kv_bytes = args.kv_cache_memory
    if kv_bytes is None and device.type != "cuda":
        kv_bytes = cpu_kv_cache_default()
    return KVBudget(
        kv_bytes,
        args.gpu_memory_utilization,
        args.token_budget(device, max_model_len),
        args.max_num_seqs,
        num_speculative_tokens,
    )


def offload_blocks(args: EngineArgs, spec: WorkerConfig, special_cache: bool) -> int:
    """Blocks of the KV offload tier (``--kv-offloading-size`` GiB over every rank, as
    vLLM: each rank keeps that many blocks of its shard); 0 without one. ValueError
    where it cannot work: no prefix caching, a sliding window, a draft model, KV cache
    groups, state layers or an encoder (their caches are not one plain pool)."""
    if args.kv_offloading_size is None:
        return 0
    reasons = {
        "prefix caching is off": not args.enable_prefix_caching,
        "a sliding window": spec.config.uniform_sliding_window is not None,
        "a draft model": spec.draft is not None,
        "KV cache groups, state layers or an encoder": special_cache,
    }
    refused = [reason for reason, applies in reasons.items() if applies]
    if refused:
        raise ValueError(f"--kv-offloading-size is not supported with {', '.join(refused)}")
    block_bytes = bytes_per_block(spec.config, spec.block_size, spec.cache_dtype)
    num_blocks = int(args.kv_offloading_size * (1 << 30)) // block_bytes
    if num_blocks < 1:
        raise ValueError(
            f"--kv-offloading-size {args.kv_offloading_size} GiB holds no KV block "
            f"({block_bytes} bytes each)"
        )
    return num_blocks


def cpu_kv_cache_default() -> int:
    """``$OCTAVO_KV_CACHE_MEMORY`` when set (a bad value is refused, naming it), else 2 GiB."""
    text = os.environ.get(KV_CACHE_MEMORY_ENV)
    if not text:
        return DEFAULT_CPU_KV_CACHE_MEMORY
    try:
        return parse_size(text)
    except argparse.ArgumentTypeError as error:
        raise ValueError(f"{KV_CACHE_MEMORY_ENV}: {error}") from None


def _initialize_cache(
    executor: Executor,
    args: EngineArgs,
    device: torch.device,
    max_model_len: int,
    num_speculative_tokens: int,
    window: int | None = None,
    groups: KVCacheGroups | None = None,
) -> int:
    """Size the KV cache (the fewest blocks any worker can hold) and allocate it; it must
    hold one sequence of ``max_model_len`` tokens (behind a uniform ``window``: the window
    and one step's tokens, as blocks behind it are freed)."""
    budget = kv_budget(args, device, num_speculative_tokens, max_model_len)
    num_blocks = executor.num_available_blocks(budget)
    if device.type == "cuda" and num_blocks <= 0:
        raise ValueError(
            "no GPU memory left for the KV cache; raise gpu_memory_utilization "
            "or lower max_num_batched_tokens / max_num_seqs"
        )
    _log_cache(num_blocks, args, budget)
    step_tokens = budget.max_num_batched_tokens + num_speculative_tokens
    needed = max_blocks_per_sequence(max_model_len, args.block_size, window, step_tokens)
    if groups is not None:  # the blocks of every group (each behind its own window)
        needed = blocks_per_sequence(groups, max_model_len, args.block_size, step_tokens)
    _check_capacity(num_blocks, args.block_size, max_model_len, needed)
    executor.initialize_cache(num_blocks)
    return num_blocks


def _log_cache(num_blocks: int, args: EngineArgs, budget: KVBudget) -> None:
    size = budget.kv_cache_bytes
    where = "" if size is None else f" in a budget of {size / 2**20:.0f} MiB per worker"
    logger.info(
        "KV cache: %d blocks of %d tokens (%d tokens, %s)%s",
        num_blocks,
        args.block_size,
        num_blocks * args.block_size,
        args.kv_cache_dtype,
        where,
    )


def _eos_token_ids(config: ModelConfig, tokenizer) -> set[int]:
    ids = set(config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def max_model_len_of(args: EngineArgs, config: ModelConfig) -> int:
    """``--max-model-len`` within the config's longest context (rope scaling included, as
    vLLM derives it; sliding windows are attention, not a cap), or its default."""
    positions = {"max_position_embeddings": config.max_position_embeddings}
    context = config.context or context_length_of(positions, config.rope)
    return context.resolve(args.max_model_len)


def _check_capacity(num_blocks: int, block_size: int, max_model_len: int, needed: int) -> None:
    """``needed``: the blocks one sequence of ``max_model_len`` tokens holds at most."""
    capacity = (num_blocks - 1) * block_size  # block 0 is the null block
    if num_blocks - 1 < needed:
        raise ValueError(
            f"the KV cache holds {capacity} tokens, fewer than max_model_len={max_model_len} "
            f"needs ({needed * block_size}); "
            "raise kv_cache_memory / gpu_memory_utilization or lower max_model_len"
        )
