"""A request's ``n`` completions count against ``--max-num-seqs`` (issue 26, item 2).

Forks used to be made after admission regardless of the limit, so three ``n=3``
requests under ``--max-num-seqs 4`` ran nine sequences at once. Now a request whose
completions do not fit waits, one that could never fit is refused (a 400 through the
API, naming the limit), and the running set never exceeds the limit.
"""

from __future__ import annotations

import httpx
import pytest

from octavo import LLM, SamplingParams

from conftest import tiny_server

MAX_NUM_SEQS = 4
ENGINE = {
    "dtype": "float32",
    "max_model_len": 256,
    "max_num_seqs": MAX_NUM_SEQS,
    "kv_cache_memory": 16 << 20,
}


@pytest.fixture(scope="module")
def llm(tiny_folder) -> LLM:
    return LLM(str(tiny_folder("llama3")), **ENGINE)


def record_running(llm: LLM) -> list[int]:
    """The number of running sequences after each step's scheduling (and forks)."""
    scheduler, counts = llm.engine.scheduler, []
    update = scheduler.update_from_output

    def recording_update(out, result, now):
        updates = update(out, result, now)
        counts.append(len(scheduler.running))
        return updates

    scheduler.update_from_output = recording_update
    return counts


def test_forked_requests_wait_for_room_and_never_exceed_the_limit(llm):
    counts = record_running(llm)
    params = SamplingParams(n=3, max_tokens=6, temperature=0.8, seed=5, ignore_eos=True)
    prompts = [[11, 12, 13], [21, 22, 23, 24], [31, 32]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [len(out.outputs) for out in outputs] == [3, 3, 3]
    assert all(len(c.token_ids) == 6 for out in outputs for c in out.outputs)
    assert max(counts) <= MAX_NUM_SEQS < 3 * len(prompts)
    assert max(counts) >= MAX_NUM_SEQS - 1  # one request at a time, three completions


def test_n_above_the_limit_is_refused_by_name(llm):
    with pytest.raises(ValueError, match=r"n=5 .*--max-num-seqs 4"):
        llm.generate([[1, 2, 3]], SamplingParams(n=5, max_tokens=2), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_the_api_answers_400_naming_the_limit(tiny_folder):
    with tiny_server(tiny_folder, "tiny", **ENGINE) as server:
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 2, "n": MAX_NUM_SEQS + 1}
        refused = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        body["n"] = MAX_NUM_SEQS
        accepted = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert "--max-num-seqs 4" in error["message"] and error["type"] == "invalid_request_error"
    assert accepted.status_code == 200 and len(accepted.json()["choices"]) == MAX_NUM_SEQS
