"""What a request reports: its metrics over its completions (the wire test of a step's
outputs is in test_delta_outputs.py, beside the engine it steps)."""

from __future__ import annotations

from octavo import SamplingParams
from octavo.engine.request import Request
from octavo.scheduler.sequence import Sequence, SequenceStatus


def test_metrics_of_one_and_of_several_completions():
    """One completion: its own times; n > 1: the latest token of any, every preemption."""
    params = SamplingParams(n=2)
    request = Request("r", None, [1, 2], params)
    first, second = (Sequence(i, "r", i, [1, 2], 2, params) for i in range(2))
    first.last_token_time, first.num_preemptions = 5.0, 1
    request.seqs = [first]
    assert not request.finished  # one of its two completions so far
    metrics = request._metrics()
    assert (metrics.last_token_time, metrics.num_preemptions) == (5.0, 1)
    second.last_token_time, second.num_preemptions = 7.0, 2
    request.seqs = [first, second]
    metrics = request._metrics()
    assert (metrics.last_token_time, metrics.num_preemptions) == (7.0, 3)
    first.status = second.status = SequenceStatus.FINISHED
    assert request.finished
