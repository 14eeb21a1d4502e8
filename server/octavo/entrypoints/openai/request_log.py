"""``--enable-log-requests``: one line per engine request, as vLLM's request logger."""

from __future__ import annotations

import logging

from octavo.lora_request import LoRARequest
from octavo.sampling_params import SamplingParams

logger = logging.getLogger("octavo.requests")


def log_request(
    request_id: str,
    token_ids: list[int],
    params: SamplingParams,
    lora_request: LoRARequest | None,
) -> None:
    """The request's id, sampling parameters, prompt token ids and adapter."""
    adapter = None if lora_request is None else lora_request.lora_name
    logger.info(
        "Received request %s: params: %s, prompt_token_ids: %s, lora_request: %s",
        request_id,
        params,
        token_ids,
        adapter,
    )
