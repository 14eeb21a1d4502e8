"""Schemathesis fuzzes every operation of the server's OpenAPI schema: no 5xx, ever.

The schema is fetched from the running server (real uvicorn, tiny model); requests that
fit the schema (positive) and requests that break it (negative) must all be answered
with a success or a 4xx. The examples are derandomized so a run is reproducible; set
OCTAVO_FUZZ_EXAMPLES=500 for a longer search, OCTAVO_FUZZ_RANDOM=1 for a fresh one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from octavo.engine.core_thread import ThreadCore
from octavo.entrypoints.openai.app import build_app
from octavo.entrypoints.openai.context import ServerConfig

from server_harness import ThreadedServer, build_local_app, torch_threads

MODEL = "tiny"
MAX_EXAMPLES = int(os.environ.get("OCTAVO_FUZZ_EXAMPLES", "25"))
REQUEST_TIMEOUT = 60


def fuzz_cases() -> list[tuple[str, str, GenerationMode]]:
    """(method, path, mode) for every operation the app documents (no engine needed).

    Negative cases need an input to break, so operations without any get positive only
    (a path parameter that takes any string, such as a response id, cannot be broken).
    """
    config = ServerConfig(served_model_names=[MODEL], model_root=MODEL)
    paths = build_app(config, ThreadCore(lambda: None)).openapi()["paths"]
    cases = []
    for path, item in paths.items():
        for method, operation in item.items():
            modes = [GenerationMode.POSITIVE] + [GenerationMode.NEGATIVE] * breakable(operation)
            cases += [(method.upper(), path, mode) for mode in modes]
    return cases


def breakable(operation: dict) -> bool:
    """Has the operation an input that some request could get wrong?"""
    if "requestBody" in operation:
        return True
    return any(not _any_string(parameter) for parameter in operation.get("parameters", []))


def _any_string(parameter: dict) -> bool:
    schema = parameter.get("schema", {})
    return schema.get("type") == "string" and set(schema) <= {"type", "title"}


CASES = fuzz_cases()


@pytest.fixture(scope="module")
def live(tiny_folder) -> Iterator[tuple[str, schemathesis.BaseSchema]]:
    config = ServerConfig(served_model_names=[MODEL], model_root=MODEL)
    # A short context bounds what one example can cost: at most ~34 chat tokens per choice
    # (the chat template alone takes 30), 400 for anything longer.
    app = build_local_app(
        str(tiny_folder("llama3")), config, max_model_len=64, kv_cache_memory=8 << 20
    )
    with torch_threads(1), ThreadedServer(app) as server:
        server.wait_ready()
        yield server.url, schemathesis.openapi.from_url(f"{server.url}/openapi.json")


def test_every_served_operation_is_fuzzed(live):
    _, schema = live
    served = {
        (result.ok().method.upper(), result.ok().path) for result in schema.get_all_operations()
    }
    assert served == {(method, path) for method, path, _ in CASES}
    assert {path for _, path in served} >= {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/health",
        "/metrics",
        "/version",
    }


@pytest.mark.parametrize(
    ("method", "path", "mode"), CASES, ids=[f"{m} {p} {mode.value}" for m, p, mode in CASES]
)
def test_no_server_errors(live, method: str, path: str, mode: GenerationMode):
    url, schema = live
    operation = schema[path][method]

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=os.environ.get("OCTAVO_FUZZ_RANDOM") != "1",
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def answers_without_5xx(case: schemathesis.Case) -> None:
        response = case.call(base_url=url, timeout=REQUEST_TIMEOUT)
        assert response.status_code < 500, (
            f"{response.status_code} {response.text[:500]}\n{case.as_curl_command()}"
        )

    answers_without_5xx()
