"""The encoder budget per step (``scheduler/encoder_budget.py``): by hand on the scheduler
(which images a step encodes, what preemption and sharing cost) and on LLaVA's tiny
checkpoint (a budget of one image takes a two-image prompt's images in separate steps,
token-identical to HF)."""

from __future__ import annotations

from pathlib import Path

import pytest

from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.multimodal.inputs import ImageInput, placeholder_runs
from octavo.sampling_params import SamplingParams
from octavo.scheduler.encoder_budget import BUDGET_ENV, encoder_budget_from_env
from octavo.scheduler.output import SchedulerOutput
from octavo.scheduler.scheduler import Scheduler
from octavo.scheduler.sequence import Sequence
from octavo.scheduler.stop_checker import StopLimits
from test_vision_llava import CASES, build_llava
from vision_testing import GREEDY, as_prompt, hf_greedy, tiny_llm, token_ids

BLOCK = 4


def make_scheduler(encoder_budget: int, num_blocks: int = 64, budget: int = 64) -> Scheduler:
    kv = KVCacheManager(BlockPool(num_blocks), BLOCK)
    scheduler = Scheduler(kv, 8, budget, StopLimits(frozenset(), 128))
    scheduler.encoder.budget = encoder_budget
    return scheduler


def image(name: str, offset: int, length: int) -> ImageInput:
    return ImageInput(content_hash=name, offset=offset, length=length, data={})


def seq_with(seq_id: int, prompt_len: int, images: list[ImageInput]) -> Sequence:
    tokens = [seq_id * 1000 + i for i in range(prompt_len)]
    params = SamplingParams(max_tokens=4)
    return Sequence(seq_id, f"r{seq_id}", 0, tokens, prompt_len, params, images=images)


def prefills(out: SchedulerOutput) -> list[tuple[int, int, int]]:
    return [(s.seq_id, s.num_computed_tokens, s.num_new_tokens) for s in out.prefills]


def advance(scheduler: Scheduler, out: SchedulerOutput) -> None:
    """The step ran (a prompt chunk samples nothing unless it ends the prompt)."""
    from octavo.outputs import ModelRunnerOutput

    ids = [s.seq_id for s in out.scheduled if s.sample]
    scheduler.update_from_output(out, ModelRunnerOutput(ids, [7] * len(ids), [None] * len(ids)), 0)


def test_a_chunk_stops_before_the_image_the_budget_cannot_pay_for():
    scheduler = make_scheduler(encoder_budget=10)
    scheduler.add(seq_with(1, 30, [image("a", 2, 8), image("b", 14, 8)]))
    first = scheduler.schedule()
    assert prefills(first) == [(1, 0, 14)]  # stops before "b": 8 + 8 > 10
    assert scheduler.encoder.left == 2
    advance(scheduler, first)
    assert set(scheduler.encoder.holders) == set()  # "a" is passed: let go
    second = scheduler.schedule()
    assert prefills(second) == [(1, 14, 16)]
    assert scheduler.encoder.holders == {"b": {1}}


def test_an_image_larger_than_the_budget_is_admitted_alone():
    scheduler = make_scheduler(encoder_budget=6)
    scheduler.add(seq_with(1, 12, [image("a", 0, 4)]))
    scheduler.add(seq_with(2, 20, [image("big", 2, 10)]))
    first = scheduler.schedule()
    assert prefills(first) == [(1, 0, 12), (2, 0, 2)]  # "a" spent part of the budget
    advance(scheduler, first)
    second = scheduler.schedule()
    assert prefills(second) == [(2, 2, 18)]  # an untouched budget: "big" goes alone
    assert scheduler.encoder.left == 0


def test_an_image_held_or_charged_this_step_costs_nothing_again():
    scheduler = make_scheduler(encoder_budget=8)
    scheduler.add(seq_with(1, 16, [image("same", 4, 8)]))
    scheduler.add(seq_with(2, 16, [image("same", 4, 8)]))
    first = scheduler.schedule()
    assert prefills(first) == [(1, 0, 16), (2, 0, 16)]  # one encode of "same" for both
    assert scheduler.encoder.left == 0


def test_a_preempted_sequence_lets_go_and_its_recompute_is_charged_again():
    scheduler = make_scheduler(encoder_budget=8, budget=8)
    seq = seq_with(1, 24, [image("a", 2, 8)])
    scheduler.add(seq)
    first = scheduler.schedule()
    assert prefills(first) == [(1, 0, 8)]  # inside "a": charged and held
    advance(scheduler, first)
    assert scheduler.encoder.holders == {"a": {1}}
    assert scheduler.schedule().prefills[0].num_computed_tokens == 8  # held: costs nothing
    assert scheduler.encoder.left == 8
    scheduler.running.remove(seq)
    scheduler.preempt(seq)
    assert scheduler.encoder.holders == {}
    again = scheduler.schedule()
    assert prefills(again) == [(1, 8, 8)]  # its first block from the prefix cache
    assert scheduler.encoder.left == 0  # "a" encoded again (the chunk starts inside it)
    scheduler.finish(seq)
    assert scheduler.encoder.holders == {}


def test_the_budget_from_the_environment(monkeypatch):
    assert encoder_budget_from_env(512) == 512  # vLLM's default: the token budget
    monkeypatch.setenv(BUDGET_ENV, "16")
    assert encoder_budget_from_env(512) == 16
    monkeypatch.setenv(BUDGET_ENV, "0")
    with pytest.raises(ValueError, match=BUDGET_ENV):
        encoder_budget_from_env(512)


@pytest.fixture(scope="module")
def llava_folder(tmp_path_factory, smol_folder) -> Path:
    return build_llava(tmp_path_factory.mktemp("llava"), smol_folder)


def images_encoded(steps: list[SchedulerOutput], images: list[ImageInput]) -> list[list[int]]:
    """For each step with prefills: which of ``images`` (indexes) its chunks first reach."""
    seen, encoded = set(), []
    for out in steps:
        step = []
        for chunk in out.prefills:
            end = chunk.num_computed_tokens + chunk.num_new_tokens
            for index, item in enumerate(images):
                if index not in seen and item.overlap(chunk.num_computed_tokens, end):
                    seen.add(index)
                    step.append(index)
        if step:
            encoded.append(step)
    return encoded


def test_a_budget_of_one_image_encodes_two_images_in_separate_steps(llava_folder, monkeypatch):
    from transformers import LlavaForConditionalGeneration

    hf_reference = hf_greedy(llava_folder, LlavaForConditionalGeneration)
    text, images = CASES[1]  # two images of 16 features each
    monkeypatch.setenv(BUDGET_ENV, "16")
    with tiny_llm(llava_folder) as llm:
        steps = record_steps(llm.engine.scheduler, monkeypatch)
        outputs = llm.generate(as_prompt(text, images), GREEDY, use_tqdm=False)
        placeholder_id = llm.engine.mm_processor.image_token_id
    assert token_ids(outputs) == [hf_reference(text, images)]
    runs = placeholder_runs(outputs[0].prompt_token_ids, placeholder_id)
    spans = [image(str(index), *run) for index, run in enumerate(runs)]
    assert [span.length for span in spans] == [16, 16]
    assert images_encoded(steps, spans) == [[0], [1]]  # one image a step
    first = steps[0].prefills[0]
    assert first.num_computed_tokens + first.num_new_tokens == spans[1].offset


def record_steps(scheduler: Scheduler, monkeypatch) -> list[SchedulerOutput]:
    """Every ``SchedulerOutput`` the engine's scheduler makes from now on, in order."""
    steps: list[SchedulerOutput] = []
    plan = scheduler.schedule

    def recorded() -> SchedulerOutput:
        steps.append(plan())
        return steps[-1]

    monkeypatch.setattr(scheduler, "schedule", recorded)
    return steps
