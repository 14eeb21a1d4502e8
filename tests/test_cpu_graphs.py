"""CPU decode graphs (``model_executor/cpu_graphs.py``): a forward's op calls recorded under
a dispatch mode and replayed; what a replay runs, and what cannot be recorded."""

from __future__ import annotations

import pytest
import torch

from octavo.model_executor.cpu_graphs import CpuGraphRecorder, NotRecordable


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
        "aten.index.Tensor",
        "aten.add.Tensor",
        "aten.copy_.default",
    ]
    assert recorder.recorded_bytes >= 4 * 6 * 4  # the allocation and the functional results
    fresh = torch.randn(4, 6)
    x.copy_(fresh)
    replayed = tape()
    assert replayed is out
    torch.testing.assert_close(out[:2], (fresh * weight)[[3, 0]] + 1, rtol=0, atol=0)


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
