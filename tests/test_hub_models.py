"""Hugging Face Hub models: ``hf://org/name[@rev]`` parsing, offline refusal, cached snapshots."""

from __future__ import annotations

from pathlib import Path

import pytest

from octavo import LLM, SamplingParams
from octavo.cli import main
from octavo.entrypoints.openai import options
from octavo.model_executor import model_folders
from octavo.model_executor.hub import (
    HubModel,
    download_snapshot,
    hub_cache_dir,
    parse_hub_model,
    served_name,
)

from hub_cache import COMMIT, seed_snapshot

TINY_ARGS = {"dtype": "float32", "max_model_len": 64, "kv_cache_memory": 2**20}


@pytest.fixture
def offline_cache(monkeypatch, tmp_path) -> Path:
    """An empty hub cache with HF_HUB_OFFLINE=1 (read when a model is resolved)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.parametrize(
    ("model", "revision", "expected"),
    [
        ("hf://org/name", None, HubModel("org/name")),
        ("hf://org/name@v1.0", None, HubModel("org/name", "v1.0")),
        ("hf://Org-1/Name_2.5B", "main", HubModel("Org-1/Name_2.5B", "main")),
        ("hf://org/name@refs/pr/3", None, HubModel("org/name", "refs/pr/3")),
        ("org/name", "abc", HubModel("org/name", "abc")),
        ("/models/org/name", None, None),
        ("file:///models/name", None, None),
        ("./name", None, None),
        ("a/b/c", None, None),
    ],
)
def test_parse_hub_model(model, revision, expected):
    assert parse_hub_model(model, revision) == expected


def test_bare_name_that_exists_locally_is_a_folder(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert parse_hub_model("org/name") is None


@pytest.mark.parametrize(
    ("model", "revision", "message"),
    [
        ("hf://name-only", None, "hf://ORG/NAME"),
        ("hf://org/na me", None, "hf://ORG/NAME"),
        ("hf://org/name/extra", None, "hf://ORG/NAME"),
        ("hf://-org/name", None, "hf://ORG/NAME"),
        ("hf://", None, "hf://ORG/NAME"),
        ("hf://org/name@", None, "empty revision"),
        ("hf://org/name@v1", "v2", "pins revision 'v1' but --revision is 'v2'"),
        ("hf://org/name", "bad rev!", "not a valid revision"),
        ("s3://bucket/model", None, "unsupported scheme"),
    ],
)
def test_invalid_references_are_clear_errors(model, revision, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        parse_hub_model(model, revision)


def test_uri_and_served_name():
    assert HubModel("org/name", "v1").uri == "hf://org/name@v1"
    assert served_name("hf://org/name@v1") == "org/name"
    assert served_name("/models/x") == "/models/x"
    assert served_name("hf://bad") == "hf://bad"


def test_cache_defaults_to_octavo_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("OCTAVO_CACHE", str(tmp_path))
    assert hub_cache_dir() == tmp_path / "hf"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub_cache_dir() == tmp_path / "elsewhere"


def test_offline_with_an_empty_cache_is_a_clear_error(offline_cache):
    with pytest.raises(ValueError, match=r"not in the local Hugging Face cache .*HF_HUB_OFFLINE=1"):
        download_snapshot(HubModel("org/missing"))
    assert not any(offline_cache.iterdir())  # nothing was written


def test_serve_refuses_an_uncached_model_before_opening_the_port(offline_cache, capsys):
    assert main(["serve", "hf://org/missing", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "octavo: error: model 'hf://org/missing' is not in the local" in err


def test_early_check_does_not_download_when_online(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)

    def forbidden(hub: HubModel) -> Path:
        raise AssertionError(f"downloaded {hub.uri} before the port opened")

    monkeypatch.setattr(model_folders, "download_snapshot", forbidden)
    model_folders.check_model_early("hf://org/name", "v1")  # parses only
    with pytest.raises(ValueError, match="hf://ORG/NAME"):
        model_folders.check_model_early("hf://broken")


def test_revision_flag_and_environment(monkeypatch):
    from octavo.cli import build_parser

    monkeypatch.setenv("OCTAVO_REVISION", "from-env")
    args = build_parser().parse_args(["serve", "hf://org/name"])
    assert args.revision == "from-env"
    args = build_parser().parse_args(["serve", "hf://org/name", "--revision", COMMIT])
    assert args.revision == COMMIT
    assert "--revision" in {option.flag for option in options.OPTIONS}


def test_cached_snapshot_resolves_by_branch_tag_and_commit(offline_cache, tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text("{}")
    snapshot = seed_snapshot(offline_cache, "org/name", source, ("main", "v1"))
    for revision in (None, "main", "v1", COMMIT):
        assert download_snapshot(HubModel("org/name", revision)) == snapshot
    with pytest.raises(ValueError, match="not in the local Hugging Face cache"):
        download_snapshot(HubModel("org/name", "v2"))


def test_snapshot_without_config_is_refused(offline_cache, tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "README.md").write_text("no config here")
    seed_snapshot(offline_cache, "org/name", source, ("main",))
    with pytest.raises(ValueError, match=r"has no config\.json"):
        download_snapshot(HubModel("org/name"))


def test_engine_loads_a_cached_hub_model_offline(offline_cache, tiny_folder):
    folder = tiny_folder("llama3")
    seed_snapshot(offline_cache, "org/tiny-llama", folder, ("main",))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = [1, 2, 3, 4, 5]
    from_hub = LLM("hf://org/tiny-llama", revision="main", **TINY_ARGS)
    from_folder = LLM(str(folder), **TINY_ARGS)
    assert from_hub.engine.model_name == "org/tiny-llama"
    hub_ids = from_hub.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    folder_ids = from_folder.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert list(hub_ids) == list(folder_ids) and len(hub_ids) == 8
