"""Next-token selection: penalties, filters, random draws and logprobs."""

from octavo.sampling.logprobs import TokenLogprobs
from octavo.sampling.sampler import Sampler, SampleResult, SamplingRow

__all__ = ["SampleResult", "Sampler", "SamplingRow", "TokenLogprobs"]
