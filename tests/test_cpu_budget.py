"""The CPU KV budget counts the weights as stored: a tied LM head's oneDNN-prepacked copy
(beside the embedding table the lookup reads) is part of the footprint the start-up
check and the load log use, and a cache that cannot fit next to it is refused; so are
the steps' activations."""

from __future__ import annotations

import logging

import pytest
import torch

from octavo import LLM
from octavo.kernels.cpu_features import PREPACK_ENV
from octavo.kv_cache import cpu_budget
from octavo.kv_cache.cpu_budget import HostMemory, HostNeeds, cgroup_memory_limit, cpu_kv_bytes
from octavo.model_executor.layers.linear_method import can_pack
from octavo.model_executor.loader import weight_footprint

MiB = 2**20
KV = 4 * MiB
ENGINE = {"dtype": "float32", "max_model_len": 128, "kv_cache_memory": KV, "device": "cpu"}

needs_packing = pytest.mark.skipif(
    not can_pack(torch.float32, torch.device("cpu")),
    reason="this torch has no oneDNN (mkldnn) linear prepacking: nothing is copied",
)


@needs_packing
def test_a_tied_heads_packed_copy_is_counted_and_logged(tiny_folder, caplog):
    caplog.set_level(logging.INFO, logger="octavo.model_executor.loader")
    with LLM(str(tiny_folder("llama3")), **ENGINE) as llm:
        model = llm.engine.executor.worker.model
        footprint = weight_footprint(model)
    table = model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    assert model.lm_head.weight is None and model.lm_head.packed_weight is not None
    assert footprint.copies >= table  # the head's packed copy of the table
    assert footprint.prepacked >= footprint.copies  # (the other linears are packed too)
    assert footprint.total >= footprint.prepacked + table  # the table beside its copy
    lines = [r.getMessage() for r in caplog.records if "prepacked copies" in r.getMessage()]
    expected = f"weights {footprint.total / MiB:.1f} MiB incl. {footprint.copies / MiB:.1f} MiB"
    assert lines and expected in lines[-1]


@needs_packing
def test_a_cache_that_fits_only_without_the_copy_is_refused(tiny_folder, monkeypatch):
    folder = str(tiny_folder("llama3"))
    monkeypatch.setenv(PREPACK_ENV, "0")
    with LLM(folder, **ENGINE) as llm:
        model = llm.engine.executor.worker.model
        unpacked = weight_footprint(model)
        activations = llm.engine.executor.worker.host_needs.activations
    table = model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    assert unpacked.prepacked == unpacked.copies == 0
    # room for the unpacked weights, the steps and the cache, not for the head's packed copy
    limit = unpacked.total + activations + KV + table // 2
    monkeypatch.setattr(HostMemory, "read", classmethod(lambda cls: HostMemory(limit, "test")))
    with LLM(folder, **ENGINE):
        pass
    monkeypatch.delenv(PREPACK_ENV)
    with pytest.raises(ValueError, match=r"does not fit in this host's memory.*prepacked"):
        LLM(folder, **ENGINE)


def test_the_budget_arithmetic():
    host = HostMemory(10 * MiB, "cgroup memory limit")
    needs = HostNeeds(weights=3 * MiB, copies=2 * MiB, activations=1 * MiB)
    assert cpu_kv_bytes(6 * MiB, needs, host) == 6 * MiB  # exactly full
    with pytest.raises(ValueError, match=r"cgroup memory limit is 0\.01 GiB.*activations"):
        cpu_kv_bytes(6 * MiB + 1, needs, host)
    assert cpu_kv_bytes(1 << 40, HostNeeds(1 << 40, 0), None) == 1 << 40  # size unknown


def test_the_steps_activations_are_counted(tiny_folder, monkeypatch):
    """A cache that fits beside the weights but not beside the largest step's activations
    (its token budget's rows, max_num_seqs sampled rows over the vocabulary) is refused."""
    folder = str(tiny_folder("llama3"))
    with LLM(folder, **ENGINE) as llm:
        needs = llm.engine.executor.worker.host_needs
    weights, activations = needs.weights, needs.activations
    assert activations > 4 * MiB  # 256 sampled rows' fp32 copies of the vocabulary
    limit = weights + KV + activations // 2
    monkeypatch.setattr(HostMemory, "read", classmethod(lambda cls: HostMemory(limit, "test")))
    with pytest.raises(ValueError, match=r"the steps' activations 0\.\d\d GiB"):
        LLM(folder, **ENGINE)


def test_a_cgroup_limit_below_the_machines_memory_is_the_hosts(tmp_path, monkeypatch):
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    monkeypatch.setattr(cpu_budget, "CGROUP_V2_MEMORY_MAX", v2)
    monkeypatch.setattr(cpu_budget, "CGROUP_V1_MEMORY_LIMIT", v1)
    assert cgroup_memory_limit() is None  # neither file
    v1.write_text(f"{64 * MiB}\n")  # below any machine that runs the tests
    assert cgroup_memory_limit() == 64 * MiB
    assert HostMemory.read() == HostMemory(64 * MiB, "cgroup memory limit")
    v2.write_text("max\n")  # v2 first: unlimited there
    assert cgroup_memory_limit() is None
    assert HostMemory.read().source == "physical memory"
