"""Assembling an engine's parts from its arguments: tokenizer, executor, KV blocks, scheduler."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from octavo.attention.backend import check_backend
from octavo.compilation.compiled_model import CompileSettings, compile_decision
from octavo.compilation.config import cpu_graphs_at_first_use
from octavo.config import EngineArgs
from octavo.distributed.node_layout import NodeLayout
from octavo.distributed.parallel_config import ParallelConfig
from octavo.engine.device import select_device, select_dtype
from octavo.engine.encoder_settings import encoder_settings, encoder_token_budget
from octavo.engine.kv_groups import kv_cache_groups_for
from octavo.engine.kv_setup import (
    CacheShape,
    allocate_cache,
    block_pool,
    kv_cache_manager,
    offload_blocks,
)
from octavo.executor.executor import Executor, create_executor
from octavo.executor.node_channel import require_node_key
from octavo.kernels.cpu_count import default_threads
from octavo.kv_cache.block_hash import BlockHasher
from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.group_coordinator import KVCacheCoordinator
from octavo.kv_cache.kv_cache_groups import KVCacheGroups
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.lora.config import LoRAConfig
from octavo.model_executor.context_length import context_length_of
from octavo.model_executor.hub import served_name
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.model_folders import load_tokenizer, resolve_model_folder
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
from octavo.worker.worker import WorkerConfig

logger = logging.getLogger(__name__)


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


@dataclass
class ResolvedModel:
    """What the arguments resolve to for this model, before any worker starts."""

    folder: Path
    config: ModelConfig
    runner: RunnerSettings
    encoder: bool  # an encoder model: whole prompts, no decoding
    states: bool  # state layers (hybrid state-space models): no decoding graphs, no drafts
    device: torch.device
    dtype: torch.dtype
    parallel: ParallelConfig
    max_model_len: int
    tokenizer: object
    eos: frozenset[int]
    draft: tuple[Path, ModelConfig] | None  # a draft model's folder and config
    groups: KVCacheGroups | None  # a block table per group of layers (hybrid attention)

    @property
    def decodes(self) -> bool:
        """Does it decode step by step (decode graphs apply)? Not pooling models, state layers
        or encoders."""
        return self.runner.generates and not (self.states or self.encoder)


def build_engine_parts(args: EngineArgs) -> EngineParts:
    layout = leader_layout(args)
    model = resolve_model(args)
    spec = worker_config(args, model)
    hasher = BlockHasher.create(args.prefix_caching_hash_algo)  # before workers start
    executor = create_executor(
        spec, layout, args.node_join_timeout, args.execute_model_timeout_seconds
    )
    speculative = args.speculative_config
    lookahead = speculative.num_speculative_tokens if speculative is not None else 0
    # A draft model reads every position: no block falls behind a window.
    window = model.config.uniform_sliding_window if model.draft is None else None
    shape = CacheShape(model.device, window, model.groups, model.states, model.encoder)
    try:
        num_blocks = allocate_cache(executor, args, model.max_model_len, lookahead, shape)
    except BaseException:
        executor.shutdown()
        raise
    pool = block_pool(args, spec, num_blocks, shape)
    kv = kv_cache_manager(args, pool, hasher, shape)
    draft_slots = lookahead if model.draft is not None else 0  # the draft writes ahead
    scheduler = make_scheduler(args, model, kv, draft_slots)
    return EngineParts(
        model.config,
        model.tokenizer,
        executor,
        scheduler,
        pool,
        model.max_model_len,
        model.device,
        model.dtype,
        served_name(args.model) if args.model else model.folder.name,
        model.folder,
        model.runner,
    )


def resolve_model(args: EngineArgs) -> ResolvedModel:
    """The model's folder, config, runner, device, dtype, parallel layout, context length,
    tokenizer and draft, each checked against the arguments (ValueError where they clash)."""
    folder = resolve_model_folder(args.model, args.revision)
    config = ModelConfig.from_folder(folder, args.hf_overrides)
    config.enable_expert_parallel = args.enable_expert_parallel
    encoder = encoder_settings(args, config)
    runner = runner_settings(args, folder, config)
    config.pooling_only = not runner.generates
    device = select_device(args.device)
    dtype = select_dtype(args.dtype, device)
    parallel = ParallelConfig(args.tensor_parallel_size, args.pipeline_parallel_size, args.nnodes)
    parallel.check(config, device)
    max_model_len = max_model_len_of(args, config)
    tokenizer = load_tokenizer(folder, args.tokenizer)
    eos = frozenset(i for i in _eos_token_ids(config, tokenizer) if i < config.vocab_size)
    draft = resolve_draft(args.speculative_config, config, max_model_len, parallel)
    states = state_layer_settings(args, config, device)
    stages = parallel.pipeline_parallel_size
    groups = kv_cache_groups_for(config, stages, draft is not None, states)
    return ResolvedModel(
        folder,
        config,
        runner,
        encoder,
        states,
        device,
        dtype,
        parallel,
        max_model_len,
        tokenizer,
        eos,
        draft,
        groups,
    )


def worker_config(args: EngineArgs, model: ResolvedModel) -> WorkerConfig:
    """Everything a worker loads the model with: weights, dtype, quantization, drafts,
    LoRA, the decode graphs and compiled layers, the KV offload tier."""
    quantization = resolve_quantization(model.folder, args.quantization)
    device, parallel, speculative = model.device, model.parallel, args.speculative_config
    check_backend(args.attention_backend, device, args.block_size, model.dtype)
    compiled = compiles_layers(args, device, parallel, quantization)
    graphs = graph_sizes(args, device, parallel, speculative, compiled) if model.decodes else ()
    if model.groups is not None and graphs:
        logger.info("decode graphs off: their buffers hold one block table per sequence")
        graphs = ()
    pieces = ()
    if model.decodes:
        pieces = piecewise_sizes(args, device, parallel, compiled, model.max_model_len)
    spec = WorkerConfig(
        model.folder,
        model.config,
        model.dtype,
        device,
        model.max_model_len + 1,
        args.block_size,
        model.eos,
        args.seed,
        args.num_threads or default_threads(parallel.local_world_size),
        quantization,
        speculative,
        model.draft,
        lora_config(args),
        args.kv_cache_dtype,
        args.tokenizer,
        graphs,
        args.load_format,
        compile_layers=compiled,
        kv_groups=model.groups,
        piecewise_sizes=pieces,
        graphs_at_first_use=device.type == "cpu" and cpu_graphs_at_first_use(),
        attention_backend=args.attention_backend,
        graph_metrics=args.cudagraph_metrics and not args.disable_log_stats,
    )
    special_cache = model.states or model.encoder or model.groups is not None
    spec.kv_offload_blocks = offload_blocks(args, spec, special_cache)
    return spec


def make_scheduler(
    args: EngineArgs,
    model: ResolvedModel,
    kv: KVCacheManager | KVCacheCoordinator,
    draft_slots: int,
) -> Scheduler:
    """The scheduler over the KV manager; ``draft_slots``: the slots a draft model writes
    ahead of each sequence."""
    limits = StopLimits(model.eos, model.max_model_len)
    budget = args.token_budget(model.device, model.max_model_len)
    if model.encoder:
        budget = encoder_token_budget(budget, model.max_model_len)
    scheduler = Scheduler(
        kv,
        args.max_num_seqs,
        budget,
        limits,
        draft_slots,
        chunked_prefill=args.enable_chunked_prefill,
    )
    scheduler.max_loras = args.max_loras
    scheduler.whole_images = keeps_images_whole(model.config.architecture)
    scheduler.whole_prompts = model.encoder
    scheduler.overlapped = overlaps_steps(args, model.parallel)
    return scheduler


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
    on CPU: ``cpu_graphs``): none with --enforce-eager, -O0 or cudagraph_mode NONE,
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
    rows = args.max_num_seqs * rows_per_seq
    return tuple(compilation.capture_sizes(rows, device.type, every_small_size(args)))


def every_small_size(args: EngineArgs) -> bool:
    """A graph for every batch size up to 32 (``--performance-mode interactivity``)."""
    return args.performance_mode == "interactivity"


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
    budget = args.token_budget(device, max_model_len)
    return tuple(compilation.capture_sizes(budget, every_small_size=every_small_size(args)))


def compiles_layers(
    args: EngineArgs, device: torch.device, parallel: ParallelConfig, quantization: str | None
) -> bool:
    """Whether the workers torch.compile the decoder layers (``compile_decision``)."""
    compilation = args.compilation_config
    settings = CompileSettings(
        device.type,
        compilation.compile_mode,
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
