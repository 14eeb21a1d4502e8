"""``--mm-processor-kwargs`` (vLLM's flag): a JSON object for every HF processor call, as a
flag, an ``OCTAVO_*`` variable or ``LLM(mm_processor_kwargs=...)``. That the processor
gets them is tested on LLaVA-NeXT (``test_vision_llava_next.py``)."""

from __future__ import annotations

import pytest

from octavo.config import EngineArgs
from octavo.multimodal.processor_kwargs import parse_mm_processor_kwargs

from serve_args import clean_environment, parse  # noqa: F401 (an autouse fixture)


def test_the_flag_takes_a_json_object(capsys):
    from octavo.entrypoints.openai import options

    args = parse("--mm-processor-kwargs", '{"max_pixels": 200704}')
    engine = EngineArgs(**{o.dest: getattr(args, o.dest) for o in options.ENGINE_OPTIONS})
    assert engine.mm_processor_kwargs == {"max_pixels": 200704}
    assert EngineArgs().mm_processor_kwargs is None
    with pytest.raises(SystemExit):
        parse("--mm-processor-kwargs", "{max_pixels")
    assert "--mm-processor-kwargs: not JSON" in capsys.readouterr().err


def test_the_environment_variable_sets_it(monkeypatch):
    monkeypatch.setenv("OCTAVO_MM_PROCESSOR_KWARGS", '{"do_image_splitting": false}')
    assert parse().mm_processor_kwargs == {"do_image_splitting": False}


def test_keys_the_engine_sets_and_non_objects_are_refused():
    assert parse_mm_processor_kwargs({"num_crops": 4}) == {"num_crops": 4}
    with pytest.raises(ValueError, match="return_tensors, text is set by the engine"):
        parse_mm_processor_kwargs('{"text": "x", "return_tensors": "np"}')
    with pytest.raises(ValueError, match="expected a JSON object, got '\\[1\\]'"):
        EngineArgs(mm_processor_kwargs="[1]")
    with pytest.raises(ValueError, match="expected a JSON object \\(a dict\\), got int"):
        EngineArgs(mm_processor_kwargs=3)
