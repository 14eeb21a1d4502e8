"""Octavo: a paged-attention LLM engine with an OpenAI-compatible server and an operator."""

from octavo.config import EngineArgs
from octavo.entrypoints.llm import LLM
from octavo.lora_request import LoRARequest
from octavo.outputs import CompletionOutput, RequestOutput
from octavo.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineArgs",
    "LoRARequest",
    "RequestOutput",
    "SamplingParams",
]
__version__ = "0.1.0"
