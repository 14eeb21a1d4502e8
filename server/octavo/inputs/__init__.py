"""Turning prompts into token ids, the same way for the offline ``LLM`` and the server.

``TextPrompt`` and ``TokensPrompt`` are importable from here, as from ``vllm.inputs``.
"""

from octavo.inputs.data import PromptType, TextPrompt, TokensPrompt

__all__ = ["PromptType", "TextPrompt", "TokensPrompt"]
