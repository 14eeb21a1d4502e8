"""CPU decode graphs (``model_executor/cpu_graphs.py``): a forward's op calls recorded under
a dispatch mode and replayed; what a replay runs, and what cannot be recorded."""

from __future__ import annotations

import pytest
import torch

from octavo.model_executor.cpu_graphs import CpuGraphRecorder, NotRecordable
from octavo.model_executor.tape_memory import ALIGNMENT, Lifetime, plan_offsets


def test_a_replay_runs_only_the_ops_that_write_data_on_the_new_inputs():
    x, weight = torch.zeros(4, 6), torch.randn(6)
    out = torch.empty(4, 6)

    def forward() -> torch.Tensor:
        y = x.view(2, 12).view(4, 6)  # views: their memory is x's
        scaled = torch.empty(4, 6)  # an allocation: kept, not redone
        torch.mul(y, weight, out=scaled)
        rows = scaled[torch.tensor([3, 0])]  # integer indices (a constant): a known shape
        out[:2].copy_(rows + 1)
        return out

    recorder = CpuGraphRecorder()
    tape = recorder.record(forward)
    assert [str(step.op) for step in tape.steps] == [
        "aten.mul.out",
        "aten.index.Tensor_out",  # functional ops write their recorded results in place
        "aten.add.out",
        "aten.copy_.default",
    ]
    assert all(step.outputs is None for step in tape.steps)
    # the allocation and the two functional results, the first two alive together
    assert recorder.recorded_bytes >= 4 * 6 * 4 + 2 * 6 * 4
    fresh = torch.randn(4, 6)
    x.copy_(fresh)
    replayed = tape()
    assert replayed is out
    torch.testing.assert_close(out[:2], (fresh * weight)[[3, 0]] + 1, rtol=0, atol=0)


def test_a_view_op_that_copies_is_replayed_and_one_that_aliases_is_not():
    """``contiguous`` is a view op that copies a strided tensor (QK norms over a slice of
    the fused projection): a replay must copy again; of a dense tensor it is itself. Under
    inference mode (the engine's steps) the dispatcher shows ``contiguous`` itself."""
    fused = torch.zeros(4, 6)

    def forward() -> torch.Tensor:
        query = fused[:, :2].contiguous()  # a copy: replayed
        dense = fused.contiguous()  # the tensor itself: nothing to replay
        return query.pow(2) + dense[:, 2:4]

    with torch.inference_mode():
        tape = CpuGraphRecorder().record(forward)
        ops = [str(step.op) for step in tape.steps]
        assert ops.count("aten.contiguous.default") == 1  # the strided one
        fresh = torch.randn(4, 6)
        fused.copy_(fresh)
        expected = fresh[:, :2].pow(2) + fresh[:, 2:4]
        torch.testing.assert_close(tape(), expected, rtol=0, atol=0)


def test_a_functional_op_without_an_out_variant_copies_its_fresh_results():
    x = torch.zeros(3, 4)

    def forward() -> torch.Tensor:
        values, _ = x.max(dim=1)  # two results: no single-out overload
        return values.to(torch.float64)  # _to_copy.out: the dtype is the out tensor's

    tape = CpuGraphRecorder().record(forward)
    assert [str(step.op) for step in tape.steps] == ["aten.max.dim", "aten._to_copy.out"]
    assert tape.steps[0].outputs is not None
    x.copy_(torch.arange(12.0).view(3, 4))
    replayed = tape()
    assert replayed.dtype == torch.float64 and replayed.tolist() == [3.0, 7.0, 11.0]


def test_a_recorded_argument_keeps_its_shape_at_the_call():
    """An in-place view op after the call (``unsqueeze_``) must not change what a replay
    passes to the ops recorded before it."""
    x = torch.zeros(3)
    out = torch.empty(3)

    def forward() -> torch.Tensor:
        view = x.view(3)
        torch.neg(view, out=out)
        view.unsqueeze_(0)
        return out

    tape = CpuGraphRecorder().record(forward)
    x.copy_(torch.tensor([1.0, 2.0, 3.0]))
    assert tape().tolist() == [-1.0, -2.0, -3.0]


@pytest.mark.parametrize(
    "read, op",
    [
        (lambda x: x.sum().item(), "_local_scalar_dense"),  # a value on the host
        (lambda x: x[x > 0], "index.Tensor"),  # a boolean mask: the shape is the data's
        (lambda x: x.nonzero(), "nonzero"),
    ],
)
def test_a_forward_whose_host_side_reads_values_is_not_recordable(read, op):
    x = torch.ones(4)
    with pytest.raises(NotRecordable, match=f"{op}.*tensor values on the host"):
        CpuGraphRecorder().record(lambda: read(x))


def test_planned_allocations_share_bytes_only_when_their_uses_do_not_overlap():
    first, second = Lifetime(100, 0, 2), Lifetime(300, 3, 5)  # one after the other
    during = Lifetime(40, 2, 4)  # alive while each of them is
    size = plan_offsets([first, second, during])
    assert first.offset == second.offset == 0
    assert during.offset == 320 and during.offset % ALIGNMENT == 0  # 300 bytes, aligned up
    assert size == during.offset + 40
    through = Lifetime(64, 0, 9)  # alive through two that take turns at offset 0
    assert plan_offsets([Lifetime(64, 0, 1), Lifetime(64, 2, 3), through]) == 128
    assert through.offset == 64


def test_a_chain_of_activations_replays_from_an_arena_of_two_of_them():
    """Eight layers' activations, each dead once the next is computed: a recording keeps
    two at a time (its output one of them, alive to its end), a smaller size recorded after
    it reuses the same arena, and both replay the chain exactly on new inputs."""
    x, weights = torch.zeros(16, 32), [torch.randn(32, 32) / 6 for _ in range(8)]

    def forward(rows: int) -> torch.Tensor:
        hidden = x[:rows]
        for weight in weights:
            hidden = torch.relu(hidden @ weight)  # two allocations a layer
        return hidden

    recorder = CpuGraphRecorder()
    tapes = {rows: recorder.record(lambda rows=rows: forward(rows)) for rows in (16, 4)}
    assert recorder.recorded_bytes == 2 * 16 * 32 * 4  # 16 activations recorded, 2 kept
    fresh = torch.randn(16, 32)
    x.copy_(fresh)
    expected = fresh
    for weight in weights:
        expected = torch.relu(expected @ weight)
    for rows, tape in tapes.items():
        replayed = tape()
        assert replayed.untyped_storage().data_ptr() == recorder.arena.data_ptr()
        torch.testing.assert_close(replayed, expected[:rows], rtol=0, atol=0)
