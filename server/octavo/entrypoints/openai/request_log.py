"""``--enable-log-requests``: a line when an engine request arrives, as vLLM's request
logger, and one when it finishes (tokens, finish reason, queue time, time to the first
token, end to end). The fields also go on the log record, so ``--log-format json`` gives
each its own key (``logging_format.REQUEST_FIELDS``)."""

from __future__ import annotations

import logging

from octavo.lora_request import LoRARequest
from octavo.outputs import RequestOutput
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
    fields = {"request_id": request_id, "adapter": adapter, "prompt_tokens": len(token_ids)}
    logger.info(
        "Received request %s: params: %s, prompt_token_ids: %s, lora_request: %s",
        request_id,
        params,
        token_ids,
        adapter,
        extra={**fields, "max_tokens": params.max_tokens},
    )


def log_finished(output: RequestOutput) -> None:
    """The finished request's token counts and timings (seconds, from its arrival)."""
    metrics = output.metrics
    fields = {
        "request_id": output.request_id,
        "prompt_tokens": output.num_prompt_tokens or len(output.prompt_token_ids),
        "completion_tokens": sum(len(choice.token_ids) for choice in output.outputs),
        "cached_tokens": output.num_cached_tokens,
        "finish_reason": ",".join(str(c.finish_reason) for c in output.outputs),
        "queue_s": _since(metrics.arrival_time, metrics.first_scheduled_time),
        "ttft_s": _since(metrics.arrival_time, metrics.first_token_time),
        "e2e_s": _since(metrics.arrival_time, metrics.finished_time or metrics.last_token_time),
    }
    logger.info(
        "Finished request %s: %s prompt + %s completion tokens (%s), e2e %s s",
        fields["request_id"],
        fields["prompt_tokens"],
        fields["completion_tokens"],
        fields["finish_reason"],
        fields["e2e_s"],
        extra=fields,
    )


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 6)
