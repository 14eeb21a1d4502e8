"""Prompt logprobs (``echo`` + ``logprobs``) scored in bounded chunks (issue 26, item F):
a long prompt is computed at most ``PROMPT_SCORING_ROWS_PER_STEP`` tokens a step, and
the logprobs of every prompt token still equal the reference model's."""

from __future__ import annotations

import torch

from octavo import LLM, SamplingParams
from octavo.scheduler import scheduler as scheduler_module

PROMPT = [(i * 7919) % 40000 + 100 for i in range(40)]
ROWS_PER_STEP = 8
TIE = 1e-4  # logits this close to the token's count as ties for its rank


def test_chunked_prompt_logprobs_match_the_reference(tiny_folder, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(scheduler_module, "PROMPT_SCORING_ROWS_PER_STEP", ROWS_PER_STEP)
    folder = tiny_folder("llama3")
    llm = LLM(str(folder), dtype="float32", max_model_len=256, kv_cache_memory=16 << 20)
    chunks = []
    schedule = llm.engine.scheduler.schedule

    def recording_schedule():
        out = schedule()
        chunks.extend(s.num_new_tokens for s in out.prefills)
        return out

    llm.engine.scheduler.schedule = recording_schedule
    params = SamplingParams(max_tokens=1, prompt_logprobs=3, temperature=0)
    (output,) = llm.generate([PROMPT], params, use_tqdm=False)
    assert max(chunks) == ROWS_PER_STEP and sum(chunks) == len(PROMPT)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = torch.log_softmax(hf(torch.tensor([PROMPT])).logits[0].float(), dim=-1)
    entries = output.prompt_logprobs
    assert entries[0] is None and len(entries) == len(PROMPT)
    for position, entry in enumerate(entries[1:]):
        row = reference[position]
        assert entry.token_id == PROMPT[position + 1]
        assert abs(entry.logprob - float(row[entry.token_id])) < 1e-3
        # the rank counts the logits above the token's; those within fp32 noise of it (a
        # random model's vocabulary has many: on an Intel Xeon the engine ranked one below
        # where HF ranked it above) may fall either side, so the rank lies between the counts
        logit = row[entry.token_id]
        assert int((row > logit + TIE).sum()) + 1 <= entry.rank <= int((row > logit - TIE).sum())
        assert [t for t, _ in entry.top] == row.topk(3).indices.tolist()
