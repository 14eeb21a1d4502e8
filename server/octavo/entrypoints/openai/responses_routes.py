"""The Responses API routes (``/v1/responses``)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
