"""``octavo_bench step-profile`` on CPU: every phase timed, JSON and PNG written."""

from __future__ import annotations

import json

import pytest

from octavo_bench import step_profile


def test_a_cpu_run_times_every_phase_per_batch(tiny_folder, tmp_path):
    argv = ["--model", str(tiny_folder("llama3")), "--device", "cpu", "--dtype", "float32"]
    argv += ["--batches", "1,3", "--steps", "4", "--prompt-len", "5"]
    argv += ["--offline", "3", "--offline-max-len", "6"]
    assert step_profile.main([*argv, "--output-dir", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "step_profile.json").read_text())["rows"]
    assert [row["batch"] for row in rows] == [1, 3, "offline"]
    offline = rows[-1]
    assert offline["prefill_steps"] >= 1 and offline["steps"] >= 6  # prefill, then decodes
    assert offline["tok_s"] == pytest.approx(3 * 6 / offline["wall_s"])
    for row in rows:
        assert row["steps"] >= 4  # the prefill step and the decode steps
        assert row["tok_s"] > 0
        phases = [row[phase] for phase in step_profile.PHASES.values()]
        assert all(ms > 0 for ms in phases)
        assert sum(phases) <= row["step"] * 1.01  # the phases are parts of a step
        assert "gpu_forward_ms" not in row  # CUDA events only on a GPU
        forwards = row["forwards"]  # CPU decode graphs for the decode steps, no pieces
        assert forwards["decode_graph"] >= 1 and forwards["pieces"] == 0
        assert forwards["eager"] >= 1 and sum(forwards.values()) == row["steps"]
    assert (tmp_path / "step_profile.png").exists()


def test_syncs_are_counted_per_phase_and_close_puts_every_method_back():
    """``--count-syncs``: torch's sync debug mode warnings (CUDA) are counted per phase;
    here a stand-in engine's input preparation warns as a synchronizing call would."""
    import warnings
    from types import SimpleNamespace

    from octavo.model_executor.pending_step import PendingStep

    def waits_twice(*_args):
        for _ in range(2):
            warnings.warn(f"{step_profile.SYNC_WARNING}: item", UserWarning, stacklevel=1)

    def idle(*_args):
        return None

    runner = SimpleNamespace(prepare=waits_twice, _forward=idle, _outputs=idle, graphs=None)
    runner.piecewise = None  # no graphs: every forward eager
    scheduler = SimpleNamespace(schedule=idle, update_from_output=idle)
    engine = SimpleNamespace(scheduler=scheduler, _record_all=idle, step=None)
    engine.executor = SimpleNamespace(worker=SimpleNamespace(runner=runner))

    def step():
        scheduler.schedule()
        runner.prepare()
        PendingStep().output()
        scheduler.update_from_output()

    engine.step = step
    original_output = PendingStep.output
    timer = step_profile.PhaseTimer(engine, count_syncs=True)
    for _ in range(3):
        engine.step()
    syncs = timer.per_step_ms()["syncs_per_step"]
    assert syncs["prepare"] == syncs["step"] == 2.0
    assert syncs["schedule"] == syncs["other"] == 0.0
    assert timer.per_step_ms()["wait"] > 0  # PendingStep.output is a phase of its own
    timer.close()
    assert PendingStep.output is original_output and runner.prepare is waits_twice
    assert engine.step is step


def test_compare_async_alternates_both_modes_in_one_engine(tiny_folder, tmp_path):
    """``--compare-async``: each round runs every batch size with steps in turn and
    overlapped, in alternating order, then the offline shape once per mode, each from a
    cold prefix cache (the overlapped run's prompt steps are as many as the other's)."""
    argv = ["--model", str(tiny_folder("llama3")), "--device", "cpu", "--dtype", "float32"]
    argv += ["--batches", "2", "--steps", "3", "--prompt-len", "5", "--compare-async"]
    argv += ["--offline", "3", "--offline-max-len", "6", "--output-dir", str(tmp_path)]
    assert step_profile.main(argv) == 0
    rows = json.loads((tmp_path / "step_profile.json").read_text())["rows"]
    order = [(row["mode"], row["round"], row["batch"]) for row in rows]
    assert order == [
        ("sync", 0, 2),
        ("async", 0, 2),
        ("async", 1, 2),
        ("sync", 1, 2),
        ("sync", 0, "offline"),
        ("async", 0, "offline"),
    ]
    sync_offline, async_offline = rows[-2:]
    assert sync_offline["prefill_steps"] == async_offline["prefill_steps"] >= 1
    for row in rows:
        assert row["tok_s"] > 0 and row["steps"] >= 3
