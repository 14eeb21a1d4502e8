"""Next-token selection: penalties, filters, random draws and logprobs.

``Sampler``, ``SampleResult`` and ``SamplingRow`` (``sampler.py``, torch) are imported on
first use, so that a torch-free module can import ``octavo.sampling.token_logprobs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from octavo.lazy_names import names_on_first_use

if TYPE_CHECKING:
    from octavo.sampling.sampler import Sampler, SampleResult, SamplingRow
    from octavo.sampling.token_logprobs import TokenLogprobs

_EXPORTS = {
    "SampleResult": "octavo.sampling.sampler",
    "Sampler": "octavo.sampling.sampler",
    "SamplingRow": "octavo.sampling.sampler",
    "TokenLogprobs": "octavo.sampling.token_logprobs",
}
__all__ = ["SampleResult", "Sampler", "SamplingRow", "TokenLogprobs"]

__getattr__ = names_on_first_use(__name__, _EXPORTS)
