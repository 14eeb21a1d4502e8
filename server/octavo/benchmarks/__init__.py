"""Benchmarks: offline engine throughput against HF transformers (and vLLM's CPU build)."""
