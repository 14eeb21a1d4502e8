"""How large a constraint the server compiles: refused at once beyond it, with the limit named.

xgrammar's compile time grows much faster than the constraint's text. Measured on one
core of an AMD EPYC (SmolLM2's 49k vocabulary): 5,000 enum values, choices or regex
alternatives (≈ 40–75k characters) compile in 0.2–0.3 s, 20,000 of them (170–310k
characters) in 20–50 s; a 5,000-rule EBNF grammar (147k characters) takes 4 s, 1,000
required properties 0.4 s and 4,000 of them 5 s. The bound below refuses the
pathological sizes (100k entries: megabytes) before any compile; what stays under it and
is still slow is stopped by the compile deadline, in a process that is killed
(``compile_pool.py``). Real schemas, tool definitions included, are far smaller.
"""

from __future__ import annotations

from octavo.structured_output.compiler import GrammarCompileError
from octavo.structured_output.params import StructuredOutputsParams

MAX_CONSTRAINT_CHARS = 256 * 1024


def check_constraint_size(
    params: StructuredOutputsParams, max_chars: int = MAX_CONSTRAINT_CHARS
) -> None:
    """``GrammarCompileError`` naming the limit when ``params`` is too large to compile."""
    size = len(params.spec)
    if size > max_chars:
        raise GrammarCompileError(
            f"the {params.kind} constraint is {size:,} characters long; the limit is "
            f"{max_chars:,}: simplify it"
        )
