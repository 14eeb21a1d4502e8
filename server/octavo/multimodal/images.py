"""Images from what a caller sends: PIL images, raw bytes or ``data:`` URLs.

The size is checked before the pixels are decoded (``Image.open`` reads only the header),
so a small file that claims a huge canvas (a decompression bomb) is refused without
allocating it. Anything PIL cannot decode is a ``ValueError`` naming the image.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from typing import Any

from PIL import Image

MAX_IMAGE_PIXELS = 64 * 1024 * 1024  # width x height of one image, at most


def load_image(source: Any, index: int = 0, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """A decoded RGB image from a PIL image, bytes, or a ``data:image/...;base64,`` URL."""
    if isinstance(source, Image.Image):
        check_pixels(source.size, index, max_pixels)
        return source.convert("RGB") if source.mode != "RGB" else source
    if isinstance(source, str):
        source = data_url_bytes(source, index)
    if not isinstance(source, bytes | bytearray):
        raise ValueError(
            f"image {index}: expected a PIL image, bytes or a data: URL, "
            f"got {type(source).__name__}"
        )
    return decode_bytes(bytes(source), index, max_pixels)


def data_url_bytes(url: str, index: int = 0) -> bytes:
    """The payload of a base64 ``data:`` URL (other schemes are not fetched here)."""
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0] if ":" in url else "a bare path"
        raise ValueError(f"image {index}: only data: URLs are accepted here, got {scheme}")
    header, _, payload = url.partition(",")
    if not header.endswith(";base64"):
        raise ValueError(f"image {index}: a data: URL must be base64 (data:image/png;base64,...)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"image {index}: the data: URL is not valid base64") from None


def decode_bytes(data: bytes, index: int, max_pixels: int) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data))  # the header only: size before pixels
        check_pixels(image.size, index, max_pixels)
        image.load()
        return image.convert("RGB")
    except ValueError:
        raise
    except (OSError, Image.DecompressionBombError, SyntaxError) as error:
        raise ValueError(f"image {index} could not be decoded: {error}") from None


def check_pixels(size: tuple[int, int], index: int, max_pixels: int) -> None:
    width, height = size
    if width * height > max_pixels:
        raise ValueError(
            f"image {index} is {width}x{height} pixels, more than the {max_pixels} allowed"
        )


def image_hash(image: Image.Image) -> str:
    """sha256 of the decoded pixels with the size and mode: the same picture in two
    encodings (PNG, JPEG re-saved losslessly) is one image."""
    digest = hashlib.sha256()
    digest.update(f"{image.mode}:{image.size[0]}x{image.size[1]}:".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()
