"""Which runner serves a model (vLLM's ``--runner``) and what that lets requests do.

``generate`` models generate text and also answer pooling requests (embeddings of their
final hidden states, pooled as ``PoolerConfig`` says); ``pooling`` models only pool: no
LM head is built and generation requests are refused. ``auto`` picks ``pooling`` for a
sentence-transformers folder (a ``modules.json`` with a Pooling module) or a bare
``*Model`` architecture (a checkpoint saved without its LM head), else ``generate``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from octavo.pooling.model_defaults import has_pooling_module
from octavo.pooling.params import PoolerConfig, PoolingParams, PoolingType
from octavo.sampling_params import SamplingParams

RUNNERS = ("auto", "generate", "pooling")
TASKS = {"auto": "auto", "generate": "generate", "embed": "pooling", "embedding": "pooling"}
POOLER_CONFIG_KEYS = ("pooling_type", "normalize")


def resolve_runner(runner: str, task: str | None, folder: Path, pooling_architecture: bool) -> str:
    """``generate`` or ``pooling`` (``task``: vLLM's older ``--task``, when given)."""
    if task is not None:
        if runner != "auto" and TASKS[task] not in ("auto", runner):
            raise ValueError(f"--task {task} contradicts --runner {runner}")
        runner = TASKS[task]
    if runner != "auto":
        return runner
    if pooling_architecture or has_pooling_module(folder):
        return "pooling"
    return "generate"


def parse_pooler_config(text: str | dict[str, Any]) -> dict[str, Any]:
    """``--pooler-config`` as JSON (vLLM's spelling): ``pooling_type``, ``normalize``."""
    values = json.loads(text) if isinstance(text, str) else dict(text)
    if not isinstance(values, dict):
        raise ValueError("--pooler-config must be a JSON object")
    unknown = sorted(set(values) - set(POOLER_CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"--pooler-config: unknown keys {unknown}; known: {', '.join(POOLER_CONFIG_KEYS)}"
        )
    if values.get("pooling_type") is not None:
        values["pooling_type"] = PoolingType.parse(values["pooling_type"]).value
    if values.get("normalize") is not None and not isinstance(values["normalize"], bool):
        raise ValueError("--pooler-config: normalize must be true or false")
    return values


@dataclass(frozen=True)
class RunnerSettings:
    """The runner an engine was built with and its model's pooling defaults."""

    kind: str  # "generate" or "pooling"
    pooler: PoolerConfig

    @property
    def generates(self) -> bool:
        return self.kind == "generate"

    def check_params(self, params: SamplingParams | PoolingParams) -> SamplingParams:
        """The engine's form of a request's settings; ValueError for what this model
        cannot do (generation on a pooling model, a size it cannot give)."""
        if isinstance(params, PoolingParams):
            return SamplingParams.for_pooling(params.resolve(self.pooler))
        if params.pooling is not None:
            return replace(params, pooling=params.pooling.resolve(self.pooler))
        if not self.generates:
            raise ValueError(
                "this model is served with --runner pooling: it returns embeddings "
                "(/v1/embeddings, LLM.embed) and does not generate text"
            )
        return params

    def check_task(self, task: str) -> None:
        """ValueError when this model cannot answer ``task``: "embed" (a classifier's
        vectors are logits), "classify" (needs a classifier), "score" or "pooling" (need
        a model served with ``--runner pooling``)."""
        if task != "embed" and self.generates:
            raise ValueError(
                f"{task} needs a model served with --runner pooling (an encoder, embedding "
                "model or classifier); this model is served with --runner generate"
            )
        if task == "embed" and self.pooler.classifies:
            raise ValueError(
                "this model is a sequence classifier: it returns class logits, not "
                "embeddings; use /classify, /score or /rerank"
            )
        if task == "classify" and not self.pooler.classifies:
            raise ValueError(
                "classify needs a sequence classification model (...ForSequenceClassification); "
                "this model returns embeddings"
            )
