"""A step's image features: which flat token rows they replace, and the encoder cache.

During prefill, a chunk ``[start, end)`` of a sequence takes the features of the part of
each image's placeholder range it covers (only the positions of that range that take
features: some models put text tokens between an image's placeholder runs). An image's
features are computed once (all of them, by the vision tower) and kept in the
``EncoderCache`` under its content hash, so a prompt split inside a placeholder range, a
recomputed (preempted) sequence and another request sending the same image take them
from there; an evicted entry is recomputed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from octavo.multimodal.inputs import ImageInput
from octavo.scheduler.output import ScheduledSequence

DEFAULT_ENCODER_CACHE_ROWS = 16384  # image feature rows kept (e.g. 28 LLaVA-1.5 images)

# Images (their processor tensors) -> each image's features [rows, hidden], in order.
Encoder = Callable[[list[ImageInput]], list[torch.Tensor]]


@dataclass
class ImageEmbeds:
    rows: torch.Tensor  # [n] flat token rows of the step that are image placeholders
    features: torch.Tensor  # [n, hidden] what their embeddings become


@dataclass
class NeededSlice:
    rows: torch.Tensor  # the step's flat rows that take the slice's features, in order
    image: ImageInput
    first: int  # the slice of the image's features: [first, first + len(rows))

    @property
    def last(self) -> int:
        return self.first + len(self.rows)


class EncoderCache:
    """Image features by content hash, least recently used evicted past ``capacity_rows``."""

    def __init__(self, capacity_rows: int = DEFAULT_ENCODER_CACHE_ROWS) -> None:
        self.capacity_rows = capacity_rows
        self.entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.num_rows = 0
        self.hits = self.misses = 0

    def get(self, content_hash: str) -> torch.Tensor | None:
        features = self.entries.get(content_hash)
        if features is not None:
            self.entries.move_to_end(content_hash)
        return features

    def put(self, content_hash: str, features: torch.Tensor) -> None:
        if content_hash in self.entries:
            return
        self.entries[content_hash] = features
        self.num_rows += features.shape[0]
        while self.num_rows > self.capacity_rows and len(self.entries) > 1:
            _, evicted = self.entries.popitem(last=False)
            self.num_rows -= evicted.shape[0]


def needed_slices(
    scheduled: list[ScheduledSequence],
    seq_starts: list[int],
    images_of: dict[int, list[ImageInput]],
) -> list[NeededSlice]:
    """The image features each scheduled chunk covers, with the rows they go to."""
    needed = []
    for first_row, seq in zip(seq_starts, scheduled, strict=True):
        start = seq.num_computed_tokens
        end = start + seq.num_new_tokens
        for image in images_of.get(seq.seq_id, ()):
            part = image.overlap(start, end)
            if part is None:
                continue
            taken, first_feature = image.features_in(*part)
            if len(taken):
                rows = first_row + part[0] - start + taken
                needed.append(NeededSlice(rows, image, first_feature))
    return needed


def image_features(
    images: list[ImageInput], cache: EncoderCache, encode: Encoder
) -> dict[str, torch.Tensor]:
    """Every image's features: from the cache, the others through ``encode`` (in one call)
    and then cached."""
    found: dict[str, torch.Tensor] = {}
    missing: dict[str, ImageInput] = {}
    for image in images:
        cached = cache.get(image.content_hash)
        if cached is not None:
            found[image.content_hash] = cached
        else:
            missing[image.content_hash] = image
    cache.hits += len(found)
    cache.misses += len(missing)
    if not missing:
        return found
    computed = encode(list(missing.values()))
    for image, rows in zip(missing.values(), computed, strict=True):
        if rows.shape[0] != image.num_features:
            raise ValueError(
                f"an image has {rows.shape[0]} features but {image.num_features} placeholders"
            )
        found[image.content_hash] = rows
        cache.put(image.content_hash, rows)
    return found


def step_image_embeds(
    needed: list[NeededSlice], cache: EncoderCache, encode: Encoder, device: torch.device
) -> ImageEmbeds | None:
    """The step's ``ImageEmbeds`` (None when no chunk covers an image placeholder)."""
    if not needed:
        return None
    features = image_features([part.image for part in needed], cache, encode)
    rows = [part.rows for part in needed]
    slices = [features[p.image.content_hash][p.first : p.last] for p in needed]
    return ImageEmbeds(torch.cat(rows).to(device), torch.cat(slices))
