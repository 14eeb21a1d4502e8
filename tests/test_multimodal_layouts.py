"""Image placeholders that are not one unbroken run, and the per-image processor tensors.

Some processors put text tokens between an image's placeholder runs (tile or row
markers). An image then spans from its first placeholder to its last with a mask of the
positions that take its features; a prefill chunk that cuts the span takes exactly the
features of the masked positions it covers, in order.
"""

from __future__ import annotations

import pytest
import torch

from octavo.model_executor.image_embeds import EncoderCache, needed_slices, step_image_embeds
from octavo.model_executor.models.registry import supported_architectures, takes_images
from octavo.multimodal.inputs import ImageInput, placeholder_spans
from octavo.multimodal.layouts import LAYOUTS, stacked
from octavo.scheduler.output import ScheduledSequence

P = 99  # the placeholder token


def test_every_image_architecture_has_a_layout() -> None:
    image_architectures = {name for name in supported_architectures() if takes_images(name)}
    assert set(LAYOUTS) == image_architectures


def test_broken_runs_give_one_span_per_image_with_a_mask() -> None:
    ids = [1, P, P, 7, P, P, 2, P, P, P, 3]
    spans = placeholder_spans(ids, P, [4, 3])
    (offset0, length0, mask0), (offset1, length1, mask1) = spans
    assert (offset0, length0) == (1, 5)
    assert mask0.tolist() == [True, True, False, True, True]
    assert (offset1, length1, mask1) == (7, 3, None)


def test_a_count_that_disagrees_with_the_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="3 image placeholder tokens where its images need 4"):
        placeholder_spans([P, 5, P, P], P, [4])


def test_stacked_split_takes_each_images_row_of_the_keys_present() -> None:
    outputs = {
        "pixel_values": torch.arange(6).view(2, 3),
        "image_sizes": torch.tensor([[1, 2], [3, 4]]),
    }
    parts = stacked("pixel_values", "image_sizes", "absent")(outputs, 2)
    assert parts[1]["pixel_values"].tolist() == [3, 4, 5]
    assert parts[1]["image_sizes"].tolist() == [3, 4]
    assert set(parts[0]) == {"pixel_values", "image_sizes"}


def chunk(seq_id: int, computed: int, new: int) -> ScheduledSequence:
    return ScheduledSequence(
        seq_id=seq_id,
        token_ids=[0] * new,
        num_computed_tokens=computed,
        block_ids=[],
        sample=False,
    )


def test_a_chunk_cutting_a_masked_span_takes_the_features_of_its_masked_positions() -> None:
    ids = [1, P, P, 7, P, P, 2]
    ((offset, length, mask),) = placeholder_spans(ids, P, [4])
    image = ImageInput("h", offset, length, {"pixel_values": torch.zeros(1)}, mask)
    features = torch.arange(4.0).unsqueeze(1)  # feature i has value i
    cache = EncoderCache()
    calls: list[int] = []

    def encode(images: list[ImageInput]) -> list[torch.Tensor]:
        calls.append(len(images))
        return [features for _ in images]

    # Two chunks: positions [0, 3) at step rows 10.., then [3, 7) at step rows 0...
    first = needed_slices([chunk(0, 0, 3)], [10], {0: [image]})
    second = needed_slices([chunk(0, 3, 4)], [0], {0: [image]})
    a = step_image_embeds(first, cache, encode, torch.device("cpu"))
    b = step_image_embeds(second, cache, encode, torch.device("cpu"))
    assert a.rows.tolist() == [11, 12] and a.features.flatten().tolist() == [0.0, 1.0]
    assert b.rows.tolist() == [1, 2] and b.features.flatten().tolist() == [2.0, 3.0]
    assert calls == [1]  # the second chunk's features come from the encoder cache


def test_a_chunk_covering_only_the_text_between_runs_takes_nothing() -> None:
    mask = torch.tensor([True, False, False, True])
    image = ImageInput("h", 5, 4, {}, mask)
    assert needed_slices([chunk(0, 6, 2)], [0], {0: [image]}) == []
