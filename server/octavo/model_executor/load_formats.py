"""``--load-format``: ``auto`` (the checkpoint's weights, safetensors or GGUF) or ``dummy``
(random weights, ``dummy_weights.py``), and which quantizations only a checkpoint gives."""

from __future__ import annotations

LOAD_FORMATS = ("auto", "dummy")
CHECKPOINT_FORMATS = ("gguf", "gptq", "awq", "fp8_block", "mxfp4")


def check_load_format(load_format: str, quantization: str | None) -> None:
    """ValueError for an unknown format, or dummy weights for a checkpoint-only layout."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"--load-format {load_format!r} is not one of {', '.join(LOAD_FORMATS)}")
    if load_format == "dummy" and quantization in CHECKPOINT_FORMATS:
        raise ValueError(
            f"--load-format dummy cannot make {quantization} weights (their quantized layout "
            "comes from a checkpoint); use --load-format auto, or an unquantized model "
            "(int8 and fp8 quantize dummy weights at load as any others)"
        )
