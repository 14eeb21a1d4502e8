"""A CPU worker's heap keeps freed memory for the next step (octavo.worker.host_heap): a
tensor above glibc's mmap threshold, made again after it was freed, takes no page faults
while the heap is held, and is mapped afresh (faulted in page by page) once released.

glibc's state is the process's: its behaviour is measured in a fresh interpreter (a test
process holds the heap while any engine an earlier test made is alive)."""

from __future__ import annotations

import ctypes
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

# The script imports the engine first, as every process that holds the heap has (the engine
# core, a worker; `import octavo.worker.host_heap` pulled it in until octavo/__init__ became
# lazy). In an interpreter that imported torch alone, glibc served the held 48 MiB tensors
# with fresh pages (12,288 faults each) in 3 of 5 runs; with the engine imported, in none of
# 5 (the heap's layout differs: glibc's main arena takes a mapping when brk cannot grow).
HEAP_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, resource, torch
    import octavo.engine.llm_engine
    from octavo.worker.host_heap import KeptHeap

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = MallInfo2

    def faults(count=8):  # of each of `count` 48 MiB tensors made, filled and freed in turn
        seen = []
        for _ in range(count):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            torch.empty(12 << 20).fill_(1.0)
            seen.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return seen

    def mapped(mib):  # whether a tensor larger than any freed so far gets a mapping of its own
        before = mallinfo2().hblkhd
        tensor = torch.empty(mib << 18)
        return mallinfo2().hblkhd - before >= mib << 20

    heap, seen = KeptHeap(), {"default": faults(), "default mapped": mapped(64)}
    seen["hold"] = heap.hold() and heap.hold()  # two engines in one process share the hold
    seen["held"], seen["held mapped"] = faults(16), mapped(96)
    heap.release()
    seen["one holder left"], seen["one holder mapped"] = faults(), mapped(128)
    heap.release()
    seen["released mapped"] = mapped(256)
    heap.release()  # one too many changes nothing
    seen["holders"] = heap.holders
    print(json.dumps(seen))
    """
)


def median(values: list[int]) -> int:
    return sorted(values)[len(values) // 2]


@GLIBC
def test_a_held_heap_reuses_freed_large_tensors_and_a_released_one_maps_them_again():
    """glibc's defaults map each 48 MiB tensor afresh (faulted in page by page). Held, the
    heap maps none and the freed memory serves the next tensor. The first few after the hold
    may still take fresh pages while the heap's free chunks settle (1-2 measured on an idle
    machine, 5 in a loaded CI run), so of 16 most must take none. Released, a tensor larger
    than any freed one is mapped again (what a freed chunk in the heap can hold it still may)."""
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip(reason="mallinfo2 is glibc 2.33's")
    result = subprocess.run(
        [sys.executable, "-c", HEAP_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert min(seen["default"]) > PAGES // 2 and seen["default mapped"], seen
    assert seen["hold"] and median(seen["held"]) < PAGES // 20, seen
    assert not seen["held mapped"] and not seen["one holder mapped"], seen
    assert median(seen["one holder left"]) < PAGES // 20, seen
    assert seen["released mapped"] and seen["holders"] == 0, seen


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
