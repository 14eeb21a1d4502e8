"""vLLM's command-line spellings, rewritten into the flags Octavo's parser declares.

vLLM's ``FlexibleArgumentParser`` (0.32) reads a command line more loosely than argparse,
and deployments carry its lines over as they are:

- ``--max_model_len 512``: underscores in a flag's name read as dashes (up to the first
  ``.``; values are left alone);
- ``-cc`` is ``--compilation-config``, and ``-O`` followed by a JSON object too (vLLM's
  older spelling; ``-O3`` / ``-O 3`` / ``-O=3`` is the optimization level, which the
  parser takes itself);
- dotted keys of a JSON flag: ``--compilation-config.cudagraph_mode=FULL_DECODE_ONLY``,
  ``-cc.cudagraph_capture_sizes [1,2,4]``, ``-cc.cudagraph_capture_sizes+ 1,2,4`` (``+``:
  a comma-separated list), nested as ``--hf-overrides.rope_scaling.factor 4``; each value
  is JSON where it parses as JSON, else text. The keys of one flag are gathered into one
  JSON object, merged into the flag's own JSON object where the line also gives one (a
  dotted key wins).

Everything after a bare ``--`` is left as it is.
"""

from __future__ import annotations

import json
from typing import Any

SHORT_SPELLINGS = {"-cc": "--compilation-config"}
JSON_OVER_O = "--compilation-config"  # -O '{...}': vLLM's older spelling


def vllm_spellings(argv: list[str]) -> list[str]:
    """``argv`` with vLLM's spellings rewritten; ``ValueError`` for a dotted key without
    a value."""
    end = argv.index("--") if "--" in argv else len(argv)
    head = _long_names(argv[:end])
    dotted, head = _take_dotted(head)
    for flag, keys in dotted.items():
        head = _merge_into_flag(head, flag, keys)
    return head + argv[end:]


def _long_names(argv: list[str]) -> list[str]:
    """Underscores to dashes in long flag names; ``-cc`` and ``-O {json}`` to their flag."""
    out: list[str] = []
    for index, arg in enumerate(argv):
        if _is_long_flag(arg):
            name, equals, value = arg.partition("=")
            head, dot, tail = name.partition(".")
            out.append(head.replace("_", "-") + dot + tail + equals + value)
        elif _short_name(arg) in SHORT_SPELLINGS:
            out.append(SHORT_SPELLINGS[_short_name(arg)] + arg[len(_short_name(arg)) :])
        elif arg.startswith("-O{"):
            out += [JSON_OVER_O, arg[2:]]
        elif arg == "-O" and index + 1 < len(argv) and argv[index + 1].lstrip().startswith("{"):
            out.append(JSON_OVER_O)
        elif arg.startswith("-O."):
            out.append(JSON_OVER_O + arg[2:])
        else:
            out.append(arg)
    return out


def _is_long_flag(arg: str) -> bool:
    """``--name`` or ``--name=value``; not a value that starts with dashes and holds a
    space (``--serve-args "--max-model-len 1.5k"``)."""
    return arg.startswith("--") and " " not in arg.partition("=")[0]


def _short_name(arg: str) -> str:
    """``-cc`` of ``-cc``, ``-cc=...`` and ``-cc.key``."""
    return arg.split("=", 1)[0].split(".", 1)[0]


def _take_dotted(argv: list[str]) -> tuple[dict[str, dict], list[str]]:
    """The dotted keys by flag, and the line without them."""
    dotted: dict[str, dict] = {}
    rest: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        name, equals, text = arg.partition("=")
        if not (_is_long_flag(arg) and "." in name):
            rest.append(arg)
            index += 1
            continue
        if not equals:
            if index + 1 >= len(argv):
                raise ValueError(f"{arg} needs a value")
            text = argv[index + 1]
            index += 1
        flag, *keys = name.split(".")
        value = _dotted_value(text, keys[-1].endswith("+"))
        keys[-1] = keys[-1].removesuffix("+")
        _merge(dotted.setdefault(flag, {}), _nested(keys, value))
        index += 1
    return dotted, rest


def _dotted_value(text: str, is_list: bool) -> Any:
    if is_list:
        return [_json_or_text(item) for item in text.split(",") if item]
    return _json_or_text(text)


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _nested(keys: list[str], value: Any) -> dict:
    """``{"a": {"b": value}}`` of ``["a", "b"]``."""
    for key in reversed(keys):
        value = {key: value}
    return value


def _merge(into: dict, update: dict) -> None:
    """``update`` into ``into``, nested objects key by key."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _merge_into_flag(argv: list[str], flag: str, keys: dict) -> list[str]:
    """The flag's own JSON object (its last one, which argparse keeps) with ``keys``
    merged in, or the flag with ``keys`` alone appended."""
    for index in range(len(argv) - 1, -1, -1):
        arg = argv[index]
        if arg.startswith(flag + "="):
            own = _json_or_text(arg[len(flag) + 1 :])
            if isinstance(own, dict):
                _merge(own, keys)
                return [*argv[:index], f"{flag}={json.dumps(own)}", *argv[index + 1 :]]
        elif arg == flag and index + 1 < len(argv):
            own = _json_or_text(argv[index + 1])
            if isinstance(own, dict):
                _merge(own, keys)
                return [*argv[: index + 1], json.dumps(own), *argv[index + 2 :]]
    return [*argv, flag, json.dumps(keys)]
