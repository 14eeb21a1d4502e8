"""``python -m octavo_bench vision``: registered, its help, and its workloads and report
(no timed run: the benchmark itself is never a test)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from octavo_bench import cli
from octavo_bench.report import HF, OCTAVO, VLLM
from octavo_bench.vision import workload_sizes
from octavo_bench.vision_report import VisionReport, VisionResult
from octavo_bench.vision_vllm import PngWriter, runner_entries
from octavo_bench.vision_workloads import (
    FOUR_IMAGES,
    ONE_IMAGE,
    REPEATED,
    THROUGHPUT,
    TTFT,
    TTFT_ONE,
    ImageDraw,
    WorkloadSizes,
    vision_workloads,
)


def test_vision_subcommand_is_registered_with_its_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["vision", "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith("usage: python -m octavo_bench vision")
    for flag in ("--model", "--quick", "--engines", "--vllm-python", "--kv-cache-memory"):
        assert flag in shown
    args = cli.build_parser().parse_args(["vision", "--quick", "--engines", "octavo,hf"])
    assert args.engines == [OCTAVO, HF]
    assert workload_sizes(args).one_image_requests == 2
    defaults = workload_sizes(cli.build_parser().parse_args(["vision"]))
    assert (defaults.one_image_requests, defaults.four_image_requests) == (16, 8)
    with pytest.raises(ValueError, match="max-tokens"):
        workload_sizes(cli.build_parser().parse_args(["vision", "--max-tokens", "0"]))


SIZES = WorkloadSizes(one_image_requests=3, four_image_requests=2, ttft_repeats=2, image_size=28)


def test_workloads_send_distinct_images_but_the_repeated_one():
    workloads = {w.name: w for w in vision_workloads(SIZES, ImageDraw(SIZES.image_size))}
    sent = [
        image for w in workloads.values() if w.name != REPEATED for i in w.images for image in i
    ]
    assert len({image.tobytes() for image in sent}) == len(sent)
    repeated = workloads[REPEATED].images
    assert len(repeated) == 3 and all(images[0] is repeated[0][0] for images in repeated)
    four = workloads[FOUR_IMAGES]
    assert four.images_per_request == 4 and four.prompts[1].count("<|image_pad|>") == 4
    assert workloads[TTFT_ONE].kind == TTFT and workloads[TTFT_ONE].max_tokens == 1


def test_vllm_runner_gets_ttft_requests_one_by_one(tmp_path: Path):
    workloads = vision_workloads(SIZES, ImageDraw(SIZES.image_size))
    pngs = PngWriter(tmp_path)
    entries = [entry for w in workloads for entry in runner_entries(w, pngs)]
    names = [entry["name"] for entry in entries]
    assert names[:3] == [ONE_IMAGE, FOUR_IMAGES, REPEATED]
    assert names[3:5] == [f"{TTFT_ONE}#0", f"{TTFT_ONE}#1"]
    repeated = entries[2]["images"]
    assert len({paths[0] for paths in repeated}) == 1  # one PNG, sent three times
    assert len(list(tmp_path.iterdir())) == 3 + 2 * 4 + 1 + 2 + 2 * 4


def test_report_ratios_favour_the_faster_engine():
    report = VisionReport({}, {"model": "m"})
    report.results = [
        VisionResult(OCTAVO, ONE_IMAGE, THROUGHPUT, 4, 1, [2.0]),
        VisionResult(VLLM, ONE_IMAGE, THROUGHPUT, 4, 1, [1.0]),
        VisionResult(OCTAVO, REPEATED, THROUGHPUT, 4, 1, [1.0]),
        VisionResult(OCTAVO, TTFT_ONE, TTFT, 3, 1, [0.1, 0.3, 0.2]),
        VisionResult(HF, TTFT_ONE, TTFT, 3, 1, [0.4, 0.4, 0.4]),
    ]
    assert report.speedup(ONE_IMAGE, THROUGHPUT, VLLM) == pytest.approx(0.5)
    assert report.speedup(TTFT_ONE, TTFT, HF) == pytest.approx(2.0)  # 400 ms vs 200 ms
    assert report.cache_effect(OCTAVO) == pytest.approx(2.0)
    assert report.cache_effect(VLLM) is None
    text = report.text()
    assert "0.50x" in text and "2.00x" in text


FAKE_VLLM = '''
"""A stand-in for vLLM's offline API that records each prompt's text and image sizes."""
import json, os

__version__ = "0.0.fake"


class SamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class _Output:
    def __init__(self, count):
        self.outputs = [type("Completion", (), {"token_ids": list(range(count))})()]


class LLM:
    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append([
            [p["prompt"], [image.size for image in p["multi_modal_data"]["image"]]]
            for p in prompts
        ])
        with open(os.environ["FAKE_VLLM_RECORD"], "w") as out:
            json.dump({"llm": self.kwargs, "calls": self.calls}, out)
        return [_Output(p.kwargs["max_tokens"]) for p in params]
'''


def test_vllm_side_sends_texts_and_images_through_the_runner(tmp_path, monkeypatch):
    """The runner in a child process (a fake ``vllm``): PIL images from the PNGs, one call
    per throughput workload and per TTFT request, results gathered back per workload."""
    from octavo_bench.vision_vllm import run_vllm
    from octavo_bench.vision_workloads import warmup_workload
    from octavo_bench.vllm_baseline import VllmSetup, vllm_env

    package = tmp_path / "fake" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_VLLM)
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(record))
    draw = ImageDraw(SIZES.image_size)
    workloads = vision_workloads(SIZES, draw)
    setup = VllmSetup(sys.executable, "float32", vllm_env())
    results = run_vllm(
        setup, tmp_path, 64, workloads, warmup_workload(draw, "<i>"), tmp_path / "log"
    )
    seen = json.loads(record.read_text())
    assert seen["llm"]["limit_mm_per_prompt"] == {"image": 4, "video": 0}
    assert seen["llm"]["enable_prefix_caching"] is False
    calls = seen["calls"]
    assert len(calls) == 1 + 3 + 2 + 2  # warm-up, 3 throughput, 2 + 2 TTFT requests
    assert calls[0][1] == [
        "Request 1: <i><i><i><i>Describe the pictures in detail.",
        [[28, 28]] * 4,
    ]
    assert [len(call) for call in calls[1:4]] == [3, 2, 3]
    by_name = {result.workload: result for result in results}
    assert by_name[TTFT_ONE].output_tokens == 2 and len(by_name[TTFT_ONE].seconds) == 2
    assert by_name[FOUR_IMAGES].output_tokens == 2 * SIZES.max_tokens
