"""Decoders as sequence classifiers (``Qwen2ForSequenceClassification``, rerankers): the
decoder without its LM head, and a ``score`` linear (hidden → labels, no bias) on the last
prompt token's final hidden state. The pooled "vector" is the class logits.

A checkpoint of the classifier stores ``score.weight``. A causal LM can be served as one too
(vLLM's ``--hf-overrides``): ``classifier_from_token`` names tokens whose LM-head rows make
the head, looked up in the folder's tokenizer. With ``is_original_qwen3_reranker`` (or
``method: from_2_way_softmax``) the two tokens ``[no, yes]`` become one label whose weight
is ``row(yes) - row(no)``, so ``sigmoid(logit)`` is ``P(yes)`` under a softmax over the two;
otherwise (``no_post_processing``) each token's row is one label.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from octavo.model_executor.model_config import ModelConfig
from octavo.pooling.params import PoolerConfig, PoolingType

TWO_WAY = "from_2_way_softmax"
ROWS = "no_post_processing"
METHODS = (TWO_WAY, ROWS)


@dataclass(frozen=True)
class TokenHead:
    """The score head made of LM-head rows: the tokens and how their rows combine."""

    tokens: tuple[str, ...]
    method: str

    @property
    def num_labels(self) -> int:
        return 1 if self.method == TWO_WAY else len(self.tokens)


def token_head_of(config: ModelConfig) -> TokenHead | None:
    """The config's ``classifier_from_token`` head (None: the checkpoint stores ``score``);
    ValueError for settings that make no head."""
    hf = config.hf
    tokens = getattr(hf, "classifier_from_token", None)
    method = getattr(hf, "method", None)
    if getattr(hf, "is_original_qwen3_reranker", False):
        method = TWO_WAY
    if tokens is None:
        if method is not None:
            raise ValueError(f"method {method!r} needs classifier_from_token (a list of tokens)")
        return None
    if (
        not isinstance(tokens, list | tuple)
        or not tokens
        or not all(isinstance(token, str) for token in tokens)
    ):
        raise ValueError(f"classifier_from_token must be a list of tokens, got {tokens!r}")
    method = method or ROWS
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == TWO_WAY and len(tokens) != 2:
        raise ValueError(f"{TWO_WAY} needs two tokens ([false, true]), got {list(tokens)}")
    return TokenHead(tuple(tokens), method)


def score_labels(config: ModelConfig) -> int:
    """The head's outputs: the token head's labels, else the config's ``num_labels``."""
    head = token_head_of(config)
    return int(config.hf.num_labels) if head is None else head.num_labels


def token_ids(folder: Path, tokens: tuple[str, ...]) -> list[int]:
    """Each token's id in the folder's tokenizer; ValueError for one it does not have."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    ids = []
    for token in tokens:
        found = tokenizer.convert_tokens_to_ids(token)
        if found is None or (found == tokenizer.unk_token_id and token != tokenizer.unk_token):
            raise ValueError(f"classifier_from_token: {token!r} is not a token of {folder}")
        ids.append(int(found))
    return ids


def lm_head_rows(folder: Path, tied: bool, ids: list[int]) -> torch.Tensor:
    """The LM head's rows ``ids`` (the embedding's when tied), read alone from the
    checkpoint, as float32 ``[len(ids), hidden]``."""
    from octavo.model_executor.weights import iterate_checkpoint

    wanted = {"model.embed_tokens.weight", "embed_tokens.weight"} if tied else {"lm_head.weight"}
    for name, tensor in iterate_checkpoint(folder):
        if name in wanted:
            return torch.cat([tensor.narrow(0, i, 1).float() for i in ids])
    raise ValueError(f"checkpoint in {folder} has no {' or '.join(sorted(wanted))}")


class SequenceClassifier:
    """Mixin over a ``CausalLM`` (listed first): the ``score`` head on the last token."""

    classifies: ClassVar[bool] = True

    def __init__(self, config: ModelConfig, quantization: str | None = None) -> None:
        super().__init__(config, quantization)
        self.token_head = token_head_of(config)
        self.score = nn.Linear(config.hidden_size, score_labels(config), bias=False)
        self.requires_grad_(False)

    @classmethod
    def pooler_defaults(cls, config: ModelConfig) -> PoolerConfig:
        """The last token, not normalised: vectors are the logits of each label."""
        return PoolerConfig(PoolingType.LAST, False, score_labels(config), classifies=True)

    def extra_weight_keys(self) -> set[str]:
        own = set() if self.token_head is not None else {"score.weight"}
        return super().extra_weight_keys() | own

    def load_derived_weights(self, folder: Path) -> None:
        """The head from LM-head rows (``classifier_from_token``), once the rest is loaded."""
        head = self.token_head
        if head is None:
            return
        rows = lm_head_rows(folder, self.config.tie_word_embeddings, token_ids(folder, head.tokens))
        weight = rows[1:2] - rows[0:1] if head.method == TWO_WAY else rows
        self.score.weight.copy_(weight.to(self.score.weight.dtype))

    def pooling_head(self, pooled: torch.Tensor) -> torch.Tensor:
        """The logits of pooled final hidden states ``[n, hidden]``."""
        return self.score(pooled.to(self.score.weight.dtype))
