"""``--quantization NAME`` → the linear method every quantizable layer of the model uses.

Only the decoder's linears (Q/K/V, O, gate/up, down) are quantized; the embedding and
the LM head keep the model's dtype, as in vLLM, except a GGUF file's: llama.cpp stores
both quantized, and both keep the file's blocks (one storage when they are tied).
Methods live beside this file and plug into the one ``LinearMethod`` seam
(``layers/linear_method.py``), under the tensor-parallel layers, so quantization and
tensor parallelism combine.
"""

from __future__ import annotations

from collections.abc import Callable

from octavo.model_executor.layers.linear_method import LinearMethod
from octavo.model_executor.layers.quantization.fp8 import Fp8LinearMethod
from octavo.model_executor.layers.quantization.int8 import Int8LinearMethod
from octavo.model_executor.layers.quantization.prequantized import PrequantizedLinearMethod

QUANTIZATION_METHODS: dict[str, Callable[[], LinearMethod]] = {
    "int8": Int8LinearMethod,
    "fp8": Fp8LinearMethod,
    "gptq": PrequantizedLinearMethod,
    "awq": PrequantizedLinearMethod,
    "gguf": PrequantizedLinearMethod,
    "fp8_block": PrequantizedLinearMethod,  # an FP8 block checkpoint's tiles (fp8_blocks.py)
}
EXPERTS_ONLY = ("mxfp4",)  # only the MoE experts are stored quantized (moe/mxfp4_experts.py)
QUANTIZED_LM_HEAD = ("gguf",)  # a GGUF file quantizes its output matrix too (llama.cpp's)
QUANTIZED_EMBEDDING = ("gguf",)  # ... and its token embedding (rows dequantized on lookup)


def linear_method_for(quantization: str | None) -> LinearMethod | None:
    """A fresh method for one layer (``None``: the unquantized default)."""
    if quantization is None or quantization in EXPERTS_ONLY:
        return None
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(
            f"unknown quantization {quantization!r}; supported: {', '.join(QUANTIZATION_METHODS)}"
        )
    return QUANTIZATION_METHODS[quantization]()


def lm_head_method_for(quantization: str | None) -> LinearMethod | None:
    """The LM head's method: quantized only where the checkpoint stores it so."""
    return linear_method_for(quantization) if quantization in QUANTIZED_LM_HEAD else None
