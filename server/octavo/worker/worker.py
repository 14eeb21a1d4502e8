"""A worker owns one device's share of the model: the weights, the KV cache, the runner.

Without parallelism there is one worker, in the engine's process. With tensor or
pipeline parallelism there is one per rank, each in its own process
(``worker_process``), built from the same ``WorkerConfig`` plus its ``Placement``.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from octavo.attention.backend import AttentionBackend, select_backend
from octavo.attention.kv_quant import kv_cache_dtype
from octavo.compilation.compiled_model import compile_layers
from octavo.distributed.comm_timer import take_communication_stats
from octavo.distributed.parallel_state import pipeline_stage, tensor_parallel_group
from octavo.distributed.worker_group import Placement, join_process_group
from octavo.kv_cache.cache_tensors import allocate_kv_caches, bytes_per_block
from octavo.kv_cache.cpu_budget import HostMemory, HostNeeds, cpu_kv_bytes
from octavo.kv_cache.gpu_budget import (
    GpuMemory,
    StepRows,
    activation_bytes,
    requested_budget,
    step_rows,
    unprofiled_bytes,
    utilization_budget,
)
from octavo.kv_cache.kv_cache_groups import KVCacheGroups
from octavo.kv_cache.offload_tensors import HostTier
from octavo.kv_cache.state_slots import StateSpec
from octavo.kv_cache.state_tensors import layer_caches, state_bytes
from octavo.kv_transfer.block_io import (
    KVLayout,
    KVShard,
    PackedTensor,
    gather_blocks,
    kv_head_shard,
    model_fingerprint,
    scatter_blocks,
)
from octavo.lora.config import LoRAConfig
from octavo.lora.model_lora import LoRAModel
from octavo.lora.slots import AdapterSlots
from octavo.model_executor.cpu_graphs import CpuGraphRecorder
from octavo.model_executor.decode_graphs import CudaGraphRecorder, DecodeGraphs
from octavo.model_executor.dummy_steps import prompt_chunks
from octavo.model_executor.footprint import weight_bytes, weight_footprint
from octavo.model_executor.graph_metrics import GraphMetricsLog, captured_graphs
from octavo.model_executor.layers.lora import LoRASize
from octavo.model_executor.layers.moe.quantized_experts import experts_sync_with_host
from octavo.model_executor.loader import load_model
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.model_folders import load_tokenizer
from octavo.model_executor.model_runner import ModelRunner
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.paged_model import PagedModel
from octavo.model_executor.piecewise_graphs import CudaSegments, PiecewiseGraphs, cuts_cleanly
from octavo.model_executor.proposer import Proposer
from octavo.outputs import ModelRunnerOutput
from octavo.scheduler.output import SchedulerOutput
from octavo.scheduler.scheduler import PROMPT_SCORING_ROWS_PER_STEP
from octavo.spec_decode.config import SpeculativeConfig
from octavo.spec_decode.draft_model import DraftModelProposer
from octavo.spec_decode.ngram_proposer import NgramProposer, NgramStepProposer
from octavo.structured_output.compiler import GrammarCompiler
from octavo.structured_output.manager import StructuredOutputManager, shared_compiler
from octavo.worker.host_heap import HOST_HEAP
from octavo.worker.kernel_warm_up import StepLimits, warm_up_kernels
from octavo.worker.memory_profile import CacheSpec, DummyStep, largest_step, measure_step_peak

logger = logging.getLogger(__name__)

STOP_WORKER = "stop"  # the message that ends a worker process (``worker_process``)


@dataclass
class WorkerConfig:
    """Everything a worker needs to load its model; plain values, so it can be sent."""

    folder: Path
    config: ModelConfig
    dtype: torch.dtype
    device: torch.device
    max_positions: int  # rotary tables are built for this many positions
    block_size: int
    eos_token_ids: frozenset[int]
    seed: int = 0  # the global RNG's seed: requests without their own seed draw from it
    num_threads: int | None = None  # torch's intra-op threads; None leaves torch's default
    quantization: str | None = None  # the decoder linears' method (``--quantization``)
    speculative: SpeculativeConfig | None = None  # proposals for speculative decoding
    draft: tuple[Path, ModelConfig] | None = None  # the draft model's folder and config
    lora: LoRAConfig | None = None  # LoRA adapters: slots and limits
    kv_cache_dtype: str = "auto"  # ``--kv-cache-dtype``: auto (the model's dtype) or an fp8 kind
    tokenizer: str | None = None  # ``--tokenizer``: another folder's tokenizer
    graph_sizes: tuple[int, ...] = ()  # decode batch sizes captured as CUDA graphs (none: eager)
    load_format: str = "auto"  # ``--load-format``: auto (the checkpoint) or dummy (random)
    compile_layers: bool = False  # torch.compile the decoder layers (``compiled_model``)
    # KV cache groups (a hybrid model's sliding and full layers, one rank): the cache is
    # ``group_size`` tensors shared by the groups; None: one tensor per layer
    kv_groups: KVCacheGroups | None = None
    kv_offload_blocks: int = 0  # ``--kv-offloading-size``: host tier blocks a rank keeps
    piecewise_sizes: tuple[int, ...] = ()  # step sizes (tokens) captured cut at attention
    graphs_at_first_use: bool = False  # CPU: each decode graph recorded at its first use
    attention_backend: str = "auto"  # ``--attention-backend`` (checked by the builder)
    graph_metrics: bool = False  # ``--cudagraph-metrics``: the graphs' use logged (the driver)

    @property
    def cache_dtype(self) -> torch.dtype:
        """The KV cache's element type (target and draft model alike)."""
        return kv_cache_dtype(self.kv_cache_dtype, self.dtype)


@dataclass(frozen=True)
class KVBudget:
    """How much memory a worker may give its KV cache (each rank sizes its own shard)."""

    kv_cache_bytes: int | None  # this many bytes per worker (CPU: always; GPU: when given)
    gpu_memory_utilization: float  # on GPU without kv_cache_bytes: this share of the device
    max_num_batched_tokens: int
    max_num_seqs: int
    num_speculative_tokens: int = 0  # rows of a speculating sequence's logits: k + 1


def largest_step_rows(budget: KVBudget) -> StepRows:
    """The row bound of the largest step the budget's scheduler makes."""
    return step_rows(
        budget.max_num_batched_tokens,
        budget.max_num_seqs,
        budget.num_speculative_tokens,
        PROMPT_SCORING_ROWS_PER_STEP,
    )


@dataclass(frozen=True)
class CacheShape:
    """This worker's share of the KV cache: its stage's layers, its rank's KV heads."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_latent_dim: int | None = None  # MLA: one latent per token and layer, every rank whole


class Worker:
    # State layers (hybrid models): each one's spec, None for attention layers; and the
    # slots their tensors hold (``max_num_seqs`` + the null slot), set with the budget.
    state_specs: tuple[StateSpec | None, ...] = ()
    num_state_slots: int = 0

    def __init__(
        self,
        spec: WorkerConfig,
        placement: Placement | None = None,
        init_method: str = "",
        session: str = "",
    ) -> None:
        self.spec, self.placement = spec, placement
        self.device = spec.device
        if placement is not None:
            self.device = _rank_device(spec.device, placement.local_rank)
            join_process_group(placement, init_method, _backend(self.device), session)
        torch.manual_seed(spec.seed)
        if spec.num_threads is not None:
            torch.set_num_threads(spec.num_threads)
        self.model = load_model(
            spec.folder,
            spec.config,
            spec.max_positions,
            spec.dtype,
            self.device,
            spec.quantization,
            spec.load_format,
        )
        if (spec.graph_sizes or spec.piecewise_sizes) and experts_sync_with_host(self.model):
            logger.info("CUDA graphs off: quantized MoE experts run the grouped path")
            self.spec = spec = replace(spec, graph_sizes=(), piecewise_sizes=())
        if spec.compile_layers:
            compile_layers(self.model)
        self.state_specs = tuple(self.model.state_specs())
        layers = [layer for layer in self.model.layers if not layer.is_state_layer]  # attention
        kv_heads = layers[0].num_kv_heads if len(layers) else spec.config.num_kv_heads
        self.cache_shape = CacheShape(
            len(layers), kv_heads, spec.config.head_dim, spec.config.kv_latent_dim
        )
        if spec.kv_groups is not None:  # tensor j serves layer j of every group
            self.cache_shape = replace(self.cache_shape, num_layers=spec.kv_groups.group_size)
        self.draft = self._load_draft()
        self.adapters = self._lora_slots()
        self.runner: ModelRunner | None = None
        # A CPU worker keeps freed memory once started (host_heap); the release runs once, at
        # the engine's shutdown or when the worker is collected.
        self._heap_release: weakref.finalize | None = None
        self.host_needs: HostNeeds | None = None  # a CPU worker's, once its KV is sized
        self.step_tokens = 0  # the largest step's tokens, once the KV cache is sized

    def _load_draft(self) -> CausalLM | None:
        """The draft model, on the driver (the only rank that proposes)."""
        if self.spec.draft is None or not self.is_driver:
            return None
        folder, config = self.spec.draft
        spec = self.spec
        return load_model(
            folder, config, spec.max_positions, spec.dtype, self.device, None, spec.load_format
        )

    def _lora_slots(self) -> AdapterSlots | None:
        """LoRA layers around the linears and the slots that hold adapters."""
        lora, spec = self.spec.lora, self.spec
        if lora is None:
            return None
        size = LoRASize(lora.max_loras, lora.max_rank, spec.dtype, self.device)
        model = LoRAModel(self.model, size)
        return AdapterSlots(model, spec.config, lora.max_loras, lora.max_cpu_loras, lora.max_rank)

    def _draft_cache_shape(self) -> CacheShape | None:
        if self.draft is None or self.spec.draft is None:
            return None
        config = self.spec.draft[1]
        return CacheShape(
            config.num_layers, config.num_kv_heads, config.head_dim, config.kv_latent_dim
        )

    @property
    def is_driver(self) -> bool:
        return self.placement is None or self.placement.is_driver

    def parameter_bytes(self) -> int:
        """Bytes of this rank's weights as stored (its shard; ``footprint.weight_bytes``)."""
        return weight_bytes(self.model)

    def communication_stats(self) -> dict[str, tuple[float, int]]:
        """Seconds and calls per kind of communication since the last ask (benchmarks)."""
        return take_communication_stats()

    def num_available_blocks(self, budget: KVBudget) -> int:
        """How many KV blocks fit this worker's memory budget."""
        self.step_tokens = largest_step_rows(budget).tokens  # the kernel warm-up's budget
        cache_dtype, block_size = self.spec.cache_dtype, self.spec.block_size
        per_block = bytes_per_block(self.cache_shape, block_size, cache_dtype)
        draft_shape = self._draft_cache_shape()
        if draft_shape is not None:  # the draft's cache has as many blocks as the target's
            per_block += bytes_per_block(draft_shape, block_size, cache_dtype)
        if self.device.type != "cuda":
            kv_bytes = self._cpu_kv_bytes(budget)
        else:
            kv_bytes = max(0, self._gpu_kv_bytes(budget))
        return max(0, kv_bytes - self._state_slot_bytes(budget, kv_bytes)) // per_block

    def _state_slot_bytes(self, budget: KVBudget, kv_bytes: int) -> int:
        """State layers' slots (one per sequence ``max_num_seqs`` can run, and the null
        slot): paid first out of the KV budget, the blocks get the rest."""
        if not any(self.state_specs):
            return 0
        self.num_state_slots = budget.max_num_seqs + 1
        states = state_bytes(list(self.state_specs), self.num_state_slots, self.spec.dtype)
        if states > kv_bytes:
            raise ValueError(
                f"the state layers' {self.num_state_slots} slots take {states / 2**20:.1f} "
                f"MiB, more than the KV budget's {kv_bytes / 2**20:.1f} MiB; raise "
                "kv_cache_memory / gpu_memory_utilization or lower max_num_seqs"
            )
        logger.info(
            "KV budget %.1f MiB: %.1f MiB for %d state slots of %d state layers, "
            "%.1f MiB for KV blocks",
            kv_bytes / 2**20,
            states / 2**20,
            self.num_state_slots,
            sum(spec is not None for spec in self.state_specs),
            (kv_bytes - states) / 2**20,
        )
        return states

    def _cpu_kv_bytes(self, budget: KVBudget) -> int:
        """``--kv-cache-memory``, checked against the host's memory next to the weights
        (the draft's too) as stored, prepacked copies included, and what steps take
        (``cpu_activation_bytes``; ``cpu_budget``)."""
        assert budget.kv_cache_bytes is not None, "the CPU budget is always in bytes"
        if self.device.type != "cpu":
            return budget.kv_cache_bytes
        models = [self.model] if self.draft is None else [self.model, self.draft]
        footprints = [weight_footprint(model) for model in models]
        self.host_needs = HostNeeds(
            weights=sum(footprint.total for footprint in footprints),
            copies=sum(footprint.copies for footprint in footprints),
            activations=self.cpu_activation_bytes(budget),
        )
        return cpu_kv_bytes(budget.kv_cache_bytes, self.host_needs, HostMemory.read())

    def cpu_activation_bytes(self, budget: KVBudget) -> int:
        """The largest step's activations (estimated from its shapes, as for a pipeline
        stage) and the CPU decode graphs' arena, kept for the server's life: the largest
        captured batch's forward, which every size shares (``cpu_graphs``)."""
        config, dtype = self.spec.config, self.spec.dtype
        graphs = 0
        if self.spec.graph_sizes:
            largest = max(self.spec.graph_sizes)
            graphs = activation_bytes(config, StepRows(largest, largest, 0), dtype)
        return activation_bytes(config, largest_step_rows(budget), dtype) + graphs

    def _gpu_kv_bytes(self, budget: KVBudget) -> int:
        """The KV cache's bytes on this GPU: as requested, or the utilization's leftover."""
        rows = largest_step_rows(budget)
        activations = self.step_activation_bytes(rows, budget.max_num_seqs)
        memory = GpuMemory.of(self.device)
        if budget.kv_cache_bytes is not None:
            return requested_budget(memory, budget.kv_cache_bytes, activations, self.device)
        utilization = budget.gpu_memory_utilization
        return utilization_budget(memory, utilization, activations, self.device)

    def step_activation_bytes(self, rows: StepRows, max_num_seqs: int) -> int:
        """The largest step's activations: measured by a dummy forward (``memory_profile``)
        where this rank runs the whole model, else (a pipeline stage) estimated."""
        stage = pipeline_stage()
        if not (stage.is_first and stage.is_last) or self.device.type != "cuda":
            return activation_bytes(self.spec.config, rows, self.spec.dtype)
        step = largest_step(rows, max_num_seqs, self.spec.max_positions)
        cache = CacheSpec(self.spec.block_size, self.spec.cache_dtype, self.device)
        peak = measure_step_peak(self.paged_model_on, self.cache_shape, step, cache)
        assert peak is not None, "a GPU reports its allocator's peak"
        return peak + unprofiled_bytes(rows, self.spec.config.vocab_size) + self._graph_bytes()

    def _graph_bytes(self) -> int:
        """What the graphs' memory pool keeps for the server's life: the activations of
        the largest captured decode batch or piecewise step, whichever is more (the two
        share one pool; measured like the largest step), and the pieces' attention
        outputs (a buffer of the largest piecewise step per layer)."""
        spec, steps = self.spec, []
        if spec.graph_sizes:
            steps.append(DummyStep([1] * max(spec.graph_sizes), max(spec.graph_sizes)))
        if spec.piecewise_sizes:  # prompts no longer than max_model_len
            lengths = prompt_chunks(max(spec.piecewise_sizes), spec.max_positions - 1)
            steps.append(DummyStep(lengths, len(lengths)))
        cache = CacheSpec(spec.block_size, spec.cache_dtype, self.device)
        peaks = [
            measure_step_peak(self.paged_model_on, self.cache_shape, step, cache) or 0
            for step in steps
        ]
        outputs = 0
        if spec.piecewise_sizes:
            heads = spec.config.num_heads // tensor_parallel_group().size
            row = heads * spec.config.head_dim * spec.dtype.itemsize
            outputs = len(self.model.layers) * max(spec.piecewise_sizes) * row
        return max(peaks, default=0) + outputs

    def paged_model_on(self, caches: list[torch.Tensor], num_state_slots: int = 1) -> PagedModel:
        """The model with ``caches`` and this device's attention backend (the runner's, and
        the memory profile's scratch one). ``caches`` are the attention layers'; state
        layers get ``num_state_slots`` slots of their own (a scratch cache: the null one)."""
        if any(self.state_specs):
            caches = layer_caches(
                caches, list(self.state_specs), num_state_slots, self.spec.dtype, self.device
            )
        attention = self.attention_backend()
        paged = PagedModel(self.model, caches, self.spec.block_size, attention, self.device)
        groups = self.spec.kv_groups
        if groups is not None:
            paged.kv_caches = groups.layer_tensors(caches, len(self.model.layers))
            paged.layer_groups = groups.layer_groups(len(self.model.layers))  # type: ignore[assignment]
        return paged

    def attention_backend(self) -> AttentionBackend:
        """``--attention-backend``'s kernels on this worker's device (model and draft)."""
        spec = self.spec
        return select_backend(self.device, spec.dtype, spec.attention_backend, spec.max_positions)

    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate the paged KV cache and get the runner ready to take steps."""
        spec = self.spec
        caches = allocate_kv_caches(
            self.cache_shape, num_blocks, spec.block_size, spec.cache_dtype, self.device
        )
        self.runner = ModelRunner(
            self.paged_model_on(caches, self.num_state_slots),
            spec.eos_token_ids,
            pipeline_stage(),
            self.is_driver,
            StructuredOutputManager(self._grammar_compiler) if self.is_driver else None,
            self._proposer(num_blocks) if self.is_driver else None,
            self.adapters,
        )
        if spec.kv_offload_blocks:  # each rank's tier holds its own shard of the blocks
            self.runner.offload = HostTier.like(caches, spec.kv_offload_blocks)
        pool = None  # the decode graphs' memory pool, which the pieces share
        if spec.graph_sizes:
            recorder = CudaGraphRecorder() if self.device.type == "cuda" else CpuGraphRecorder()
            pool = getattr(recorder, "pool", None)
            sizes, lazy = list(spec.graph_sizes), spec.graphs_at_first_use
            graphs = DecodeGraphs(self.runner.paged, sizes, spec.max_positions, recorder, lazy)
            if graphs.capture():
                self.runner.graphs = graphs
        if spec.piecewise_sizes:
            self._capture_pieces(pool)
        if self.device.type == "cuda":  # Triton's kernels compile before the first request
            self.warm_up_kernels()
        if spec.graph_metrics and self.is_driver:
            graphs, pieces = self.runner.graphs, self.runner.piecewise
            captured = captured_graphs(graphs and graphs.sizes, pieces and pieces.sizes)
            self.runner.graph_metrics = GraphMetricsLog(captured)
        # Start-up is done: from now on the memory a step frees serves the next step.
        if self.device.type == "cpu" and self._heap_release is None and HOST_HEAP.hold():
            self._heap_release = weakref.finalize(self, HOST_HEAP.release)

    def _capture_pieces(self, pool: object | None) -> None:
        """Graphs of the steps decode graphs do not take, cut at attention (CUDA)."""
        assert self.runner is not None
        refusal = cuts_cleanly(self.runner.paged)
        if refusal is not None:
            logger.info("piecewise CUDA graphs off, mixed steps run eagerly: %s", refusal)
            return
        sizes = list(self.spec.piecewise_sizes)
        max_len = self.spec.max_positions - 1
        pieces = PiecewiseGraphs(self.runner.paged, sizes, max_len, CudaSegments(pool))
        if pieces.capture():
            self.runner.piecewise = pieces

    def warm_up_kernels(self) -> int:
        """``kernel_warm_up``'s dummy steps through the model and cache: the steps run (0
        where they do not apply: a pipeline stage, an encoder, multimodal rotary, whose
        steps are not plain text steps through every layer)."""
        runner, stage, spec = self.runner, pipeline_stage(), self.spec
        assert runner is not None, "initialize_cache() comes before the warm-up"
        whole = stage.is_first and stage.is_last
        if not whole or runner.is_encoder or runner.mrope is not None:
            return 0
        limits = StepLimits(self.step_tokens, spec.max_positions, spec.block_size)
        return warm_up_kernels(runner.paged, limits)

    def release_host_heap(self) -> None:
        """The engine stops: glibc's heap maps large allocations again (``host_heap``)."""
        if self._heap_release is not None:
            self._heap_release()  # a finalizer runs once

    @property
    def holds_heap(self) -> bool:
        return self._heap_release is not None and self._heap_release.alive

    def _proposer(self, num_blocks: int) -> Proposer | None:
        speculative, spec = self.spec.speculative, self.spec
        if speculative is None:
            return None
        if speculative.method == "ngram":
            return NgramStepProposer(
                NgramProposer(
                    speculative.num_speculative_tokens,
                    speculative.prompt_lookup_min,
                    speculative.prompt_lookup_max,
                )
            )
        shape = self._draft_cache_shape()
        assert self.draft is not None and shape is not None
        caches = allocate_kv_caches(
            shape, num_blocks, spec.block_size, spec.cache_dtype, self.device
        )
        attention = self.attention_backend()
        paged = PagedModel(self.draft, caches, spec.block_size, attention, self.device)
        return DraftModelProposer(paged, speculative.num_speculative_tokens)

    def _grammar_compiler(self) -> GrammarCompiler:
        spec = self.spec
        return shared_compiler(
            spec.folder,
            lambda: load_tokenizer(spec.folder, spec.tokenizer),
            spec.config.vocab_size,
            spec.eos_token_ids,
        )

    def kv_layout(self) -> KVLayout:
        """The whole cache's layout for P/D transfer (the same on every rank); ValueError
        naming why this model's cache cannot be moved."""
        refusal = self._kv_transfer_refusal()
        if refusal is not None:
            raise ValueError(f"KV transfer cannot move this model's cache: {refusal}")
        spec, config = self.spec, self.spec.config
        return KVLayout(
            model_fingerprint(config, spec.cache_dtype, spec.block_size),
            spec.block_size,
            config.num_layers,
            config.num_kv_heads,
            config.head_dim,
            str(spec.cache_dtype).removeprefix("torch."),
            tensor_parallel_group().size,
        )

    def _kv_transfer_refusal(self) -> str | None:
        if any(self.state_specs):
            return "it has state layers (a hybrid model's recurrent state is not in blocks)"
        if self.spec.kv_groups is not None:
            return "its layers share several KV cache groups (sliding and full attention)"
        if self.spec.config.kv_latent_dim:
            return "it caches MLA latents, not keys and values"
        if self.spec.draft is not None:
            return "speculative decoding with a draft model keeps a second cache"
        return None

    def kv_shard(self) -> KVShard:
        """The part of the whole cache this rank holds: its stage's layers, its KV heads."""
        tp = tensor_parallel_group()
        first_head, num_heads = kv_head_shard(self.spec.config.num_kv_heads, tp.size, tp.rank)
        layers = self.cache_shape.num_layers
        return KVShard(self.model.first_layer, layers, first_head, num_heads)

    def export_kv_blocks(self, block_ids: list[int]) -> list[torch.Tensor]:
        """This rank's slice of ``block_ids``, every layer it holds, copied to the host."""
        assert self.runner is not None, "initialize_cache() comes before KV transfer"
        return gather_blocks(self._kv_tensors(), block_ids)

    def import_kv_blocks(self, block_ids: list[int], layers: list[torch.Tensor]) -> None:
        """Write this rank's slice (``kv_shard``'s layers and heads) into ``block_ids``."""
        assert self.runner is not None, "initialize_cache() comes before KV transfer"
        scatter_blocks(self._kv_tensors(), block_ids, layers)

    def export_kv_blocks_packed(self, block_ids: list[int]) -> list[PackedTensor]:
        """``export_kv_blocks`` as bytes, for the pipe to the engine (worker processes)."""
        return [PackedTensor.pack(layer) for layer in self.export_kv_blocks(block_ids)]

    def import_kv_blocks_packed(self, block_ids: list[int], layers: list[PackedTensor]) -> None:
        """``import_kv_blocks`` from bytes sent down the pipe (worker processes)."""
        self.import_kv_blocks(block_ids, [layer.unpack() for layer in layers])

    def _kv_tensors(self) -> list[torch.Tensor]:
        assert self.runner is not None
        return [cache for cache in self.runner.kv_caches if isinstance(cache, torch.Tensor)]

    def execute_model(self, step: SchedulerOutput) -> ModelRunnerOutput | None:
        """The step's sampled tokens on the driver; ``None`` on the other ranks."""
        assert self.runner is not None, "initialize_cache() comes before the first step"
        output = self.runner.execute_model(step)
        return output if self.is_driver else None

    def execute_model_overlapped(self, step: SchedulerOutput) -> ModelRunnerOutput:
        """Async scheduling (one rank): launch ``step``, return the previous step's output."""
        assert self.runner is not None, "initialize_cache() comes before the first step"
        return self.runner.execute_model_overlapped(step)


def _rank_device(device: torch.device, local_rank: int) -> torch.device:
    """One GPU per rank of this host, by its index here (``CUDA_VISIBLE_DEVICES`` picks
    which); CPU is shared."""
    if device.type != "cuda":
        return device
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"
