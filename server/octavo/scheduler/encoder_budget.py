"""The vision encoder's work per step, beside the token budget (vLLM's encoder budget).

A prefill chunk that covers an image's features for the first time makes the worker
run the vision tower on the whole image; an image costs its number of features (as in
vLLM). The scheduler does not see the worker's encoder cache, so, as vLLM's
``EncoderCacheManager``, it keeps its own account: the images some running sequence has
scheduled and not yet passed (their features are in the worker's cache). Such an image
costs nothing to a later chunk of any sequence; one no sequence holds costs its features,
at most ``budget`` a step. A chunk stops before an image the step's remaining budget
cannot pay for (the next step takes it). An image larger than the whole budget is
admitted alone, in a step that has encoded nothing else: vLLM raises its budget to the
largest image the model can take, so such an image is never refused.

A sequence lets go of an image once its computed tokens have passed it, and of all of
them when it is preempted (its recompute is charged again) or finished.
``OCTAVO_MAX_NUM_BATCHED_ENCODER_EMBEDS`` sets the budget (vLLM's scheduler field
``max_num_batched_encoder_embeds``); by default it is the step's token budget, as vLLM's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from octavo.multimodal.inputs import ImageInput

BUDGET_ENV = "OCTAVO_MAX_NUM_BATCHED_ENCODER_EMBEDS"


def encoder_budget_from_env(max_num_batched_tokens: int) -> int:
    """``OCTAVO_MAX_NUM_BATCHED_ENCODER_EMBEDS`` as a positive count, else the token budget."""
    value = os.environ.get(BUDGET_ENV, "").strip()
    if not value:
        return max_num_batched_tokens
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{BUDGET_ENV} must be a whole number >= 1, not {value!r}")
    return int(value)


def encodes_features(image: ImageInput, start: int, end: int) -> bool:
    """Does the chunk ``[start, end)`` take any of ``image``'s features?"""
    part = image.overlap(start, end)
    return part is not None and len(image.features_in(*part)[0]) > 0


@dataclass
class EncoderBudget:
    budget: int  # image features the vision tower computes in one step at most
    holders: dict[str, set[int]] = field(default_factory=dict)  # hash -> sequence ids
    left: int = 0  # of this step's budget
    this_step: set[str] = field(default_factory=set)  # images charged this step

    def start_step(self) -> None:
        self.left, self.this_step = self.budget, set()

    def is_encoded(self, image: ImageInput) -> bool:
        """Charged this step, or held (its features cached) by some sequence."""
        return image.content_hash in self.this_step or bool(self.holders.get(image.content_hash))

    def chunk_end(self, images: Sequence[ImageInput], start: int, end: int) -> int:
        """Where the chunk ``[start, end)`` ends within what is left of this step's budget:
        before the first image it would encode that the budget cannot pay for (``start``
        when the chunk starts inside it). Charges nothing (``charge`` does)."""
        left, charged = self.left, set(self.this_step)
        for image in images:  # in prompt order
            if not encodes_features(image, start, end) or self.is_encoded(image):
                continue
            if image.content_hash in charged:
                continue
            cost = image.num_features
            alone = cost > self.budget and left == self.budget  # nothing else encoded yet
            if cost > left and not alone:
                return max(start, image.offset)
            left -= min(cost, left)
            charged.add(image.content_hash)
        return end

    def charge(self, seq_id: int, images: Sequence[ImageInput], start: int, end: int) -> None:
        """The chunk ``[start, end)`` of ``seq_id`` is scheduled: pay for the images it
        encodes, and hold every image it takes features of until it has passed them."""
        for image in images:
            if not encodes_features(image, start, end):
                continue
            if not self.is_encoded(image):
                self.left -= min(image.num_features, self.left)
                self.this_step.add(image.content_hash)
            self.holders.setdefault(image.content_hash, set()).add(seq_id)

    def release_passed(self, seq_id: int, images: Sequence[ImageInput], computed: int) -> None:
        """Let go of the images whose placeholders ``seq_id``'s computed tokens have passed."""
        for image in images:
            if image.end <= computed:
                self._release(seq_id, image.content_hash)

    def release_all(self, seq_id: int, images: Sequence[ImageInput]) -> None:
        """Preempted or finished: it holds none of its images any more."""
        for image in images:
            self._release(seq_id, image.content_hash)

    def _release(self, seq_id: int, content_hash: str) -> None:
        holders = self.holders.get(content_hash)
        if holders is None:
            return
        holders.discard(seq_id)
        if not holders:
            del self.holders[content_hash]
