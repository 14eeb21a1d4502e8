"""Request and response bodies of /score, /rerank, /classify and /pooling, as vLLM names
them (score: ``text_1``/``text_2``, or ``queries`` with ``documents`` or ``items``, or
``data_1``/``data_2``; rerank: Jina's and Cohere's ``query``, ``documents``, ``top_n``)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from octavo.entrypoints.openai.protocol import RequestControls, check_prompt_shape

TextOrTexts = str | list[str]
# the names vLLM accepts for a score request's two sides, in the order it tries them
SCORE_FIELD_PAIRS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"))
SCORE_FIELD_PAIRS += (("data_1", "data_2"),)


def _check_input_shape(value: Any) -> Any:
    return check_prompt_shape(value, "input")


class PoolingRequestBase(RequestControls):
    model: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)  # -1: max_model_len
    user: str | None = None


class ScoreRequest(PoolingRequestBase):
    text_1: TextOrTexts | None = None
    text_2: TextOrTexts | None = None
    queries: TextOrTexts | None = None
    documents: TextOrTexts | None = None
    items: TextOrTexts | None = None
    data_1: TextOrTexts | None = None
    data_2: TextOrTexts | None = None

    def sides(self) -> tuple[tuple[str, TextOrTexts], tuple[str, TextOrTexts]] | None:
        """The two sides as (field name, value), under the first pair of names given."""
        for first, second in SCORE_FIELD_PAIRS:
            if getattr(self, first) is not None and getattr(self, second) is not None:
                return (first, getattr(self, first)), (second, getattr(self, second))
        return None


class RerankDocument(BaseModel):
    text: str


class RerankRequest(PoolingRequestBase):
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = None  # None or 0: every document; more than there are: every one
    return_documents: bool = True


class ClassificationRequest(PoolingRequestBase):
    input: Annotated[Any, AfterValidator(_check_input_shape)]
    add_special_tokens: bool = True


class PoolingRequest(ClassificationRequest):
    pass


class PoolingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ListResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    usage: PoolingUsage


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(ListResponse):
    data: list[ScoreData]


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: PoolingUsage
    results: list[RerankResult]


class ClassificationData(BaseModel):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassificationResponse(ListResponse):
    data: list[ClassificationData]


class PoolingData(BaseModel):
    index: int
    object: Literal["pooling"] = "pooling"
    data: list[float]


class PoolingResponse(ListResponse):
    data: list[PoolingData]


def usage_of(prompt_tokens: int) -> PoolingUsage:
    return PoolingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
