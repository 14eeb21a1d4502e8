"""A fake accelerator for CPU-only tests: ``meta`` tensors under CUDA's generator rule.

CUDA refuses to fill a tensor from a ``torch.Generator`` of another device ("Expected a
'cuda' device type for generator but found 'cpu'"); CPU and meta kernels do not check.
Inside ``FakeAccelerator()`` every torch call given a ``generator`` must produce a tensor
on that generator's device (else the same error CUDA raises), and reading a ``meta``
tensor back to the host (``cpu``, ``tolist``, ``item``, ``float``, ``int``, ``bool``) gives zeros,
so sampling code runs end to end on ``meta`` "logits" as it would on a GPU.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_HOST_READS = {
    torch.Tensor.cpu,
    torch.Tensor.tolist,
    torch.Tensor.item,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__bool__,
    torch.Tensor.__index__,
}


class FakeAccelerator(TorchFunctionMode):
    """``with FakeAccelerator(): ...`` — see the module doc."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            zeros = torch.zeros(args[0].shape, dtype=args[0].dtype)
            return func(zeros, *args[1:], **kwargs)
        result = func(*args, **kwargs)
        _check_generator(kwargs.get("generator"), result)
        return result


def _check_generator(generator: torch.Generator | None, result: object) -> None:
    if generator is None or not isinstance(result, torch.Tensor):
        return
    if result.device.type != generator.device.type:
        raise RuntimeError(
            f"Expected a '{result.device.type}' device type for generator but found "
            f"'{generator.device.type}'"
        )
