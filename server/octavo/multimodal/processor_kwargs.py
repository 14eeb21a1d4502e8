"""``--mm-processor-kwargs`` (vLLM's flag): a JSON object passed to every call of the model
folder's HF processor, e.g. ``'{"max_pixels": 200704}'`` for Qwen2-VL's image size or
``'{"do_image_splitting": false}'`` for SmolVLM's tiles. Which keys a processor takes is
the processor's business; the keys the engine itself sets are refused."""

from __future__ import annotations

from typing import Any

from octavo.arg_types import json_object

# Set by the engine on each call: the prompt, its images, tensors as torch's.
ENGINE_SET_KEYS = ("text", "images", "return_tensors", "add_special_tokens")


def parse_mm_processor_kwargs(raw: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """The flag's JSON object (or ``LLM(mm_processor_kwargs={...})``'s dict) as a dict."""
    if raw is None:
        return None
    if not isinstance(raw, str | dict):
        raise ValueError(
            f"--mm-processor-kwargs: expected a JSON object (a dict), got {type(raw).__name__}"
        )
    kwargs = json_object(raw, "--mm-processor-kwargs")
    taken = sorted(set(kwargs) & set(ENGINE_SET_KEYS))
    if taken:
        raise ValueError(
            f"--mm-processor-kwargs: {', '.join(taken)} is set by the engine for each prompt"
        )
    return kwargs
