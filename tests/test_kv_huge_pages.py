"""The CPU KV cache on 2 MiB pages (octavo.kv_cache.huge_pages): the tensors come zeroed,
and on Linux their memory carries the MADV_HUGEPAGE advice ("hg" in /proc/self/smaps)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest
import torch

from octavo.kv_cache.cache_tensors import allocate_kv_caches
from octavo.kv_cache.huge_pages import HUGE_PAGE, advise_huge_pages, zeros_on_huge_pages

LINUX = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="madvise and /proc/self/smaps are Linux's"
)


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping that holds `address`."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                low, high = (int(part, 16) for part in fields[0].split("-"))
                inside = low <= address < high
            elif inside and fields[0] == "VmFlags:":
                return fields[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


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
