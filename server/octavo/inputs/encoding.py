"""Encoding texts into token ids, off the GIL where the tokenizer allows it."""

from __future__ import annotations

from typing import Any


def encode_texts(
    tokenizer: Any, texts: list[str], add_special_tokens: bool = True
) -> list[list[int]]:
    """Token ids of each text, through the Rust tokenizer's GIL-free ``encode_batch``."""
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (Python) tokenizer: nothing releases the GIL anyway
        return [tokenizer.encode(text, add_special_tokens=add_special_tokens) for text in texts]
    encodings = backend.encode_batch(texts, add_special_tokens=add_special_tokens)
    return [encoding.ids for encoding in encodings]
