"""Encoders through ``LLM(..., runner="pooling")`` equal HF transformers in fp32.

BERT (CLS and mean pooled embeddings, a classifier fed a sentence pair's token types),
RoBERTa, XLM-RoBERTa and its classifier, on tiny random checkpoints (``encoder_models``):
prompts of different lengths share a step; a budget smaller than two prompts still runs
each prompt whole (a split prompt would attend to only part of itself and differ from
HF); a prompt longer than the position table is refused. (Tensor parallelism is left to
the parallel tests: two gloo ranks cost over a minute here.)
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from encoder_models import build_bert, build_roberta
from octavo import LLM
from octavo.pooling.params import PoolingParams

TOLERANCE = 1e-5
# different lengths (RoBERTa-style ids: 0 = <s>, 2 = </s>; BERT's: 2 = [CLS], 3 = [SEP])
PROMPTS = [[2, 17, 33, 5, 99, 4, 3], list(range(5, 45)), [2, 7, 3], list(range(100, 113))]
PAIR = [2, 11, 12, 13, 3, 21, 22, 3]  # [CLS] a b c [SEP] d e [SEP]
PAIR_TYPES = [0, 0, 0, 0, 0, 1, 1, 1]
BUDGET = 128  # tokens a step (an encoder's least: its longest prompt): less than these two
LONG_PROMPTS = [list(range(5, 105)), list(range(110, 200))]


def start(folder, **options) -> LLM:
    return LLM(str(folder), device="cpu", dtype="float32", runner="pooling", **options)


def engine_vectors(llm: LLM, prompts, params: PoolingParams | None = None) -> list[torch.Tensor]:
    requests = [{"prompt_token_ids": prompt} for prompt in prompts]
    outputs = llm.embed(requests, params, use_tqdm=False)
    return [torch.tensor(output.outputs.embedding) for output in outputs]


def hf_pooled(model, prompt, pooling: str, token_types=None) -> torch.Tensor:
    """transformers' pooled (normalised) last hidden state, or a classifier's logits."""
    ids = torch.tensor([prompt])
    types = None if token_types is None else torch.tensor([token_types])
    with torch.no_grad():
        out = model(ids, token_type_ids=types)
    if pooling == "logits":
        return out.logits[0]
    hidden = out.last_hidden_state[0]
    vector = hidden[0] if pooling == "cls" else hidden.mean(dim=0)
    return F.normalize(vector, dim=-1)


def assert_close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a - b).abs().max().item() < TOLERANCE, f"prompt {index}: {a} != {b}"


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return build_bert(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def bert(bert_folder):
    """One BERT engine with a step budget smaller than two of the long prompts."""
    llm = start(bert_folder, max_num_batched_tokens=BUDGET)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def bert_hf(bert_folder):
    from transformers import BertModel

    return BertModel.from_pretrained(bert_folder).eval()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_bert_embeddings_equal_hf(bert, bert_hf, pooling):
    params = PoolingParams(pooling_type=pooling.upper())
    got = engine_vectors(bert, PROMPTS, params)
    assert_close(got, [hf_pooled(bert_hf, prompt, pooling) for prompt in PROMPTS])


def test_budget_smaller_than_two_prompts_runs_each_whole(bert, bert_hf):
    assert sum(map(len, LONG_PROMPTS)) > BUDGET
    got = engine_vectors(bert, LONG_PROMPTS)
    assert_close(got, [hf_pooled(bert_hf, prompt, "cls") for prompt in LONG_PROMPTS])


def test_prompt_longer_than_positions_is_refused(bert):
    too_long = [5] * 129  # the position table holds 128
    with pytest.raises(ValueError, match="129"):
        engine_vectors(bert, [too_long])
    assert len(engine_vectors(bert, [PROMPTS[0]])[0]) == 64  # the engine still serves


def test_bert_classifier_reads_token_types(tmp_path):
    from transformers import BertForSequenceClassification

    folder = build_bert(tmp_path / "bert-cls", kind="classifier", num_labels=3)
    hf = BertForSequenceClassification.from_pretrained(folder).eval()
    llm = start(folder)
    try:
        paired = engine_vectors(llm, [PAIR], PoolingParams(token_type_ids=PAIR_TYPES))
        plain = engine_vectors(llm, PROMPTS)
    finally:
        llm.shutdown()
    assert_close(paired, [hf_pooled(hf, PAIR, "logits", PAIR_TYPES)])
    assert (paired[0] - hf_pooled(hf, PAIR, "logits")).abs().max() > 1e-3  # types matter
    assert_close(plain, [hf_pooled(hf, prompt, "logits") for prompt in PROMPTS])


@pytest.mark.parametrize("architecture", ["RobertaModel", "XLMRobertaModel"])
def test_roberta_embeddings_equal_hf(tmp_path, architecture):
    import transformers

    folder = build_roberta(tmp_path / "roberta", architectures=[architecture])
    if architecture == "XLMRobertaModel":
        config = transformers.XLMRobertaConfig.from_pretrained(folder)
        transformers.XLMRobertaModel(config).save_pretrained(folder)  # its own class
    hf = getattr(transformers, architecture).from_pretrained(folder).eval()
    llm = start(folder)
    try:
        got = engine_vectors(llm, PROMPTS)
    finally:
        llm.shutdown()
    assert_close(got, [hf_pooled(hf, prompt, "cls") for prompt in PROMPTS])


def test_xlm_roberta_classifier_equals_hf(tmp_path):
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    folder = build_roberta(tmp_path / "xlmr-cls", classifier=True, num_labels=2)
    torch.manual_seed(7)
    config = XLMRobertaConfig.from_pretrained(folder)
    config.architectures = ["XLMRobertaForSequenceClassification"]
    hf = XLMRobertaForSequenceClassification(config).eval()
    hf.save_pretrained(folder)
    llm = start(folder)
    try:
        got = engine_vectors(llm, PROMPTS)
    finally:
        llm.shutdown()
    assert_close(got, [hf_pooled(hf, prompt, "logits") for prompt in PROMPTS])
