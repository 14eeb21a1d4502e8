"""Prefill chunks that never split an image (vLLM's ``disable_chunked_mm_input``).

A model whose image placeholders attend to each other both ways (Gemma 3) must compute
an image's placeholders in one forward step: a query early in the image sees keys later
in it. A chunk that would end inside an image stops before it; a chunk that starts at
(or, after a cached prefix, inside) an image takes the image's rest whole, or nothing
this step when the step's tokens cannot hold it. An image larger than a whole step's
budget could never be computed: ``check_images_fit`` refuses its request when it is added.
"""

from __future__ import annotations

from collections.abc import Sequence

from octavo.multimodal.inputs import ImageInput


def whole_image_chunk(images: Sequence[ImageInput], start: int, num_new: int, most: int) -> int:
    """Tokens from ``start`` to compute, at most ``num_new`` unless an image beginning at
    or before ``start`` needs more (then up to ``most``), ending outside every image."""
    end = start + num_new
    for image in images:  # in prompt order: at most one holds ``end``
        if not image.offset < end < image.end:
            continue
        if image.offset > start:
            return image.offset - start  # the image waits for the next chunk
        rest = image.end - start
        return rest if rest <= most else 0
    return num_new


def check_images_fit(images: Sequence[ImageInput], max_num_batched_tokens: int) -> None:
    """ValueError for an image whose placeholders a step's token budget cannot hold."""
    for image in images:
        if image.length > max_num_batched_tokens:
            raise ValueError(
                f"an image takes {image.length} placeholder tokens, more than the "
                f"{max_num_batched_tokens} tokens of a step (--max-num-batched-tokens); this "
                "model computes each image's tokens in one step: raise the budget"
            )
