"""Defaults chosen for speed on the machine at hand: the step's token budget by device and
use (served vs offline), and the engine core's CPU threads (affinity and cgroup quota)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from octavo import LLM
from octavo.config import EngineArgs
from octavo.engine.batch_defaults import default_token_budget
from octavo.engine.builder import build_engine_parts
from octavo.kernels import cpu_count

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_token_budget_is_smaller_on_cpu_and_explicit_values_win():
    assert EngineArgs().token_budget(CPU) == 512
    assert default_token_budget(CPU, offline=True) == 2048
    assert EngineArgs(max_num_batched_tokens=96).token_budget(CPU) == 96


@pytest.mark.parametrize(
    ("name", "gib", "served", "offline"),
    [
        ("NVIDIA H200", 141, 8192, 16384),
        ("NVIDIA H100 80GB HBM3", 80, 8192, 16384),
        ("NVIDIA A100-SXM4-80GB", 80, 2048, 8192),  # vLLM measured big steps slower there
        ("NVIDIA L4", 23, 2048, 8192),
    ],
)
def test_gpu_budgets_are_vllms_by_memory_name_and_use(monkeypatch, name, gib, served, offline):
    gpu = SimpleNamespace(name=name, total_memory=gib * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: gpu)
    assert EngineArgs().token_budget(CUDA) == served
    assert default_token_budget(CUDA, offline=True) == offline
    assert EngineArgs(max_num_batched_tokens=300).token_budget(CUDA) == 300


def test_offline_llm_takes_big_steps_and_the_server_small_ones(tiny_folder):
    folder = str(tiny_folder("qwen2"))
    threads = torch.get_num_threads()
    try:
        offline = LLM(folder, dtype="float32", kv_cache_memory=2**22)
        assert offline.engine.scheduler.max_num_batched_tokens == 2048
        served = build_engine_parts(EngineArgs(model=folder, kv_cache_memory=2**22, num_threads=1))
        assert served.scheduler.max_num_batched_tokens == 512
        assert torch.get_num_threads() == 1  # --num-threads reaches the engine's torch
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "cpu_max,expected",
    [("max 100000\n", None), ("150000 100000\n", 1.5), ("200000 100000\n", 2.0)],
)
def test_cgroup_v2_quota(tmp_path, monkeypatch, cpu_max, expected):
    (tmp_path / "cpu.max").write_text(cpu_max)
    monkeypatch.setattr(cpu_count, "CGROUP_V2_CPU_MAX", tmp_path / "cpu.max")
    assert cpu_count.cgroup_cpu_quota() == expected


def test_cgroup_v1_quota_and_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_count, "CGROUP_V2_CPU_MAX", tmp_path / "absent")
    (tmp_path / "quota").write_text("-1\n")
    (tmp_path / "period").write_text("100000\n")
    monkeypatch.setattr(cpu_count, "CGROUP_V1_QUOTA", tmp_path / "quota")
    monkeypatch.setattr(cpu_count, "CGROUP_V1_PERIOD", tmp_path / "period")
    assert cpu_count.cgroup_cpu_quota() is None
    assert cpu_count.usable_cpus() == len(os.sched_getaffinity(0))
    (tmp_path / "quota").write_text("50000\n")  # half a CPU: still one thread
    assert cpu_count.cgroup_cpu_quota() == 0.5
    assert cpu_count.usable_cpus() == 1


@pytest.mark.parametrize(
    ("omp", "expected"),
    [(None, 8), ("3", 3), ("2,1", 2), ("0", 8), ("many", 8), ("", 8)],
)
def test_default_threads_follow_omp_num_threads_else_the_usable_cpus(monkeypatch, omp, expected):
    """Per worker of two on a 16-CPU host; OMP_NUM_THREADS (the first level of a nested
    list) wins when it is a positive number."""
    monkeypatch.setattr(cpu_count, "usable_cpus", lambda: 16)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert cpu_count.default_threads(2) == expected
