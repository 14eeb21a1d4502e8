"""A CPU worker's heap keeps freed memory for the next step (octavo.worker.host_heap): a
tensor above glibc's mmap threshold, made again after it was freed, takes no page faults
while the heap is held, and is mapped afresh (faulted in page by page) once released.

glibc's state is the process's: its behaviour is measured in a fresh interpreter (a test
process holds the heap while any engine an earlier test made is alive)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from octavo.worker import host_heap
from octavo.worker.host_heap import HOST_HEAP, KeptHeap

GLIBC = pytest.mark.skipif(
    not sys.platform.startswith("linux") or host_heap._glibc() is None,
    reason="mallopt and malloc_trim are glibc's",
)
PAGES = (48 << 20) // 4096  # a 48 MiB tensor: above the 32 MiB glibc maps afresh at most

FAULTS_SCRIPT = textwrap.dedent(
    """
    import json, resource, torch
    from octavo.worker.host_heap import KeptHeap

    def faults():  # of the third of three 48 MiB tensors made, filled and freed in turn
        for _ in range(2):  # the first two after a hold may still come from fresh pages
            torch.empty(12 << 20).fill_(1.0)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(12 << 20).fill_(1.0)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    heap, seen = KeptHeap(), {"default": faults()}
    seen["hold"] = heap.hold() and heap.hold()  # two engines in one process share the hold
    seen["held"] = faults()
    heap.release()
    seen["one holder left"] = faults()
    heap.release()
    seen["released"] = faults()
    heap.release()  # one too many changes nothing
    seen["holders"] = heap.holders
    print(json.dumps(seen))
    """
)


@GLIBC
def test_a_held_heap_reuses_a_freed_large_tensor_and_a_released_one_maps_it_afresh():
    result = subprocess.run(
        [sys.executable, "-c", FAULTS_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["default"] > PAGES // 2, seen  # glibc's defaults: a fresh mapping each time
    assert seen["hold"] and seen["held"] < PAGES // 20, seen
    assert seen["one holder left"] < PAGES // 20, seen
    assert seen["released"] > PAGES // 2 and seen["holders"] == 0, seen


@GLIBC
def test_the_switch_leaves_glibcs_defaults(monkeypatch):
    monkeypatch.setenv(host_heap.SWITCH_ENV, "0")
    heap = KeptHeap()
    assert not heap.hold() and heap.holders == 0


@GLIBC
def test_a_cpu_engine_holds_the_heap_from_start_up_to_shutdown(tiny_folder):
    from octavo import LLM, SamplingParams

    before = HOST_HEAP.holders
    llm = LLM(
        model=str(tiny_folder("llama3")),
        dtype="float32",
        max_model_len=128,
        kv_cache_memory=8 << 20,
    )
    try:
        assert llm.engine.executor.worker.holds_heap and HOST_HEAP.holders == before + 1
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        (output,) = llm.generate([[1, 2, 3]], params, use_tqdm=False)
        assert len(output.outputs[0].token_ids) == 4
    finally:
        llm.shutdown()
    assert not llm.engine.executor.worker.holds_heap and HOST_HEAP.holders == before
    llm.shutdown()  # twice: released once
    assert HOST_HEAP.holders == before
