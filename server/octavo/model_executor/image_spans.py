"""The image ranges a step's prefill chunks attend to both ways (Gemma 3).

transformers' Gemma 3 lets the placeholders of one image see each other (its mask ORs
the causal mask with "same image"); every other token stays causal. The scheduler keeps
an image's placeholders in one chunk for such a model, so each chunk's part of an image
is all of it, or its rest after a cached prefix (whose keys are earlier, hence visible).
"""

from __future__ import annotations

from octavo.multimodal.inputs import ImageInput
from octavo.scheduler.output import ScheduledSequence

Spans = list[list[tuple[int, int]]]  # per prefill chunk: position ranges [first, end)


def bidirectional_spans(
    scheduled: list[ScheduledSequence],
    num_prefills: int,
    images_of: dict[int, list[ImageInput]],
) -> Spans | None:
    """Per prefill chunk (the step's first ``num_prefills`` sequences), the part of each
    image's placeholder range it computes; None when no chunk holds two placeholders of
    one image (then attention is plain causal)."""
    spans: Spans = []
    for seq in scheduled[:num_prefills]:
        start = seq.num_computed_tokens
        end = start + seq.num_new_tokens
        parts = (image.overlap(start, end) for image in images_of.get(seq.seq_id, ()))
        spans.append([part for part in parts if part is not None and part[1] - part[0] > 1])
    return spans if any(spans) else None
