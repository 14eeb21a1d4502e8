"""POST /score and /rerank: text pairs scored by a cross-encoder (one prompt per pair) or a
bi-encoder (cosine of the two texts' embeddings), through ``octavo.pooling.scoring``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse

from octavo.engine.engine_info import EngineInfo
from octavo.entrypoints.openai.context import ServerContext
from octavo.entrypoints.openai.errors import bad_request
from octavo.entrypoints.openai.scoring.engine_calls import check_task, pool_prompts, route_ids
from octavo.entrypoints.openai.scoring.protocol import (
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
    usage_of,
)
from octavo.pooling.scoring import (
    ScoringInputError,
    as_texts,
    check_pair_counts,
    plan_scores,
    truncation_limit,
)


@contextmanager
def scoring_errors() -> Iterator[None]:
    """Bad scoring input as a 400 naming its field."""
    try:
        yield
    except ScoringInputError as error:
        raise bad_request(str(error), param=error.param) from None


@dataclass(frozen=True)
class PairScores:
    scores: list[float]
    prompt_tokens: int


async def create_score(
    body: ScoreRequest, raw_request: Request, context: ServerContext
) -> JSONResponse:
    sides = body.sides()
    if sides is None:
        raise bad_request(
            "text_1 and text_2 are required (or queries with documents, or data_1 and data_2)",
            param="text_1",
        )
    (first_name, firsts), (second_name, seconds) = sides
    with scoring_errors():
        firsts, seconds = as_texts(firsts, first_name), as_texts(seconds, second_name)
        check_pair_counts(firsts, seconds, (first_name, second_name))
    ids = route_ids(raw_request, "score", body.request_id)
    result = await score_pairs(context, raw_request, ids, body, firsts, seconds)
    data = [ScoreData(index=index, score=score) for index, score in enumerate(result.scores)]
    response = ScoreResponse(
        id=ids.response,
        model=context.response_model(body.model),
        data=data,
        usage=usage_of(result.prompt_tokens),
    )
    return JSONResponse(response.model_dump())


async def create_rerank(
    body: RerankRequest, raw_request: Request, context: ServerContext
) -> JSONResponse:
    """Jina's and Cohere's rerank: every document scored against the query, best first,
    the first ``top_n`` kept (0 or more than there are: all)."""
    if not body.documents:
        raise bad_request("documents must not be empty", param="documents")
    if body.top_n is not None and body.top_n < 0:
        raise bad_request(f"top_n must be 0 or more, got {body.top_n}", param="top_n")
    texts = [doc.text if isinstance(doc, RerankDocument) else doc for doc in body.documents]
    ids = route_ids(raw_request, "rerank", body.request_id)
    result = await score_pairs(context, raw_request, ids, body, [body.query], texts)
    ranked = sorted(range(len(texts)), key=lambda index: -result.scores[index])
    keep = body.top_n if body.top_n else len(texts)
    results = [
        RerankResult(
            index=index,
            relevance_score=result.scores[index],
            document=RerankDocument(text=texts[index]) if body.return_documents else None,
        )
        for index in ranked[:keep]
    ]
    response = RerankResponse(
        id=ids.response,
        model=context.response_model(body.model),
        usage=usage_of(result.prompt_tokens),
        results=results,
    )
    return JSONResponse(response.model_dump(exclude_none=True))


async def score_pairs(
    context: ServerContext,
    raw_request: Request,
    ids,
    body: ScoreRequest | RerankRequest,
    firsts: list[str],
    seconds: list[str],
) -> PairScores:
    """Score the pairs on the engine (``firsts``: one text, or as many as ``seconds``)."""
    adapter = context.check_model(body.model)
    info = context.ready_info()
    check_task(info.runner, "score")
    cross = _cross_encoder(info)
    prompt_count = len(seconds) if cross else len(firsts) + len(seconds)
    context.check_fan_out(prompt_count, info, "documents")
    with scoring_errors():
        limit = truncation_limit(body.truncate_prompt_tokens, info.max_model_len)
        plan = await context.tokenizers.run(
            plan_scores, info.tokenizer, firsts, seconds, cross, limit, info.max_model_len
        )
    prompts = [prompt.token_ids for prompt in plan.prompts]
    pooling = [prompt.pooling_params() for prompt in plan.prompts]
    finals = await pool_prompts(context, raw_request, ids, prompts, pooling, adapter)
    scores = plan.scores([final.pooled for final in finals])
    return PairScores(scores, sum(final.num_prompt_tokens for final in finals))


def _cross_encoder(info: EngineInfo) -> bool:
    """A classifier scores pairs itself: with one label only (a cross-encoder)."""
    pooler = info.runner.pooler
    if pooler.classifies and pooler.hidden_size != 1:
        raise bad_request(
            f"scoring needs a cross-encoder with one label; this classifier has "
            f"{pooler.hidden_size} (use /classify for its class probabilities)",
            param="model",
        )
    return pooler.classifies
