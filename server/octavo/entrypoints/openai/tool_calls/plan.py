"""What a chat request's ``tools`` / ``tool_choice`` ask of the generation, and its answer.

- no tools, or ``none``: plain generation (the tools are not shown to the model);
- the tools are shown to the model by its chat template, or, when the template never uses
  them, as text in the system message (``octavo.inputs.tool_prompt``, the one check of
  the template being ``render_chat_prompt``'s);
- a named function: the output is that function's arguments (``constraints.py``);
- ``required``: the output is a JSON array of calls, one at least;
- ``auto`` (the default with tools): free generation, the server's ``--tool-call-parser``
  reads calls out of the text; it needs ``--enable-auto-tool-choice``, as in vLLM. With
  ``parallel_tool_calls: false`` only the first call is kept (the others are dropped, as
  vLLM does: the model is free to write several).

A reply with calls has ``finish_reason`` "tool_calls" (unless it was cut by a length
limit) and each call an id ``call_<24 hex>``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from octavo.entrypoints.openai.errors import bad_request
from octavo.entrypoints.openai.protocol import ChatCompletionRequest, NamedToolChoice
from octavo.entrypoints.openai.tool_calls.constraints import (
    calls_from_required_output,
    named_call_constraint,
    required_calls_constraint,
)
from octavo.entrypoints.openai.tool_calls.parsers import (
    TOOL_CALL_PARSERS,
    ParsedToolCall,
    ToolCallParse,
    ToolCallParser,
)
from octavo.inputs.tool_prompt import ToolChoice
from octavo.structured_output.params import StructuredOutputsParams


@dataclass
class ToolPlan:
    mode: str  # "none", "auto", "named" or "required"
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool definitions
    name: str | None = None  # the named function
    parallel: bool = True
    parser: ToolCallParser | None = None

    @property
    def functions(self) -> list[dict[str, Any]]:
        return [tool["function"] for tool in self.tools]

    @property
    def schemas(self) -> dict[str, dict[str, Any]]:
        """Each function's ``parameters`` schema (parsers that type bare-text values)."""
        return {f["name"]: f.get("parameters") or {} for f in self.functions}

    def constraint(self) -> StructuredOutputsParams | None:
        if self.mode == "named":
            function = next(f for f in self.functions if f["name"] == self.name)
            return named_call_constraint(function.get("parameters"))
        if self.mode == "required":
            return required_calls_constraint(self.functions, self.parallel)
        return None

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools the chat template is shown."""
        return None if self.mode == "none" else self.tools

    def prompt_choice(self) -> ToolChoice:
        """How the fallback tool prompt asks for the reply (templates without tools)."""
        call_format = self.parser.call_format if self.parser is not None else None
        return ToolChoice(self.mode, self.name, self.parallel, call_format)

    def read(self, text: str) -> ToolCallParse:
        """The reply's content and calls from the generated ``text``."""
        if self.mode == "named":
            return ToolCallParse(None, [ParsedToolCall(self.name, text)])
        if self.mode == "required":
            try:
                return ToolCallParse(None, calls_from_required_output(text))
            except (ValueError, KeyError, TypeError):  # cut short by max_tokens
                return ToolCallParse(text)
        if self.mode == "auto":
            return self._at_most_one(self.parser.read(text, self.schemas))
        return ToolCallParse(text)

    def _at_most_one(self, parsed: ToolCallParse) -> ToolCallParse:
        """``parallel_tool_calls: false``: only the first call the model wrote (as vLLM)."""
        if self.parallel or len(parsed.calls) <= 1:
            return parsed
        return ToolCallParse(parsed.content, parsed.calls[:1])


def plan_tools(
    body: ChatCompletionRequest,
    auto_enabled: bool,
    parser: str | None,
) -> ToolPlan:
    """400 when ``auto`` is not enabled. Whether the chat template can show the tools is
    the rendering's to check (``render_chat_prompt``: as text when it cannot, or a 400
    with ``--no-tool-prompt-fallback``)."""
    choice = body.tool_choice or ("auto" if body.tools else "none")
    if choice == "none":
        return ToolPlan("none")
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools or []]
    parallel = body.parallel_tool_calls is not False
    if isinstance(choice, NamedToolChoice):
        return ToolPlan("named", tools, choice.function.name, parallel)
    if choice == "required":
        return ToolPlan("required", tools, None, parallel)
    if not auto_enabled or parser is None:
        raise bad_request(
            "tool_choice 'auto' (the default with tools) needs the server started with "
            "--enable-auto-tool-choice and --tool-call-parser; use tool_choice 'required' "
            "or name a function instead",
            param="tool_choice",
        )
    return ToolPlan("auto", tools, None, parallel, TOOL_CALL_PARSERS[parser])


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def finish_reason_with_calls(calls: list, finish_reason: str | None) -> str | None:
    """ "tool_calls" when the reply calls tools and was not cut short."""
    return "tool_calls" if calls and finish_reason == "stop" else finish_reason
