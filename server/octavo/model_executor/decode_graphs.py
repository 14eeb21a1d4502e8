"""Graphs of decode steps (vLLM's ``FULL_DECODE_ONLY``), replayed from persistent buffers.

A decode step's forward is a few hundred small kernel launches; replaying a captured graph
launches them all at once, so the host no longer paces the GPU. A graph reads fixed
addresses, so the step's inputs live in persistent buffers (``DecodeBuffers``) sized for
the largest captured batch, and each step copies its ids, positions, cache slots, block
tables and context lengths into their first rows. A batch is padded up to the nearest
captured size; the padding rows write no cache slot (slot ``-1``) and attend to one
position of the null block (block 0, never written), so they only cost their share of the
batched matmuls. Their logits are dropped before sampling.

Only a step where every row is one decode query fits: no prefill chunk, no LoRA, no
pooling or prompt scoring rows, a block table no wider than the buffers. Every other step
(and ``--enforce-eager``) runs eagerly. The graph covers embedding to logits; sampling
runs after it, outside.

``GraphRecorder`` is how a warmed-up forward becomes a replayable one: on a GPU a
``torch.cuda.CUDAGraph`` in one shared memory pool (``CudaGraphRecorder``); on CPU the
forward's op calls, recorded and replayed (``cpu_graphs.CpuGraphRecorder``). A recorder
that asks for it (``checks_replays``) has each size's replay compared once with an eager
forward on inputs unlike the recorded ones; a difference, or a padded forward that fails
or cannot be recorded, leaves every decode step eager.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from octavo.attention.metadata import AttentionMetadata
from octavo.model_executor.cpu_graphs import NotRecordable
from octavo.model_executor.models.causal_lm import StepResult
from octavo.model_executor.mrope_positions import supports_mrope
from octavo.model_executor.paged_model import PagedModel
from octavo.model_executor.step_inputs import StepInputs
from octavo.progress import PhaseReporter

logger = logging.getLogger(__name__)

Replay = Callable[[], torch.Tensor]  # runs the recorded forward; returns its logits


class GraphRecorder(Protocol):
    name: str  # what the log calls the graphs
    checks_replays: bool  # compare each size's replay with an eager forward once
    recorded_bytes: int  # memory the recordings keep, where the device cannot report it
    # each replay's output lives in memory every size shares, valid until the next replay
    # (else DecodeGraphs copies each size's logits into one buffer of its own)
    shares_outputs: bool

    # how many times the memory the recordings share was replaced by a larger one: a
    # recording made before the last replacement reads memory no longer shared
    arena_generation: int

    def record(self, forward: Replay) -> Replay:
        """Record ``forward`` (already warmed up once) and return its replay."""
        ...


class CudaGraphRecorder:
    """Captures into ``torch.cuda.CUDAGraph``s that share one memory pool."""

    name = "CUDA graphs"
    checks_replays = False  # a captured graph runs the kernels the eager forward queued
    recorded_bytes = 0  # the pool's memory is read from the device
    shares_outputs = False  # a graph's output stays allocated in the pool, one per size
    arena_generation = 0  # the pool grows in place

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def record(self, forward: Replay) -> Replay:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = forward()

        def replay() -> torch.Tensor:
            graph.replay()
            return logits

        return replay


@dataclass
class DecodeBuffers:
    """The inputs of every captured graph: row ``i`` of each is decode row ``i``."""

    input_ids: torch.Tensor  # [rows] int64
    positions: torch.Tensor  # [rows] int64; [3, rows] for an M-RoPE model
    slot_mapping: torch.Tensor  # [rows] int64, -1 on padding rows
    block_tables: torch.Tensor  # [rows, max_blocks] int32
    seq_lens: torch.Tensor  # [rows] int32, 1 on padding rows (the null block's slot 0)
    query_start_loc: torch.Tensor  # [rows + 1] int32: 0, 1, 2, ...
    logits_indices: torch.Tensor  # [rows] int64: 0, 1, 2, ...

    @classmethod
    def allocate(
        cls, rows: int, max_blocks: int, device: torch.device, mrope: bool = False
    ) -> DecodeBuffers:
        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        steps = torch.arange(rows + 1, device=device)
        return cls(
            input_ids=zeros(rows),
            positions=zeros(3, rows) if mrope else zeros(rows),
            slot_mapping=torch.full((rows,), -1, dtype=torch.long, device=device),
            block_tables=zeros(rows, max_blocks, dtype=torch.int32),
            seq_lens=torch.ones(rows, dtype=torch.int32, device=device),
            query_start_loc=steps.to(torch.int32),
            logits_indices=steps[:rows].clone(),
        )

    @property
    def max_blocks(self) -> int:
        return self.block_tables.shape[1]

    def load(self, inputs: StepInputs, size: int) -> None:
        """Copy the step's rows in and pad rows ``[rows, size)``."""
        rows, meta = inputs.input_ids.shape[0], inputs.meta
        self.input_ids[:rows].copy_(inputs.input_ids, non_blocking=True)
        self.positions[..., :rows].copy_(inputs.positions, non_blocking=True)
        self.slot_mapping[:rows].copy_(meta.slot_mapping, non_blocking=True)
        width = meta.block_tables.shape[1]
        self.block_tables[:rows, :width].copy_(meta.block_tables, non_blocking=True)
        self.seq_lens[:rows].copy_(meta.seq_lens, non_blocking=True)
        if size > rows:
            self.pad(rows, size)

    def pad(self, first: int, size: int) -> None:
        self.slot_mapping[first:size].fill_(-1)
        self.seq_lens[first:size].fill_(1)
        self.block_tables[first:size, 0].fill_(0)

    def metadata(self, size: int, max_seq_len: int) -> AttentionMetadata:
        """Decode-only metadata over the first ``size`` rows (host lists are placeholders:
        a graph's kernels read the device tensors)."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size],
            seq_lens=self.seq_lens[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            num_prefills=0,
            num_prefill_tokens=0,
            query_lens_list=[1] * size,
            query_start_loc_list=list(range(size)),
            seq_lens_list=[max_seq_len] * size,
            max_seq_len=max_seq_len,
        )


class DecodeGraphs:
    """One recorded decode forward per capture size, and the dispatch to them."""

    def __init__(
        self,
        paged: PagedModel,
        sizes: list[int],
        max_model_len: int,
        recorder: GraphRecorder,
        at_first_use: bool = False,
    ) -> None:
        self.paged, self.sizes, self.max_model_len = paged, sorted(sizes), max_model_len
        self.recorder, self.at_first_use = recorder, at_first_use
        max_blocks = math.ceil(max_model_len / paged.block_size)
        mrope = supports_mrope(paged.model)
        self.buffers = DecodeBuffers.allocate(self.sizes[-1], max_blocks, paged.device, mrope)
        self.replays: dict[int, Replay] = {}
        self.generations: dict[int, int] = {}  # size -> the arena generation it was recorded in
        self.off = False  # a forward could not be recorded: every decode step runs eagerly
        self.capture_seconds, self.capture_bytes = 0.0, 0
        self.logits: torch.Tensor | None = None  # [largest size, vocab]: every graph's output

    def capture(self) -> bool:
        """Warm up and record every size, largest first (smaller ones reuse its memory);
        with ``at_first_use`` none now (``ready`` records each). False, with every step left
        eager, where the forward cannot be recorded."""
        name = self.recorder.name
        if self.at_first_use:
            first, last = self.sizes[0], self.sizes[-1]
            logger.info("%s recorded at each batch size's first use (%d..%d)", name, first, last)
            return True
        start = time.perf_counter()
        free_before = _free_bytes(self.paged.device)
        try:
            with PhaseReporter(f"capturing {name}", len(self.sizes), "graphs") as progress:
                pending = list(reversed(self.sizes))
                while pending:
                    pending += self._record_size(pending.pop(0))
                    progress.update()
        except NotRecordable as reason:
            self._turn_off(reason)
            return False
        taken = free_before - _free_bytes(self.paged.device) + self.recorder.recorded_bytes
        seconds = time.perf_counter() - start
        logger.info(
            "captured %d %s (batch sizes %d..%d) in %.1f s, taking %.0f MiB",
            len(self.sizes),
            name,
            self.sizes[0],
            self.sizes[-1],
            seconds,
            taken / 2**20,
        )
        self.capture_seconds, self.capture_bytes = seconds, taken
        _freeze_heap()
        return True

    def ready(self, size: int) -> bool:
        """Is the graph of ``size`` rows there to replay? At its first use (``at_first_use``)
        it is recorded now; False, and every later step eager, where it cannot be."""
        if size in self.replays:
            return True
        if self.off or not self.at_first_use:
            return False
        start = time.perf_counter()
        self.buffers.pad(0, self.sizes[-1])  # the recording writes no sequence's cache slot
        try:
            self._record_size(size)
        except NotRecordable as reason:
            self._turn_off(reason)
            return False
        seconds = time.perf_counter() - start
        self.capture_seconds += seconds
        self.capture_bytes = self.recorder.recorded_bytes
        logger.info(
            "%s: batch size %d recorded at its first use in %.2f s (%d sizes kept, %.0f MiB)",
            self.recorder.name,
            size,
            seconds,
            len(self.replays),
            self.capture_bytes / 2**20,
        )
        _freeze_heap()
        return True

    def _record_size(self, size: int) -> list[int]:
        """Record ``size``; the sizes dropped because this recording replaced the arena
        they read (to be recorded again)."""
        self.replays[size] = self._record(size)
        generation = self.recorder.arena_generation
        self.generations[size] = generation
        stale = [other for other, made in self.generations.items() if made != generation]
        for other in stale:
            del self.replays[other], self.generations[other]
        return stale

    def _turn_off(self, reason: NotRecordable) -> None:
        self.replays.clear()
        self.generations.clear()
        self.off = True
        logger.info("%s off, decode steps run eagerly: %s", self.recorder.name, reason)

    def _record(self, size: int) -> Replay:
        forward = self._forward(size)
        checked = self.recorder.checks_replays
        try:
            # Warm up: compiles the Triton kernels and settles lazy allocations. A checked
            # recorder warms up on the largest size only (a replay that a later lazy step
            # made wrong fails its check), saving a forward a size at start-up.
            if not (checked and self.replays):
                forward()
            replay = self.recorder.record(forward)
        except NotRecordable:
            raise
        except Exception as error:  # e.g. the torch path, whose KV store takes no slot -1
            if not checked:
                raise
            failure = f"{type(error).__name__}: {error}"
            raise NotRecordable(f"the padded forward failed: {failure}") from error
        if checked:
            self._check(size, forward, replay)
        return replay

    def _check(self, size: int, forward: Replay, replay: Replay) -> None:
        """The replay must give the eager forward's logits, bit for bit, on random token
        ids and positions (padding rows: no cache slot is written)."""
        buffers, generator = self.buffers, torch.Generator().manual_seed(size)
        ids, positions = buffers.input_ids[:size], buffers.positions[..., :size]
        vocab = self.paged.model.config.vocab_size
        ids.copy_(torch.randint(vocab, ids.shape, generator=generator))
        positions.copy_(torch.randint(self.max_model_len, positions.shape, generator=generator))
        expected = forward().clone()
        replayed = replay()
        ids.zero_()
        positions.zero_()
        if not torch.equal(expected, replayed):
            raise NotRecordable(f"the replay of batch size {size} differs from the forward")

    def _forward(self, size: int) -> Replay:
        buffers = self.buffers

        def forward() -> torch.Tensor:
            meta = buffers.metadata(size, self.max_model_len)
            result = self.paged.model.run(
                buffers.input_ids[:size],
                buffers.positions[..., :size],
                self.paged.kv_caches,
                meta,
                self.paged.attention,
                buffers.logits_indices[:size],
            )
            assert isinstance(result, StepResult) and result.logits is not None
            if self.recorder.shares_outputs:
                return result.logits
            return self._logits_rows(size, result.logits)

        return forward

    def _logits_rows(self, size: int, logits: torch.Tensor) -> torch.Tensor:
        """Every graph writes its logits into one shared buffer: a graph's own output would
        stay allocated in the pool for each size (vocabulary x batch x 4 bytes apiece)."""
        if self.logits is None:
            rows = (self.sizes[-1], logits.shape[1])
            self.logits = torch.empty(rows, dtype=logits.dtype, device=logits.device)
        out = self.logits[:size]
        out.copy_(logits)
        return out

    def size_for(self, inputs: StepInputs) -> int | None:
        """The capture size this step replays, or None when it must run eagerly."""
        meta, rows = inputs.meta, inputs.input_ids.shape[0]
        fits = (
            meta.num_prefills == 0
            and meta.num_seqs == rows
            and inputs.logits_indices.shape[0] == rows
            and not inputs.scored
            and inputs.lora is None
            and inputs.pooled_indices is None
            and meta.block_tables.shape[1] <= self.buffers.max_blocks
            and rows <= self.sizes[-1]
        )
        if not fits or self.off:
            return None
        return next(size for size in self.sizes if size >= rows)

    def run(self, inputs: StepInputs, size: int) -> StepResult:
        """The step's logits, from the graph of ``size`` rows."""
        rows = inputs.input_ids.shape[0]
        self.buffers.load(inputs, size)
        logits = self.replays[size]()
        return StepResult(logits[:rows])


def _freeze_heap() -> None:
    """The recordings hold thousands of objects for the server's life: out of the garbage
    collector's full passes (vLLM freezes after capture too). Without it a CPU decode step
    of 64 rows spent 5.1 ms a step in collections (0.3 ms frozen)."""
    gc.collect()
    gc.freeze()


def _free_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    return torch.cuda.mem_get_info(device)[0]
