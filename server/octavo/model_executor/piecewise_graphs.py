"""Graphs of the steps decode graphs cannot take: everything but attention (vLLM's piecewise
CUDA graphs, its default around attention).

A step with a prompt chunk is not one decode query per row, so no decode graph serves it
and it ran eagerly, its decode rows too: on an H200 the 1B shape's eager decode step cost
8.5 ms against 1.9 ms replayed, the host launching a few hundred kernels one by one. Here
such a step (up to the largest capture size in tokens) replays graphs of the model's layers
cut at each attention call: graph 0 runs the embedding to the first layer's query, key and
value; attention then runs eagerly over the step's own metadata (any mix of chunks and
decodes, any block table); graph 1 runs the output projection, the MLP and the next
layer's projections; and so on. The final norm and LM head run eagerly too, on the step's
sampled rows only.

The cut is made while recording: the model's forward runs once per capture size with
``HoleAttention`` as its attention backend, which ends the current recording, notes the
attention call's query, key and value tensors and returns a persistent output buffer,
then starts the next recording. A replay feeds the step's ids and positions into the
first rows of persistent buffers (the rest padding: position 0, token 0), replays graph
``i``, runs hole ``i``'s attention on the real rows into its buffer, and so on. Padding
rows reach no attention and no cache slot; their rows of the layers' matmuls are dropped.

Only models whose layers touch the step's metadata in their attention call alone are
cut: no state layers (their mixers read slots), no latent attention, no multimodal
rotary, one rank. At start-up the largest size's replay must give the eager forward's
logits bit for bit, else mixed steps stay eager (the log says why).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch

from octavo.attention.backend import AttentionBackend
from octavo.attention.kv_quant import UNIT_SCALES, KVScales
from octavo.attention.metadata import AttentionMetadata
from octavo.attention.options import FULL_ATTENTION, AttentionOptions
from octavo.model_executor.cpu_graphs import NotRecordable
from octavo.model_executor.dummy_steps import (
    DummyShape,
    blocks_needed,
    dummy_inputs,
    prompt_chunks,
)
from octavo.model_executor.models.causal_lm import StepResult
from octavo.model_executor.mrope_positions import supports_mrope
from octavo.model_executor.paged_model import PagedModel
from octavo.model_executor.step_inputs import StepInputs
from octavo.progress import PhaseReporter

logger = logging.getLogger(__name__)

Segment = Callable[[], None]  # replays one recorded piece of the forward


class SegmentRecorder(Protocol):
    """Records the forward between two attention calls (the engine's: ``CudaSegments``)."""

    name: str

    def begin(self) -> None: ...

    def end(self) -> Segment: ...

    def recording(self) -> contextlib.AbstractContextManager:
        """The context a whole recording (its eager warm-up too) runs in."""
        ...


class CudaSegments:
    """Each piece a ``torch.cuda.CUDAGraph``, all in one memory pool, captured on a side
    stream (``capture`` enters it for the whole forward)."""

    name = "piecewise CUDA graphs"

    def __init__(self, pool: object | None = None) -> None:
        self.pool = torch.cuda.graph_pool_handle() if pool is None else pool
        self.stream = torch.cuda.Stream()
        self.graph: torch.cuda.CUDAGraph | None = None

    def begin(self) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.graph.capture_begin(pool=self.pool)

    def end(self) -> Segment:
        graph, self.graph = self.graph, None
        assert graph is not None, "end() follows begin()"
        graph.capture_end()
        return graph.replay

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """The side stream, after the device's earlier work and before its later work."""
        torch.cuda.synchronize()
        with torch.cuda.stream(self.stream):
            yield
        torch.cuda.synchronize()


@dataclass
class Hole:
    """One attention call cut out of the recording: its inputs as recorded (persistent
    tensors a replay refills) and the buffer its output goes to."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    kv_cache: torch.Tensor
    scale: float
    kv_scales: KVScales
    options: AttentionOptions
    out: torch.Tensor  # [size, heads, head_dim], a view of the layer's persistent buffer

    def run(self, backend: AttentionBackend, meta: AttentionMetadata, rows: int) -> None:
        """Attention of the step's ``rows`` real tokens into the first rows of ``out``."""
        result = backend.forward(
            self.query[:rows],
            self.key[:rows],
            self.value[:rows],
            self.kv_cache,
            meta,
            self.scale,
            self.kv_scales,
            self.options,
        )
        self.out[:rows].copy_(result.view(rows, *self.out.shape[1:]))


@dataclass
class HoleAttention:
    """The attention backend while recording: cuts the recording at each call."""

    recorder: SegmentRecorder
    outputs: list[torch.Tensor]  # per attention layer: [largest size, heads, head_dim]
    size: int
    segments: list[Segment] = field(default_factory=list)
    holes: list[Hole] = field(default_factory=list)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales = UNIT_SCALES,
        options: AttentionOptions = FULL_ATTENTION,
    ) -> torch.Tensor:
        self.segments.append(self.recorder.end())
        out = self.outputs[len(self.holes)][: self.size]
        self.holes.append(Hole(query, key, value, kv_cache, scale, kv_scales, options, out))
        self.recorder.begin()
        return out


@dataclass
class Piece:
    """One capture size: its segments (one more than its holes) and the final hidden
    states and residual the last segment leaves."""

    segments: list[Segment]
    holes: list[Hole]
    hidden: torch.Tensor
    residual: torch.Tensor | None


def cuts_cleanly(paged: PagedModel) -> str | None:
    """Why the model cannot be cut at its attention calls, or None where it can."""
    model = paged.model
    if any(layer.is_state_layer for layer in model.layers):
        return "state layers read the step's slots outside attention"
    if model.config.kv_latent_dim is not None:
        return "latent attention reads the step's metadata in its own layer"
    if getattr(model, "is_encoder", False):
        return "an encoder's steps are whole prompts"
    if supports_mrope(model):
        return "multimodal rotary positions are rows of three"
    if not (model.stage.is_first and model.stage.is_last):
        return "a pipeline stage"
    return None


class PiecewiseGraphs:
    """One recorded forward per capture size (in tokens), cut at the attention calls."""

    def __init__(
        self, paged: PagedModel, sizes: list[int], max_model_len: int, recorder: SegmentRecorder
    ) -> None:
        self.paged, self.sizes, self.recorder = paged, sorted(sizes), recorder
        self.max_model_len = max_model_len  # the dummy steps' prompts are no longer
        largest, device = self.sizes[-1], paged.device
        self.input_ids = torch.zeros(largest, dtype=torch.long, device=device)
        self.positions = torch.zeros(largest, dtype=torch.long, device=device)
        self.outputs: list[torch.Tensor] = []  # each attention layer's, made while recording
        self.pieces: dict[int, Piece] = {}
        self.capture_seconds = 0.0
        self.refusal: str | None = None  # why capture() left the steps eager

    def capture(self) -> bool:
        """Record every size, largest first, and check the largest against the eager
        forward; False (every mixed step eager) where the model cannot be recorded."""
        start, name = time.perf_counter(), self.recorder.name
        try:
            with PhaseReporter(f"capturing {name}", len(self.sizes), "sizes") as progress:
                for size in reversed(self.sizes):
                    self.pieces[size] = self._record(size)
                    progress.update()
            self._check_largest()
        except Exception as error:  # NotRecordable, a capture the device refused, ...
            self.pieces.clear()
            self.outputs.clear()
            self.refusal = f"{type(error).__name__}: {error}"
            logger.warning("%s off, mixed steps run eagerly: %s", name, self.refusal)
            return False
        self.capture_seconds = time.perf_counter() - start
        logger.info(
            "captured %s for %d step sizes (%d..%d tokens) in %.1f s",
            name,
            len(self.sizes),
            self.sizes[0],
            self.sizes[-1],
            self.capture_seconds,
        )
        return True

    def _record(self, size: int) -> Piece:
        """Warm the size up eagerly (pieces and all), then record it cut at attention."""
        ids, positions = self.input_ids[:size], self.positions[:size]
        meta = dummy_inputs(self.paged, checking_shape(size, self.max_model_len)).meta  # unread
        with torch.inference_mode(), self.recorder.recording():
            self._pieces_eagerly(ids, positions, meta, size)
            holes = HoleAttention(self.recorder, self.outputs, size)
            self.recorder.begin()
            try:
                hidden, residual = self.paged.model.hidden_states(
                    ids, positions, self.paged.kv_caches, meta, holes
                )
            finally:  # a recording left open would hold the device (or the dispatcher)
                holes.segments.append(self.recorder.end())
        return Piece(holes.segments, holes.holes, hidden, residual)

    def _pieces_eagerly(self, ids, positions, meta, size: int) -> None:
        """The forward between the cuts, run once without recording (Triton compiles, the
        GEMM libraries pick their kernels), the outputs' buffers made on the first."""
        passing = PassingAttention(self.outputs, size)
        self.paged.model.hidden_states(ids, positions, self.paged.kv_caches, meta, passing)

    def size_for(self, inputs: StepInputs) -> int | None:
        """The capture size this step replays, or None when it must run eagerly."""
        tokens = inputs.input_ids.shape[0]
        fits = (
            self.pieces
            and tokens <= self.sizes[-1]
            and inputs.positions.dim() == 1
            and inputs.lora is None
            and inputs.image_embeds is None
            and inputs.token_type_ids is None
        )
        if not fits:
            return None
        return next(size for size in self.sizes if size >= tokens)

    def run(self, inputs: StepInputs, size: int) -> StepResult:
        """The step through the pieces of ``size`` tokens, attention on its own rows."""
        rows, piece = inputs.input_ids.shape[0], self.pieces[size]
        self.input_ids[:rows].copy_(inputs.input_ids, non_blocking=True)
        self.positions[:rows].copy_(inputs.positions, non_blocking=True)
        if size > rows:
            self.input_ids[rows:size].zero_()
            self.positions[rows:size].zero_()
        meta = inputs.meta
        metas = meta.layer_metas or [meta] * len(piece.holes)  # KV cache groups: their own
        with torch.inference_mode():
            for segment, hole, layer_meta in zip(piece.segments, piece.holes, metas, strict=False):
                segment()
                hole.run(self.paged.attention, layer_meta, rows)
            piece.segments[-1]()
            return self.paged.model.final(
                piece.hidden, piece.residual, inputs.logits_indices, inputs.pooled_indices
            )

    def _check_largest(self) -> None:
        """``_check`` the largest size whose checking step the cache holds."""
        blocks, size = self.paged.block_size, self.sizes[0]
        for candidate in self.sizes:
            shape = checking_shape(candidate, self.max_model_len)
            if blocks_needed(shape, blocks) <= cache_blocks(self.paged):
                size = candidate
        self._check(size)

    def _check(self, size: int) -> None:
        """A mixed step of ``size`` tokens (prompt chunks and decode rows, each on blocks of
        its own) replayed must give the eager forward's logits bit for bit."""
        inputs = checking_step(size, self.paged, self.max_model_len)
        with torch.inference_mode():
            expected = self.paged.run(inputs).logits.clone()
        replayed = self.run(inputs, size).logits
        if not torch.equal(expected, replayed):
            worst = (expected - replayed).abs().max().item()
            raise NotRecordable(f"the replay of {size} tokens differs from the forward ({worst})")


@dataclass
class PassingAttention:
    """The attention backend of the eager warm-up: no attention, each layer's output buffer
    (made on first use, zeros) returned as its result."""

    outputs: list[torch.Tensor]
    size: int
    calls: int = 0

    def forward(self, query: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if self.calls == len(self.outputs):
            shape = (self.size, *query.shape[1:])
            self.outputs.append(torch.zeros(shape, dtype=query.dtype, device=query.device))
        out = self.outputs[self.calls][: self.size]
        self.calls += 1
        return out


def checking_shape(size: int, max_model_len: int) -> DummyShape:
    """A mixed step of ``size`` tokens: prompt chunks of at most ``max_model_len`` tokens
    and, from 4 tokens, two decoding rows."""
    decodes = [(min(20, max_model_len - 1), 1), (min(37, max_model_len - 1), 1)]
    decodes = decodes if size >= 4 else []
    chunks = [(0, chunk) for chunk in prompt_chunks(size - len(decodes), max_model_len)]
    return DummyShape(tuple(chunks + decodes))


def checking_step(size: int, paged: PagedModel, max_model_len: int) -> StepInputs:
    """``checking_shape`` on blocks of its own (no two tokens race for a slot)."""
    return dummy_inputs(paged, checking_shape(size, max_model_len), distinct=True)


def cache_blocks(paged: PagedModel) -> int:
    """Blocks a dummy step may take (the null block left out)."""
    return min(cache.shape[1] for cache in paged.kv_caches) - 1
