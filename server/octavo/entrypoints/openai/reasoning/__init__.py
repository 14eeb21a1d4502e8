"""Reasoning models: the thinking a model writes before its answer, put in
``reasoning_content`` (``--reasoning-parser``, vLLM's names)."""
