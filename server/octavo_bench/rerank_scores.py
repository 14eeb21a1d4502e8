"""One query's document scores from each engine in the rerank benchmark.

Octavo: ``LLM.score(query, documents)`` where the engine has it; otherwise what it does,
spelt out: each pair's tokenizer encoding (``[CLS] query [SEP] document [SEP]``, token
types 0 then 1) pooled by the classifier in one batch, then the sigmoid of its logit.
sentence-transformers: ``CrossEncoder.predict`` (a sigmoid for one label, its default).
"""

from __future__ import annotations

import math

from octavo import LLM
from octavo.pooling.params import PoolingParams

MAX_LENGTH = 512


def octavo_scores(llm: LLM, query: str, documents: list[str]) -> list[float]:
    score = getattr(llm, "score", None)
    if score is not None:
        return [float(output.outputs.score) for output in score(query, documents, use_tqdm=False)]
    return scores_by_pooling(llm, query, documents)


def scores_by_pooling(llm: LLM, query: str, documents: list[str]) -> list[float]:
    """The pairs as prompts with their token types, all queued at once (``LLM.embed`` takes
    one PoolingParams for every prompt, and each pair has its own token types)."""
    encoded = llm.get_tokenizer()(
        [query] * len(documents), documents, truncation="only_second", max_length=MAX_LENGTH
    )
    prompts = [{"prompt_token_ids": ids} for ids in encoded["input_ids"]]
    params = [PoolingParams(token_type_ids=types) for types in encoded["token_type_ids"]]
    runner = llm.engine.parts.runner
    params = [runner.check_params(p) for p in params]
    outputs = llm._run_requests(  # embed's own queueing, with per-prompt params
        [llm._engine_prompt(p) for p in prompts], params, [None] * len(prompts), False, "scoring"
    )
    return [sigmoid(output.outputs.embedding[0]) for output in map(embedding_of, outputs)]


def embedding_of(output):
    from octavo.outputs import EmbeddingRequestOutput

    return EmbeddingRequestOutput.of(output)


def sigmoid(value: float) -> float:
    if value >= 0:
        return 1.0 / (1.0 + math.exp(-value))
    exp = math.exp(value)
    return exp / (1.0 + exp)


def sentence_transformers_scores(model, query: str, documents: list[str], batch_size: int):
    pairs = [(query, document) for document in documents]
    return model.predict(pairs, batch_size=batch_size, show_progress_bar=False).tolist()
