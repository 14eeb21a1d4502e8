"""The CPU KV cache on 2 MiB pages (octavo.kv_cache.huge_pages): the tensors come zeroed,
on Linux their memory carries the MADV_HUGEPAGE advice ("hg" in /proc/self/smaps) and is
resident before anything is written to it (MADV_POPULATE_WRITE, Linux 5.14)."""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass

import pytest
import torch

from octavo.kv_cache.cache_tensors import allocate_kv_caches
from octavo.kv_cache.huge_pages import HUGE_PAGE, advise_huge_pages, zeros_on_huge_pages

LINUX = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="madvise and /proc/self/smaps are Linux's"
)


def smaps_entry(address: int) -> dict[str, list[str]]:
    """The /proc/self/smaps fields of the mapping that holds `address` ("Rss:" -> ["8192",
    "kB"], "VmFlags:" -> its flags)."""
    entry: dict[str, list[str]] | None = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                if entry is not None:
                    return entry
                low, high = (int(part, 16) for part in fields[0].split("-"))
                entry = {"range": [str(high - low)]} if low <= address < high else None
            elif entry is not None:
                entry[fields[0]] = fields[1:]
    if entry is None:
        raise AssertionError(f"no mapping holds {address:#x}")
    return entry


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping that holds `address`."""
    return smaps_entry(address)["VmFlags:"]


def populates_on_advice() -> bool:
    """MADV_POPULATE_WRITE exists from Linux 5.14."""
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    return (major, minor) >= (5, 14)


@dataclass
class Shape:
    num_layers: int = 2
    num_kv_heads: int = 3
    head_dim: int = 64


@LINUX
def test_kv_caches_on_cpu_are_zeroed_and_advised_huge():
    caches = allocate_kv_caches(Shape(), 1024, 16, torch.bfloat16, "cpu")
    assert [tuple(cache.shape) for cache in caches] == [(2, 1024, 16, 3, 64)] * 2
    for cache in caches:
        assert not cache.any()
        assert "hg" in vm_flags(cache.data_ptr() + cache.nbytes // 2)


@LINUX
def test_advice_needs_a_whole_huge_page_of_a_cpu_tensor():
    assert not advise_huge_pages(torch.empty(HUGE_PAGE // 8, dtype=torch.uint8))
    assert not advise_huge_pages(torch.empty(0))
    tensor = zeros_on_huge_pages((3, HUGE_PAGE), torch.uint8)
    assert tensor.shape == (3, HUGE_PAGE) and not tensor.any()
    assert "hg" in vm_flags(tensor.data_ptr() + HUGE_PAGE)


@LINUX
@pytest.mark.skipif(not populates_on_advice(), reason="MADV_POPULATE_WRITE needs Linux 5.14")
def test_the_cache_is_resident_before_its_first_write():
    tensor = zeros_on_huge_pages((8, HUGE_PAGE), torch.uint8)
    entry = smaps_entry(tensor.data_ptr())
    assert int(entry["range"][0]) == 8 * HUGE_PAGE  # a mapping of its own
    assert int(entry["Rss:"][0]) * 1024 == 8 * HUGE_PAGE  # every page faulted in, none written
    assert not tensor.any()
