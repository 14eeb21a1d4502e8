"""Octavo: a paged-attention LLM engine with an OpenAI-compatible server and an operator.

The names below are imported on first use (PEP 562), so that a process that needs only a
part of the package (the server's API process, the ``octavo`` client commands, a compile
worker) does not import the engine and torch with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from octavo.lazy_names import names_on_first_use

if TYPE_CHECKING:
    from octavo.config import EngineArgs
    from octavo.entrypoints.llm import LLM
    from octavo.lora_request import LoRARequest
    from octavo.outputs import CompletionOutput, RequestOutput
    from octavo.sampling_params import SamplingParams

_EXPORTS = {
    "LLM": "octavo.entrypoints.llm",
    "CompletionOutput": "octavo.outputs",
    "EngineArgs": "octavo.config",
    "LoRARequest": "octavo.lora_request",
    "RequestOutput": "octavo.outputs",
    "SamplingParams": "octavo.sampling_params",
}
__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineArgs",
    "LoRARequest",
    "RequestOutput",
    "SamplingParams",
]
__version__ = "0.1.0"

__getattr__ = names_on_first_use(__name__, _EXPORTS)
