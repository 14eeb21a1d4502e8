"""``--limit-mm-per-prompt`` (vLLM's flag and JSON form): how many images a prompt may carry."""

from __future__ import annotations

from octavo.arg_types import json_object

DEFAULT_IMAGE_LIMIT = 8  # images per prompt when the flag does not say
MODALITIES = ("image",)


def parse_limit_mm_per_prompt(raw: str | dict | None) -> dict[str, int] | None:
    """``--limit-mm-per-prompt '{"image": N}'`` (vLLM's spelling) as a dict."""
    if raw is None:
        return None
    limits = json_object(raw, "--limit-mm-per-prompt")
    for modality, count in limits.items():
        if modality not in MODALITIES:
            raise ValueError(
                f"--limit-mm-per-prompt: unknown modality {modality!r}; "
                f"Octavo takes {', '.join(MODALITIES)}"
            )
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"--limit-mm-per-prompt: {modality} must be a count >= 0")
    return limits
