"""An embeddings request's ``input``, as the token ids of each input (tokenizer thread)."""

from __future__ import annotations

from octavo.engine.engine_info import EngineInfo
from octavo.entrypoints.openai.embeddings.protocol import EmbeddingRequest
from octavo.entrypoints.openai.errors import bad_request
from octavo.entrypoints.openai.prompts import check_text_fits
from octavo.inputs.token_range import check_prompt_token_ids

PARAM = "input"


def input_items(value: str | list) -> list[str | list[int]]:
    """The four accepted shapes as a list of inputs: texts or lists of token ids."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise bad_request("input must not be an empty list", param=PARAM)
    if all(isinstance(item, int) for item in value):
        return [list(value)]
    return list(value)


def embedding_inputs(
    body: EmbeddingRequest, items: list[str | list[int]], info: EngineInfo
) -> list[list[int]]:
    """Every input's token ids (``items``: ``input_items(body.input)``, counted by the
    caller before this runs): texts tokenized (with the model's special tokens unless
    ``add_special_tokens`` is false), ids checked; truncated from the left to
    ``truncate_prompt_tokens`` when given (-1: the context length), else 400 when an
    input is longer than the context."""
    if any(not item for item in items):
        raise bad_request("input must not contain empty strings or lists", param=PARAM)
    limit = _truncation(body.truncate_prompt_tokens, info.max_model_len)
    result = []
    for index, item in enumerate(items):
        token_ids = _token_ids(item, body.add_special_tokens, info, limit is None)
        if limit is not None:
            token_ids = token_ids[-limit:]
        _check_length(token_ids, index, info.max_model_len)
        result.append(token_ids)
    return result


def _truncation(value: int | None, max_model_len: int) -> int | None:
    if value is None:
        return None
    if value == -1:
        return max_model_len
    if value == 0 or value > max_model_len:
        raise bad_request(
            f"truncate_prompt_tokens must be -1 or in [1, {max_model_len}], got {value}",
            param="truncate_prompt_tokens",
        )
    return value


def _token_ids(
    item: str | list[int], add_special_tokens: bool, info: EngineInfo, check_chars: bool
) -> list[int]:
    if isinstance(item, str):
        if check_chars:
            check_text_fits(item, info, PARAM)
        return list(info.tokenizer.encode(item, add_special_tokens=add_special_tokens))
    try:
        check_prompt_token_ids(item, info.prompt_token_limit)
    except ValueError as error:
        raise bad_request(str(error), param=PARAM) from None
    return list(item)


def _check_length(token_ids: list[int], index: int, max_model_len: int) -> None:
    if len(token_ids) > max_model_len:
        raise bad_request(
            f"input {index} has {len(token_ids)} tokens, more than this model's context of "
            f"{max_model_len}; shorten it or set truncate_prompt_tokens",
            param=PARAM,
        )
