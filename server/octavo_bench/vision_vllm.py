"""The vision workloads through vLLM's offline ``LLM.generate`` in vLLM's own venv.

``vllm_runner.py`` gets each prompt's text and its images as PNG files (lossless: vLLM
sees the pixels the other engines see, and one repeated image is the same content each
time), and runs every workload as one timed ``generate``; a TTFT workload becomes one
single-request runner workload per request, each timed alone with ``max_tokens`` 1.
vLLM runs with prefix caching off, as Octavo does here, at most 4 images a prompt and no
videos.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from octavo_bench.report import VLLM
from octavo_bench.vision_engines import report_progress, request_groups
from octavo_bench.vision_report import VisionResult
from octavo_bench.vision_workloads import VisionWorkload
from octavo_bench.vllm_baseline import VllmSetup, log_tail, run_runner

MAX_IMAGES_PER_PROMPT = 4


class PngWriter:
    """Each image as a PNG in ``folder``, written once however often it is sent."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.paths: dict[int, str] = {}

    def path(self, image) -> str:
        if id(image) not in self.paths:
            path = self.folder / f"image-{len(self.paths)}.png"
            image.save(path)
            self.paths[id(image)] = str(path)
        return self.paths[id(image)]


def runner_entry(name: str, workload: VisionWorkload, indices: list[int], pngs: PngWriter):
    return {
        "name": name,
        "prompts": [workload.prompts[i] for i in indices],
        "images": [[pngs.path(image) for image in workload.images[i]] for i in indices],
        "max_tokens": [workload.max_tokens] * len(indices),
    }


def runner_entries(workload: VisionWorkload, pngs: PngWriter) -> list[dict]:
    """The workload as runner workloads: whole (throughput), or one per request (TTFT)."""
    groups = request_groups(workload)
    if len(groups) == 1:
        return [runner_entry(workload.name, workload, groups[0], pngs)]
    return [
        runner_entry(f"{workload.name}#{n}", workload, group, pngs)
        for n, group in enumerate(groups)
    ]


def vision_request(
    setup: VllmSetup,
    folder: Path,
    max_model_len: int,
    workloads: list[VisionWorkload],
    warmup: VisionWorkload,
    pngs: PngWriter,
) -> dict:
    warm = runner_entry("warm-up", warmup, list(range(warmup.num_requests)), pngs)
    return {
        "model": str(folder),
        "dtype": setup.dtype,
        "max_model_len": max_model_len,
        "seed": 0,
        "llm_kwargs": {
            # no videos: vLLM then sizes its encoder budget for images, not 3 long videos
            "limit_mm_per_prompt": {"image": MAX_IMAGES_PER_PROMPT, "video": 0},
            "enable_prefix_caching": False,
        },
        "warmup": warm,
        "workloads": [entry for w in workloads for entry in runner_entries(w, pngs)],
    }


def collect(workloads: list[VisionWorkload], result: dict) -> list[VisionResult]:
    """The runner's timings, gathered back per workload (a TTFT workload's ``name#n``)."""
    timed = {item["name"]: item for item in result["results"]}
    results = []
    for workload in workloads:
        items = [item for name, item in timed.items() if name.split("#")[0] == workload.name]
        results.append(
            VisionResult(
                VLLM,
                workload.name,
                workload.kind,
                workload.num_requests,
                workload.images_per_request,
                [item["wall_s"] for item in items],
                sum(item["output_tokens"] for item in items),
            )
        )
        report_progress(results[-1])
    return results


def run_vllm(
    setup: VllmSetup,
    folder: Path,
    max_model_len: int,
    workloads: list[VisionWorkload],
    warmup: VisionWorkload,
    log_path: Path,
) -> list[VisionResult]:
    """vLLM on the same folder and images; raises VllmRunError when it cannot run."""
    print(f"running vllm ({setup.python}, {setup.dtype}; log: {log_path})", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="octavo-vision-") as scratch:
        pngs = PngWriter(Path(scratch))
        request = vision_request(setup, folder, max_model_len, workloads, warmup, pngs)
        try:
            result = run_runner(setup, request, log_path)
        except Exception:
            if log_path.is_file():
                print(log_tail(log_path))
            raise
    setup.facts.update(
        version=result.get("vllm_version"),
        load_s=round(result.get("load_s", 0.0), 2),
        process_s=round(time.perf_counter() - start, 2),
    )
    return collect(workloads, result)
