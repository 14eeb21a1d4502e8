"""The embeddings route (``/v1/embeddings``)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
