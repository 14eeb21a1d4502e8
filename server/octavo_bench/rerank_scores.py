"""One query's document scores from each engine in the rerank benchmark.

Octavo: ``LLM.score(query, documents)`` (each pair's tokenizer encoding, ``[CLS] query
[SEP] document [SEP]`` with token types 0 then 1, pooled by the classifier in one batch,
then the sigmoid of its logit). sentence-transformers: ``CrossEncoder.predict`` (a sigmoid
for one label, its default), in batches of ``batch_size``.
"""

from __future__ import annotations

from octavo import LLM


def octavo_scores(llm: LLM, query: str, documents: list[str]) -> list[float]:
    return [float(output.outputs.score) for output in llm.score(query, documents, use_tqdm=False)]


def sentence_transformers_scores(
    model, query: str, documents: list[str], batch_size: int
) -> list[float]:
    pairs = [(query, document) for document in documents]
    return model.predict(pairs, batch_size=batch_size, show_progress_bar=False).tolist()
