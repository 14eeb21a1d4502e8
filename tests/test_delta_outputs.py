"""Delta outputs: the engine sends only what is new; the server's accumulator rebuilds the
request so far, whatever number of deltas arrive between two reads."""

from __future__ import annotations

import asyncio
import pickle
from dataclasses import replace
from itertools import chain

import pytest

from octavo import LLM, SamplingParams
from octavo.engine.async_engine import AsyncEngine
from octavo.engine.core_messages import AbortRequests, StepDone
from octavo.engine.output_accumulator import OutputAccumulator
from octavo.engine.request_stream import RequestStream
from octavo.engine.stream_text import StreamText, decodes_in_server
from octavo.engine.token_deltas import TokenDeltaExpander
from octavo.outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    RequestMetrics,
    RequestOutput,
)
from octavo.sampling_params import RequestOutputKind

from server_harness import engine_stats

PROMPT = [11, 12, 13, 14, 15]
PARAMS = SamplingParams(n=2, seed=3, temperature=1.0, max_tokens=12, logprobs=2, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_folder) -> LLM:
    return LLM(
        str(tiny_folder("llama3")), dtype="float32", max_model_len=64, kv_cache_memory=1 << 20
    )


def joined(lists) -> list:
    return list(chain.from_iterable(lists))


def essentials(completion) -> tuple:
    return completion.token_ids, completion.text, completion.logprobs, completion.finish_reason


def run(
    llm: LLM, kind: RequestOutputKind, request_id: str, stream_interval: int | None = None
) -> list:
    engine = llm.engine
    params = replace(PARAMS, output_kind=kind, stream_interval=stream_interval)
    engine.add_request(request_id, PROMPT, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    return outputs


def test_deltas_add_up_to_the_cumulative_outputs(llm):
    cumulative = run(llm, RequestOutputKind.CUMULATIVE, "c")
    deltas = run(llm, RequestOutputKind.DELTA, "d")
    assert len(deltas) == len(cumulative) > 2
    assert deltas[0].prompt_token_ids == PROMPT and all(not d.prompt_token_ids for d in deltas[1:])
    assert all(d.num_prompt_tokens == len(PROMPT) for d in deltas)
    final = cumulative[-1]
    for index in range(2):
        pieces = [c for d in deltas for c in d.outputs if c.index == index]
        assert joined(c.token_ids for c in pieces) == final.outputs[index].token_ids
        assert "".join(c.text for c in pieces) == final.outputs[index].text
        assert joined(c.logprobs for c in pieces) == final.outputs[index].logprobs
        assert pieces[-1].num_tokens == 12 == len(final.outputs[index].token_ids)
        assert pieces[-1].cumulative_logprob == pytest.approx(
            final.outputs[index].cumulative_logprob
        )


def test_a_stream_interval_sends_the_first_token_then_chunks_then_the_last(llm):
    """--stream-interval, raised (never lowered) by a request's own stream_interval."""
    every = run(llm, RequestOutputKind.DELTA, "every")
    cases = [(4, None, [1, 4, 4, 3]), (4, 2, [1, 4, 4, 3]), (4, 6, [1, 6, 5]), (1, 5, [1, 5, 5, 1])]
    for engine_interval, request_interval, lengths in cases:
        llm.engine.args.stream_interval = engine_interval
        try:
            chunked = run(llm, RequestOutputKind.DELTA, "chunked", request_interval)
        finally:
            llm.engine.args.stream_interval = 1
        for index in range(2):
            pieces = [c for d in chunked for c in d.outputs if c.index == index]
            assert [len(c.token_ids) for c in pieces] == lengths
            full = [c for d in every for c in d.outputs if c.index == index]
            assert joined(c.token_ids for c in pieces) == joined(c.token_ids for c in full)
            assert "".join(c.text for c in pieces) == "".join(c.text for c in full)
    with pytest.raises(ValueError, match="stream_interval must be at least 1"):
        SamplingParams(stream_interval=0)


def test_a_completion_that_ends_is_sent_without_waiting_for_the_interval(llm):
    """n=2: the first completion to end goes out in that step's output, not when the other
    one fills its interval."""
    every = run(llm, RequestOutputKind.DELTA, "every")
    first, second = (
        [t for d in every for c in d.outputs if c.index == i for t in c.token_ids] for i in range(2)
    )
    # an end the interval alone would not send (outputs at 1, 7, 13 tokens)
    ends = (
        (i, t)
        for i, t in enumerate(first)
        if i >= 2 and i % 6 and first.index(t) == i and t not in second
    )
    position, stop = next(ends)
    engine = llm.engine
    params = replace(PARAMS, output_kind=RequestOutputKind.DELTA, stream_interval=6)
    engine.add_request("ends", PROMPT, replace(params, stop_token_ids=[stop]))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    ended = next(o for o in outputs if o.outputs[0].finish_reason == "stop")
    assert ended.outputs[0].num_tokens == position + 1 == ended.outputs[1].num_tokens


def test_final_only_sends_one_output(llm):
    (only,) = run(llm, RequestOutputKind.FINAL_ONLY, "f")
    cumulative = run(llm, RequestOutputKind.CUMULATIVE, "c2")
    assert only.finished
    assert [essentials(c) for c in only.outputs] == [essentials(c) for c in cumulative[-1].outputs]


def test_the_accumulator_rebuilds_any_grouping_of_deltas(llm):
    deltas = run(llm, RequestOutputKind.DELTA, "d2")
    final = run(llm, RequestOutputKind.CUMULATIVE, "c3")[-1]
    accumulator, views = OutputAccumulator(), []
    for start in range(0, len(deltas), 3):  # three deltas per read
        views.append(accumulator.merge(deltas[start : start + 3]))
    last = views[-1]
    assert last.finished and last.prompt_token_ids == PROMPT
    for index in range(2):
        got = last.outputs[index]
        assert (got.token_ids, got.text, got.logprobs) == (
            final.outputs[index].token_ids,
            final.outputs[index].text,
            final.outputs[index].logprobs,
        )
        new_ids = joined(v.outputs[index].delta_token_ids for v in views)
        assert new_ids == got.token_ids
        assert "".join(v.outputs[index].delta_text for v in views) == got.text
        assert joined(v.outputs[index].delta_logprobs for v in views) == got.logprobs


def test_a_stream_yields_what_arrived_then_raises_the_error_behind_it(llm):
    deltas = run(llm, RequestOutputKind.DELTA, "d3")[:3]

    async def read() -> tuple[list, BaseException | None]:
        stream = RequestStream("d3", lambda streams: None)
        for delta in deltas:
            stream.put(delta)
        stream.put(RuntimeError("engine gone"))
        seen = []
        try:
            async for view in stream.outputs():
                seen.append(view)
        except RuntimeError as error:
            return seen, error
        return seen, None

    seen, error = asyncio.run(read())
    assert len(seen) == 1 and str(error) == "engine gone"
    assert seen[0].outputs[0].delta_token_ids == joined(
        c.token_ids for d in deltas for c in d.outputs if c.index == 0
    )


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE])
def test_every_step_done_reads_back_equal(llm, kind):
    """Two completions with logprobs and prompt logprobs, stopped by a stop string, from
    the first delta (prompt ids) to the finished one; a pooled output rides along as is."""
    engine = llm.engine
    params = SamplingParams(
        n=2, seed=1, temperature=1.0, max_tokens=8, logprobs=2, prompt_logprobs=1, stop=["e"]
    )
    engine.add_request(f"wire-{kind.value}", [11, 12, 13, 14], replace(params, output_kind=kind))
    steps = []
    while engine.has_unfinished_requests():
        steps.append(StepDone(engine.step(), engine.stats()))
    embedding = EmbeddingRequestOutput("e", [1, 2], EmbeddingOutput([0.5, -1.0]))
    steps.append(StepDone([embedding], engine.stats()))
    assert steps[-2].outputs[-1].finished and steps[0].outputs[0].prompt_logprobs
    for step in steps:
        assert pickle.loads(pickle.dumps(step, protocol=pickle.HIGHEST_PROTOCOL)) == step


def test_a_served_stream_decodes_the_text_of_the_ids_the_core_sends(llm):
    """A stream without stop strings: the core sends token ids only (``detokenize=False``)
    and the stream's ``StreamText`` decodes them, per completion, to the core's own text."""
    params = replace(PARAMS, output_kind=RequestOutputKind.DELTA)
    tokenizer = llm.engine.tokenizer
    assert decodes_in_server(params, tokenizer)
    text = StreamText(tokenizer, PROMPT, params)
    engine = llm.engine
    engine.add_request("ids-only", PROMPT, StreamText.core_params(params))
    deltas = []
    while engine.has_unfinished_requests():
        deltas += engine.step()
    assert all(c.text == c.delta_text == "" for d in deltas for c in d.outputs)
    final = run(llm, RequestOutputKind.CUMULATIVE, "with-text")[-1]

    async def read() -> RequestOutput:
        stream = RequestStream("ids-only", lambda streams: None, text)
        for delta in deltas:
            assert not text.fill_output(delta)  # (the engine fills them: AsyncEngine)
            stream.put(delta)
        return await stream.final()

    served = asyncio.run(read())
    assert [c.text for c in served.outputs] == [c.text for c in final.outputs]
    assert all(c.text for c in final.outputs)


@pytest.mark.parametrize(
    ("change", "in_server"),
    [
        ({}, True),
        ({"stop": ["e"]}, False),  # two completions with logprobs: the core cuts them
        ({"stop": ["e"], "n": 1, "logprobs": None}, True),  # found here, aborted in the core
        ({"stop": ["e"], "logprobs": None}, False),
        ({"detokenize": False}, False),  # no text wanted at all
        ({"output_kind": RequestOutputKind.FINAL_ONLY}, False),
    ],
)
def test_which_streams_the_server_decodes(llm, change, in_server):
    params = replace(PARAMS, **({"output_kind": RequestOutputKind.DELTA} | change))
    assert decodes_in_server(params, llm.engine.tokenizer) is in_server
    assert not decodes_in_server(params, None)


ONE = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def served_with_stops_here(llm: LLM, params: SamplingParams, request_id: str) -> RequestOutput:
    """What AsyncEngine does for a stream that finds its stop strings in the server: the
    core runs without them, the deltas are filled here, and at a stop the core's request is
    aborted and its later outputs dropped."""
    assert decodes_in_server(params, llm.engine.tokenizer)
    engine, text = llm.engine, StreamText(llm.engine.tokenizer, PROMPT, params)
    engine.add_request(request_id, PROMPT, StreamText.core_params(params))
    deltas, stopped = [], False
    while engine.has_unfinished_requests():
        for delta in engine.step():
            if stopped:
                assert delta.finished and delta.outputs[0].finish_reason == "abort"
                continue
            core_finished = delta.finished
            deltas.append(delta)
            if text.fill_output(delta) and not core_finished:
                stopped = True
                engine.abort_request(request_id)

    async def read() -> RequestOutput:
        stream = RequestStream(request_id, lambda streams: None, text)
        for delta in deltas:
            stream.put(delta)
        return await stream.final()

    return asyncio.run(read())


def served_in_core(llm: LLM, params: SamplingParams, request_id: str) -> RequestOutput:
    engine, final_only = llm.engine, replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
    engine.add_request(request_id, PROMPT, final_only)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    return outputs[-1]


def test_stop_strings_found_in_the_server_end_streams_as_the_core_ends_them(llm):
    """Every way a stop string ends a completion (in the middle of the text, kept in the
    output, held back by min_tokens, never found, on the length limit's token): the server's
    text, token ids, token count and finish equal the core's."""
    text = served_in_core(llm, ONE, "plain").outputs[0].text
    assert len(text) > 6
    middle, last = text[3:5], text[-2:]
    cases = [
        {"stop": [middle]},
        {"stop": ["never there", middle], "include_stop_str_in_output": True},
        {"stop": [text[:2]], "min_tokens": 4},
        {"stop": ["never there"]},
        {"stop": [last]},
    ]
    reasons = []
    for number, change in enumerate(cases):
        params = replace(ONE, output_kind=RequestOutputKind.DELTA, **change)
        here = served_with_stops_here(llm, params, f"here-{number}").outputs[0]
        core = served_in_core(llm, params, f"core-{number}").outputs[0]
        assert (here.text, here.finish_reason, here.stop_reason) == (
            core.text,
            core.finish_reason,
            core.stop_reason,
        ), change
        assert here.token_ids == core.token_ids and here.num_tokens == len(core.token_ids)
        reasons.append(here.finish_reason)
    assert [reasons[i] for i in (0, 1, 3, 4)] == ["stop", "stop", "length", "stop"]


class RecordingCore:
    def __init__(self) -> None:
        self.sent: list = []

    def send(self, command) -> None:
        self.sent.append(command)


def new_tokens(output) -> int:
    """The new token ids of an output as the core sends it (a ``TokenDelta`` or not)."""
    if type(output) is tuple:
        return len(output[1])
    return sum(len(c.delta_token_ids) for c in output.outputs)


def core_steps(engine, request_id: str, params: SamplingParams, token_deltas: bool) -> list:
    """Each step's outputs of one request, as the server's core loop (``token_deltas``)
    or the offline LLM sends them."""
    engine.token_deltas = token_deltas
    try:
        engine.add_request(request_id, PROMPT, params)
        steps = []
        while engine.has_unfinished_requests():
            steps.append(engine.step())
    finally:
        engine.token_deltas = False
    return steps


def without_times(output: RequestOutput) -> RequestOutput:
    no_times = RequestMetrics(0.0, num_preemptions=output.metrics.num_preemptions)
    return replace(output, request_id="", metrics=no_times)


def test_token_deltas_come_back_as_the_outputs_the_core_would_send(llm):
    """A served stream (one completion, ids only): after its first output the core sends
    token deltas; across the pipe the server rebuilds them into the outputs the core sends
    without them, field for field (times aside: a second run), the newest token's time
    moving on from the first token's."""
    params = StreamText.core_params(replace(ONE, output_kind=RequestOutputKind.DELTA))
    full = [o for step in core_steps(llm.engine, "full", params, False) for o in step]
    steps = core_steps(llm.engine, "lean", params, True)
    wire = [pickle.loads(pickle.dumps(StepDone(step, None))).outputs for step in steps]
    sent = [output for step in wire for output in step]
    assert [type(o) for o in sent] == [RequestOutput] + [tuple] * (len(full) - 2) + [RequestOutput]
    expanded = TokenDeltaExpander().expand(sent)
    assert [without_times(o) for o in expanded] == [without_times(o) for o in full]
    first, *rest = [o.metrics for o in expanded]
    assert all(m.first_token_time == first.first_token_time for m in rest)
    token_times = [m.last_token_time for m in [first, *rest]]
    assert token_times == sorted(token_times) and token_times[-1] > token_times[0]


def test_outputs_with_more_than_token_ids_never_travel_as_token_deltas(llm):
    for number, change in enumerate([{}, {"n": 1}, {"logprobs": None}, {"detokenize": False}]):
        params = replace(PARAMS, output_kind=RequestOutputKind.DELTA, **change)
        steps = core_steps(llm.engine, f"not-lean-{number}", params, True)
        assert all(type(o) is RequestOutput for step in steps for o in step), change


@pytest.mark.parametrize("token_deltas", [False, True])
def test_the_engine_ends_a_stream_at_its_stop_string_and_counts_only_what_it_served(
    llm, token_deltas
):
    """AsyncEngine with the core's deltas of a request that ran on past its stop string (the
    abort not yet taken): the stream ends at the stop, the core is told to abort once, what
    came after reaches neither the stream nor the metrics, whose generated-token counter
    moves by exactly the tokens served."""
    engine = llm.engine
    text = served_in_core(llm, ONE, "to-stop").outputs[0].text
    params = replace(ONE, output_kind=RequestOutputKind.DELTA, stop=[text[3:5]])
    core_params = StreamText.core_params(params)
    deltas = [o for step in core_steps(engine, "s", core_params, token_deltas) for o in step]
    assert any(type(o) is tuple for o in deltas) is token_deltas
    core, seen = RecordingCore(), []
    served = AsyncEngine(core, on_step=lambda outputs, stats: seen.append((outputs, stats)))
    text_here = StreamText(engine.tokenizer, PROMPT, params)
    served._streams["s"] = RequestStream("s", lambda streams: None, text_here)
    generated = 0
    for delta in deltas:
        generated += new_tokens(delta)
        served._deliver([delta], engine_stats(len(PROMPT), generated, running=1))
    delivered = [output for outputs, _ in seen for output in outputs]
    assert core.sent == [AbortRequests(["s"])]
    assert delivered[-1].finished and delivered[-1].outputs[0].finish_reason == "stop"
    assert len(delivered) < len(deltas) and not served._stopped_here
    kept = sum(len(c.delta_token_ids) for output in delivered for c in output.outputs)
    assert seen[-1][1].generation_tokens == kept < generated


def test_a_stop_string_inside_a_delta_of_several_tokens_drops_the_tokens_after_it(llm):
    """A speculative step's delta holds several tokens: the stream keeps those up to the
    one that completed the stop string and counts only them."""
    tokenizer = llm.engine.tokenizer
    ids = tokenizer.encode(" alpha beta gamma delta", add_special_tokens=False)
    params = replace(ONE, output_kind=RequestOutputKind.DELTA, stop=["beta"])
    completion = CompletionOutput(
        index=0, text="", token_ids=list(ids), delta_token_ids=list(ids), num_tokens=len(ids)
    )
    assert StreamText(tokenizer, PROMPT, params).fill(completion)
    kept = next(k for k in range(1, len(ids) + 1) if "beta" in tokenizer.decode(ids[:k]))
    assert kept < len(ids) and completion.delta_token_ids == completion.token_ids == ids[:kept]
    assert completion.num_tokens == kept and completion.text == " alpha "
    assert (completion.finish_reason, completion.stop_reason) == ("stop", "beta")


def test_without_detokenize_an_offline_request_has_ids_and_no_text(llm):
    with_text = llm.generate([PROMPT], PARAMS, use_tqdm=False)[0]
    ids_only = llm.generate([PROMPT], replace(PARAMS, detokenize=False), use_tqdm=False)[0]
    assert [c.token_ids for c in ids_only.outputs] == [c.token_ids for c in with_text.outputs]
    assert [c.text for c in ids_only.outputs] == ["", ""]
    with pytest.raises(ValueError, match="stop strings are only supported when detokenize"):
        SamplingParams(stop=["e"], detokenize=False)
