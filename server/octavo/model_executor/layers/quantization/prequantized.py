"""``gguf``, ``gptq``, ``awq``: checkpoints that arrive quantized, kept quantized.

Their readers (``model_executor/gguf_checkpoint.py``, ``gptq_checkpoint.py``) hand each
matrix over as a ``QuantizedTensor`` of 32-column blocks; the layer's weight is a
``QuantizedWeight`` slot that keeps them, so nothing is expanded to the model's dtype.
On GPU, 4-bit blocks become the planes of the Triton kernel (``triton_int4.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.layers.quantization.quantized_tensor import (
    QuantizedTensor,
    QuantizedWeight,
    Segment,
)


class PrequantizedLinearMethod:
    def create_weights(self, layer: nn.Module, input_size: int, output_size: int, bias: bool):
        layer.weight = QuantizedWeight(output_size, input_size)
        layer.bias = nn.Parameter(torch.empty(output_size), requires_grad=False) if bias else None
        layer.segments = []
        layer.register_buffer("device_anchor", torch.empty(0), persistent=False)  # follows .to()

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        device = layer.device_anchor.device
        layer.segments = [_for_device(s) for s in layer.weight.finish(device)]
        for index, segment in enumerate(layer.segments):  # counted by loader.weight_bytes
            for name, tensor in segment_tensors(segment).items():
                layer.register_buffer(f"segment{index}_{name}", tensor, persistent=False)
        layer.weight = None

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        outputs = [segment.apply(x) for segment in layer.segments]
        out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
        return out if layer.bias is None else out + layer.bias


def segment_tensors(segment: Segment) -> dict[str, torch.Tensor]:
    weight = segment.weight
    if isinstance(weight, torch.Tensor):
        return {"dense": weight}
    if not isinstance(weight, QuantizedTensor):
        return weight.tensors()  # e.g. the GPU planes
    tensors = {"blocks": weight.blocks}
    if weight.column_order is not None:
        tensors["order"] = weight.column_order
    return tensors


def _for_device(segment: Segment) -> Segment:
    """GPU: 4-bit blocks → the Triton kernel's planes; CPU keeps the blocks."""
    weight = segment.weight
    if not isinstance(weight, QuantizedTensor) or weight.blocks.device.type != "cuda":
        return segment  # (a float matrix, or a StoredMatrix: FP8 tiles, MXFP4 groups)
    from octavo.model_executor.layers.quantization.triton_int4 import Int4Planes

    planes = Int4Planes.from_quantized(weight)
    return segment if planes is None else Segment(segment.start, planes)
