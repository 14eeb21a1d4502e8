"""The vision benchmark's workloads: prompts with random images, the same for every engine.

Every image is drawn from its own seed, so no two workloads (and no two requests of a
workload, except in the ``repeated`` one) send the same image: neither engine's encoder
cache nor vLLM's processor cache helps across them. Each prompt starts with its own
request number, so prompts never share prefix blocks past the first few tokens either
way (the benchmark also turns prefix caching off).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PIL import Image

from octavo_bench.vision_model import IMAGE_PLACEHOLDER

THROUGHPUT = "throughput"  # the batch submitted whole, timed: requests/s
TTFT = "ttft"  # one request at a time, max_tokens 1, each timed: time to first token
ONE_IMAGE, FOUR_IMAGES, REPEATED = "1 image", "4 images", "1 image, repeated"
TTFT_ONE, TTFT_FOUR = "TTFT 1 image", "TTFT 4 images"


@dataclass
class VisionWorkload:
    name: str
    kind: str  # THROUGHPUT or TTFT
    prompts: list[str]
    images: list[list[Image.Image]]  # each prompt's images, in placeholder order
    max_tokens: int

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def images_per_request(self) -> int:
        return len(self.images[0]) if self.images else 0


@dataclass
class WorkloadSizes:
    one_image_requests: int = 16
    four_image_requests: int = 8
    ttft_repeats: int = 5
    max_tokens: int = 16
    image_size: int = 336
    placeholder: str = IMAGE_PLACEHOLDER  # one image's text in the prompt


def random_image(seed: int, size: int) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(size, size, 3, generator=generator) * 255).to(torch.uint8)
    return Image.fromarray(pixels.numpy())


def prompt(number: int, num_images: int, placeholder: str = IMAGE_PLACEHOLDER) -> str:
    pictures = "picture" if num_images == 1 else "pictures"
    return f"Request {number}: {placeholder * num_images}Describe the {pictures} in detail."


class ImageDraw:
    """Fresh images: each call draws from seeds never used before in this run."""

    def __init__(self, size: int, first_seed: int = 1000) -> None:
        self.size = size
        self.next_seed = first_seed

    def images(self, count: int) -> list[Image.Image]:
        seeds = range(self.next_seed, self.next_seed + count)
        self.next_seed += count
        return [random_image(seed, self.size) for seed in seeds]


def build(
    name: str, kind: str, images: list[list[Image.Image]], max_tokens: int, placeholder: str
) -> VisionWorkload:
    prompts = [prompt(number, len(group), placeholder) for number, group in enumerate(images)]
    return VisionWorkload(name, kind, prompts, images, max_tokens)


def vision_workloads(sizes: WorkloadSizes, draw: ImageDraw) -> list[VisionWorkload]:
    """1 image, 4 images, 1 image repeated (one fresh image in every request), and the
    TTFT runs of 1 and 4 images; all with distinct images but the repeated one."""
    ones, fours, ttft = sizes.one_image_requests, sizes.four_image_requests, sizes.ttft_repeats
    plans = [  # (name, kind, each request's images, max_tokens)
        (ONE_IMAGE, THROUGHPUT, [draw.images(1) for _ in range(ones)], sizes.max_tokens),
        (FOUR_IMAGES, THROUGHPUT, [draw.images(4) for _ in range(fours)], sizes.max_tokens),
        (REPEATED, THROUGHPUT, [draw.images(1)] * ones, sizes.max_tokens),
        (TTFT_ONE, TTFT, [draw.images(1) for _ in range(ttft)], 1),
        (TTFT_FOUR, TTFT, [draw.images(4) for _ in range(ttft)], 1),
    ]
    return [build(*plan, sizes.placeholder) for plan in plans]


def warmup_workload(draw: ImageDraw, placeholder: str) -> VisionWorkload:
    """Untimed: a 1-image and a 4-image request, 4 tokens each."""
    return build("warm-up", THROUGHPUT, [draw.images(1), draw.images(4)], 4, placeholder)
