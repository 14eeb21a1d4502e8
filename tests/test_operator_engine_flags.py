"""The CRD's engine fields and `octavo serve`'s flags cannot drift: every engine field is a
server flag with the same default and allowed values, every server flag the CRD leaves out
is listed here with the reason, and the operator's arguments parse with the server's parser
to the values of the spec."""

from __future__ import annotations

import re
from argparse import Namespace
from typing import Any

import pytest

from octavo.cli import build_parser
from octavo.entrypoints.openai.options import OPTIONS, Option
from octavo.spec_decode.config import KNOWN_KEYS, MAX_SPECULATIVE_TOKENS, METHODS, SpeculativeConfig
from octavo_operator.api.crd import custom_resource_definition
from octavo_operator.api.engine_fields import ENGINE_FIELDS, EngineField
from octavo_operator.api.engine_schema import OPERATOR_FLAGS
from octavo_operator.builders.container import server_args, server_env
from octavo_operator.builders.leader_worker_set import leader_worker_set

from isvc_factories import isvc

SERVER_OPTIONS = {option.flag: option for option in OPTIONS}
# Server flags that are not engine fields because the operator sets them from elsewhere.
SET_BY_THE_OPERATOR = {
    "--host": "the pod listens on every address",
    "--port": "the container port, Service and probes use constants.SERVER_PORT",
    "--served-model-name": "spec.model.servedName, else metadata.name",
    "--revision": "spec.model.revision",
    "--device": "cpu when spec.resources.gpu is 0, else the server's own choice",
    "--shutdown-timeout": "spec.drain: the grace period less preStopSeconds and a margin",
    "--enable-lora": "on whenever spec.adapters is set (even empty)",
    "--allow-runtime-lora-updating": "with spec.adapters: the operator loads them through it",
    "--lora-allowed-roots": "with spec.adapters: the claims' mount root (extraArgs may widen)",
    "--lora-modules": "spec.adapters, through a ConfigMap read as OCTAVO_LORA_MODULES",
    "--kv-events-config": "spec.router: KV events for the endpoint picker's prefix scorer",
    # spec.engine.nodes > 1: the LeaderWorkerSet's pods, from the env LWS injects.
    "--nnodes": "spec.engine.nodes, as $(LWS_GROUP_SIZE) (the LWS size)",
    "--node-rank": "0 on the group's leader, $(LWS_WORKER_INDEX) on its workers",
    "--master-addr": "$(LWS_LEADER_ADDRESS): the leader pod's name in the LWS's Service",
    "--master-port": "constants.MASTER_PORT, opened between the group's pods",
    "--headless": "on the LWS's worker pods only",
}
# Server flags deliberately not exposed as engine fields; engine.extraArgs can pass them.
LEFT_TO_EXTRA_ARGS = {
    "--enable-expert-parallel": "MoE expert placement per model and GPU count: via extraArgs",
    "--reasoning-parser": "per model family; reasoning output is new, extraArgs passes it",
    "--default-chat-template-kwargs": "a JSON object of template switches, per deployment",
    "--api-key": "a secret: spec.apiKeySecretRef puts it in OCTAVO_API_KEY, never in args",
    "--kv-cache-memory": "a byte count fits one GPU model; gpuMemoryUtilization scales",
    "--num-threads": "torch's default follows the container's CPUs; pin it only by hand",
    "--seed": "sampling reproducibility for tests and benchmarks, not a serving setting",
    "--max-queue-len": "HTTP admission tuning, rarely changed",
    "--max-sequences-per-request": "HTTP admission tuning, derived from the KV cache",
    "--limit-concurrency": "HTTP admission tuning, derived from --max-num-seqs",
    "--header-timeout": "HTTP connection tuning, rarely changed",
    "--log-level": "debugging one deployment, not a lasting setting",
    "--enable-auto-tool-choice": "tool calling is new; a spec field follows with the parsers",
    "--limit-mm-per-prompt": "vision models are new (LLaVA-1.5 only): via extraArgs for now",
    "--mm-processor-kwargs": "a JSON object for the model's HF processor, per model",
    "--allowed-media-domains": "image hosts a deployment trusts: per deployment, extraArgs",
    "--allowed-local-media-path": "a folder mounted into the pod by hand: extraArgs with it",
    "--tool-call-parser": "tool calling is new; a spec field follows with the parsers",
    # vLLM's spellings users paste (issue 26, item 12): passed as they are in extraArgs.
    "--chat-template": "a file in the image or inline text: per deployment, rarely changed",
    "--enable-chunked-prefill": "vLLM compatibility; the scheduler's default suits serving",
    "--enable-log-requests": "debugging one deployment, not a lasting setting",
    "--enable-prompt-tokens-details": "an API detail some clients ask for, rarely changed",
    "--enforce-eager": "vLLM compatibility; graphs are the server's own choice",
    "--compilation-config": "GPU tuning of graph capture sizes, rarely changed (extraArgs)",
    "--optimization-level": "vLLM's -O: the default level suits serving; -O0 is for debugging",
    "--cudagraph-capture-sizes": "GPU tuning of graph capture sizes, rarely changed",
    "--max-cudagraph-capture-size": "GPU tuning of graph capture sizes, rarely changed",
    "--cudagraph-metrics": "a log of graph use for tuning one deployment, not a lasting setting",
    "--performance-mode": "vLLM's batch-size presets; maxNumSeqs and the capture sizes say it",
    "--stream-interval": "streaming granularity against host work: tuned per deployment",
    "--disable-log-stats": "the stats lines are on, as in vLLM; quiet logs are per deployment",
    "--async-scheduling": "a GPU throughput switch being measured; extraArgs until default",
    "--load-format": "dummy weights are for benchmarks of a shape, not for serving",
    "--generation-config": "vLLM compatibility: the model's sampling defaults or none",
    "--kv-cache-dtype": "a memory/accuracy trade-off tuned per model by hand",
    "--task": "vLLM's older spelling of --runner: engine.runner is the field",
    "--pooler-config": "pooling defaults come from the model's sentence-transformers files",
    "--tool-prompt-fallback": "on by default; off only restores the 400 for tool-less templates",
    "--max-logprobs": "API limit tuning, rarely changed",
    "--num-speculative-tokens": "vLLM's older spelling: speculativeConfig is the field",
    "--speculative-model": "vLLM's older spelling: speculativeConfig is the field",
    "--response-role": "an API detail, rarely changed",
    "--return-tokens-as-token-ids": "an API detail some clients ask for, rarely changed",
    "--tokenizer": "a tokenizer other than the model's: rare, per deployment",
    "--trust-remote-code": "refused by the server (no remote code runs)",
    "--uvicorn-log-level": "debugging one deployment, not a lasting setting",
    "--node-join-timeout": "multi-node: how long the leader waits for slow image pulls",
    "--execute-model-timeout-seconds": "a wedged rank's bound: the default suits serving",
    "--hf-overrides": "a JSON patch of the model's config.json (e.g. rope scaling), per model",
    "--prefix-caching-hash-algo": "sha256 suits serving; sha256_cbor is for hashes outside Python",
    "--otlp-traces-endpoint": "a collector per cluster, set through spec.engine.extraArgs",
    "--disable-web-ui": "the page is behind the API key and not exposed unless port-forwarded",
    "--kv-offloading-size": "host memory per pod for the prefix cache's tier: via extraArgs",
    "--kv-offloading-backend": "only native exists; set with --kv-offloading-size in extraArgs",
    "--kv-transfer-config": "set through spec.engine.extraArgs / the operator's prefill pool",
}
# Every engine field away from its default, on 4 GPUs (tensor × pipeline ranks <= gpu).
FULL_ENGINE = {
    "maxModelLen": 8192,
    "maxNumSeqs": 64,
    "maxNumBatchedTokens": 4096,
    "blockSize": 32,
    "attentionBackend": "TRITON_ATTN",
    "gpuMemoryUtilization": 0.85,
    "enablePrefixCaching": False,
    "dtype": "bfloat16",
    "tensorParallelSize": 2,
    "pipelineParallelSize": 2,
    "quantization": "int8",
    "runner": "generate",
    "speculativeConfig": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5},
    "maxLoras": 4,
    "maxLoraRank": 64,
    "maxCpuLoras": 32,
    "logFormat": "json",
}


def server_option(field: EngineField) -> Option:
    return SERVER_OPTIONS[field.flag]


def crd_engine() -> dict[str, Any]:
    root = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root["properties"]["spec"]["properties"]["engine"]


def crd_choices(name: str) -> set[Any]:
    """The values the generated CRD allows for engine.NAME: its enum, or a CEL rule
    `self.NAME in [...]`; empty if it allows any value of its type."""
    engine = crd_engine()
    if "enum" in engine["properties"][name]:
        return set(engine["properties"][name]["enum"])
    for validation in engine["x-kubernetes-validations"]:
        found = re.search(rf"self\.{name} in \[([^\]]*)\]", validation["rule"])
        if found:
            return {int(v) for v in found.group(1).split(",")}
    return set()


def parse_serve(args: list[str]) -> Namespace:
    """ARGS (starting with `serve`) through the real `octavo serve` parser."""
    return build_parser().parse_args(args)


def test_every_engine_field_is_a_serve_flag():
    missing = [f.flag for f in ENGINE_FIELDS if f.flag not in SERVER_OPTIONS]
    assert missing == [], f"engine fields without an `octavo serve` flag: {missing}"
    assert [o.flag for o in OPTIONS if o.flag in OPERATOR_FLAGS] == list(OPERATOR_FLAGS)


def test_every_other_serve_flag_is_left_out_for_a_stated_reason():
    exposed = {f.flag for f in ENGINE_FIELDS}
    accounted = set(SET_BY_THE_OPERATOR) | set(LEFT_TO_EXTRA_ARGS)
    assert not exposed & accounted, "a flag is both an engine field and listed as left out"
    assert not set(SET_BY_THE_OPERATOR) & set(LEFT_TO_EXTRA_ARGS)
    unaccounted = sorted(set(SERVER_OPTIONS) - exposed - accounted)
    assert unaccounted == [], (
        f"new `octavo serve` flags {unaccounted}: add an EngineField for each "
        "(operator/octavo_operator/api/engine_fields.py) or list it in this test with why not"
    )
    assert sorted(accounted - set(SERVER_OPTIONS)) == [], "listed flags the server no longer has"


@pytest.mark.parametrize("field", ENGINE_FIELDS, ids=lambda f: f.name)
def test_engine_default_equals_the_server_default(field: EngineField):
    crd_default = crd_engine()["properties"][field.name].get("default")
    assert crd_default == field.default
    server_default = server_option(field).default
    if crd_default is not None and server_default is not None:
        assert crd_default == server_default
        assert type(crd_default) is type(server_default)


@pytest.mark.parametrize("field", ENGINE_FIELDS, ids=lambda f: f.name)
def test_allowed_values_equal_the_server_choices(field: EngineField):
    allowed = crd_choices(field.name)
    assert allowed == set(field.choices)
    server_choices = server_option(field).choices
    if server_choices is not None:
        assert allowed == set(server_choices), f"engine.{field.name} vs {field.flag}"
    for value in allowed:  # also where only the CRD restricts (tensorParallelSize)
        parsed = parse_serve(["serve", field.flag, str(value)])
        assert getattr(parsed, server_option(field).dest) == value


@pytest.mark.parametrize("field", ENGINE_FIELDS, ids=lambda f: f.name)
def test_values_at_the_crd_limits_parse_on_the_server(field: EngineField):
    schema = crd_engine()["properties"][field.name]
    edges = [schema[k] for k in ("default", "minimum", "maximum") if k in schema]
    for value in edges:
        args = ["serve", *field_args(field, value)]
        assert getattr(parse_serve(args), server_option(field).dest) == value


def field_args(field: EngineField, value: Any) -> list[str]:
    if field.is_switch:
        return [field.flag if value else "--no-" + field.flag.removeprefix("--")]
    return [field.flag, str(value)]


def test_full_spec_parses_to_its_values_with_the_server_parser():
    assert set(FULL_ENGINE) == {f.name for f in ENGINE_FIELDS}, "FULL_ENGINE sets every field"
    spec = {
        "model": {"uri": "hf://org/name", "revision": "main", "servedName": "chat-model"},
        "engine": {**FULL_ENGINE, "extraArgs": ["--seed", "7"]},
        "resources": {"gpu": 4},
    }
    parsed = parse_serve(server_args(isvc(spec)))
    for field in ENGINE_FIELDS:
        assert FULL_ENGINE[field.name] != server_option(field).default, field.name
        assert getattr(parsed, server_option(field).dest) == server_value(field, FULL_ENGINE)
    assert (parsed.model, parsed.revision) == ("hf://org/name", "main")
    assert parsed.served_model_name == ["chat-model"]
    assert parsed.seed == 7, "extraArgs reach the server"


def server_value(field: EngineField, engine: dict[str, Any]) -> Any:
    """What the server's parser makes of engine[field]: objects are parsed configs."""
    value = engine[field.name]
    return SpeculativeConfig.parse(value) if isinstance(value, dict) else value


def test_speculative_config_is_checked_by_the_crd_as_the_server_checks_it():
    schema = crd_engine()["properties"]["speculativeConfig"]
    assert tuple(schema["properties"]["method"]["enum"]) == METHODS
    count = schema["properties"]["num_speculative_tokens"]
    assert (count["minimum"], count["maximum"]) == (1, MAX_SPECULATIVE_TOKENS)
    assert set(schema["properties"]) == KNOWN_KEYS, "the CRD spells vLLM's keys, all of them"
    draft = {"model": "/models/draft", "num_speculative_tokens": 4}
    parsed = parse_serve(server_args(isvc({"engine": {"speculativeConfig": draft}})))
    assert parsed.speculative_config == SpeculativeConfig("draft_model", 4, model="/models/draft")


def test_cpu_spec_runs_on_cpu_without_gpu_only_flags():
    args = server_args(isvc({"resources": {"gpu": 0}}))
    parsed = parse_serve(args)
    assert parsed.device == "cpu"
    for field in ENGINE_FIELDS:
        if field.needs_gpu:
            assert field.flag not in args
            assert getattr(parsed, server_option(field).dest) == server_option(field).default


def test_empty_spec_parses_to_the_crd_defaults():
    parsed = parse_serve(server_args(isvc({})))
    for field in ENGINE_FIELDS:
        expected = field.default if field.default is not None else server_option(field).default
        assert getattr(parsed, server_option(field).dest) == expected, field.name


def test_flags_set_by_the_operator_are_in_its_args():
    spec = {
        "model": {"uri": "hf://org/name", "revision": "main"},
        "resources": {"gpu": 0},
        "adapters": [{"name": "a", "uri": "hf://org/a"}],
        "router": {"enabled": True},
    }
    args = server_args(isvc(spec))
    env = {e["name"] for e in server_env(isvc(spec))}
    assert "OCTAVO_LORA_MODULES" in env, "--lora-modules comes through the environment"
    leader, worker = group_args({**spec, "engine": {"nodes": 2}})
    set_somewhere = {*args, *leader, *worker, "--lora-modules"}
    missing = [flag for flag in SET_BY_THE_OPERATOR if flag not in set_somewhere]
    assert missing == []
    assert not set(LEFT_TO_EXTRA_ARGS) & set_somewhere, "left to extraArgs: not set by default"


def group_args(spec: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The leader's and the worker's `octavo serve` arguments of a LeaderWorkerSet."""
    group = leader_worker_set(isvc(spec), "octavo:1")["spec"]["leaderWorkerTemplate"]
    leader, worker = group["leaderTemplate"], group["workerTemplate"]
    return (leader["spec"]["containers"][0]["args"], worker["spec"]["containers"][0]["args"])


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """$(NAME) as the kubelet expands it from the container's environment."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def test_multi_node_pods_parse_to_their_place_in_the_group():
    """LWS injects LWS_GROUP_SIZE, LWS_LEADER_ADDRESS and LWS_WORKER_INDEX; with them the
    leader is node 0 of 2 and the worker node 1, headless, both dialling the leader."""
    spec = {"engine": {"nodes": 2, "pipelineParallelSize": 2}, "resources": {"gpu": 1}}
    leader, worker = group_args(spec)
    env = {"LWS_GROUP_SIZE": "2", "LWS_LEADER_ADDRESS": "chat-lws-0.chat-lws.team-a"}
    on_leader = parse_serve(expand(leader, {**env, "LWS_WORKER_INDEX": "0"}))
    on_worker = parse_serve(expand(worker, {**env, "LWS_WORKER_INDEX": "1"}))
    for parsed, rank in ((on_leader, 0), (on_worker, 1)):
        assert (parsed.nnodes, parsed.node_rank) == (2, rank)
        assert (parsed.master_addr, parsed.master_port) == ("chat-lws-0.chat-lws.team-a", 29501)
        assert parsed.pipeline_parallel_size == 2
    assert "--headless" in worker and "--headless" not in leader
    assert on_worker.headless is True
