"""Quantized linear methods, chosen by ``--quantization`` (vLLM's names)."""
