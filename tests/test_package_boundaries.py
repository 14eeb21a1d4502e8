"""What the serving package may import: no test code, and no cycles between its folders.

Every ``import`` of every module under ``server/octavo`` is read with ``ast``, lazy
imports inside functions included, so an import that only runs on some code path is
caught too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVING = ROOT / "server" / "octavo"
TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of each import in one file; relative ones resolved."""
    package = path.relative_to(SERVING.parent).with_suffix("").parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            yield node.lineno, ".".join([*base, *filter(None, [node.module])])


def serving_imports() -> dict[str, set[str]]:
    """Module name -> the places (file:line) under server/octavo that import it."""
    found: dict[str, set[str]] = {}
    for path in sorted(SERVING.rglob("*.py")):
        for line, module in imported_modules(path):
            found.setdefault(module, set()).add(f"{path.relative_to(ROOT)}:{line}")
    return found


def subpackage_graph() -> dict[str, set[str]]:
    """``octavo`` subpackage -> the other subpackages its modules import."""
    graph: dict[str, set[str]] = {}
    for path in sorted(p for p in SERVING.rglob("*.py") if p.parent != SERVING):
        source = path.relative_to(SERVING).parts[0]
        for _, module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "octavo" and len(parts) > 1 and parts[1] != source:
                graph.setdefault(source, set()).add(parts[1])
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first node repeated at the end), or None."""
    finished: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in finished:
            return None
        for target in sorted(graph.get(node, ())):
            if cycle := visit(target, [*path, node]):
                return cycle
        finished.add(node)
        return None

    return next(filter(None, (visit(node, []) for node in sorted(graph))), None)


def modules_of_test_code() -> set[str]:
    """Top-level names that are test code: each module of tests/, and the suites themselves."""
    return {path.stem for path in TESTS.glob("*.py")} | {"tests", "e2e", "pytest"}


def test_the_walk_sees_the_serving_packages_imports():
    imports = serving_imports()
    assert "torch" in imports and "octavo.config" in imports
    assert "octavo.entrypoints.openai.app" in imports  # a relative or lazy import would count
    assert {"server_harness", "prometheus_runner", "conftest"} <= modules_of_test_code()


def test_the_serving_package_imports_no_test_code():
    forbidden = modules_of_test_code()
    offenders = {
        module: sorted(places)
        for module, places in serving_imports().items()
        if module.partition(".")[0] in forbidden
    }
    assert not offenders, f"server/octavo imports test code: {offenders}"


def test_the_serving_package_has_no_test_modules():
    named = [p.relative_to(ROOT) for p in SERVING.rglob("*.py") if "test" in p.stem]
    assert not named, f"test helpers belong under tests/: {named}"


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}}) is None


def test_the_serving_packages_folders_import_each_other_without_cycles():
    """E.g. kv_cache sizes its tensors from a shape protocol, not model_executor's config."""
    graph = subpackage_graph()
    assert "kv_cache" in graph["model_executor"]  # the walk sees subpackage imports
    assert "model_executor" not in graph.get("kv_cache", set())
    cycle = find_cycle(graph)
    assert cycle is None, f"the octavo subpackages import in a cycle: {' -> '.join(cycle)}"


# The model library's shared modules; every other module under models/ is an architecture.
MODEL_LIBRARY = {"registry", "causal_lm", "decoder", "layer_spec", "__init__"}


def test_only_the_registry_names_concrete_model_classes():
    """Architectures are reached through ``models.registry``: nothing outside models/
    imports an architecture's module (vLLM's ModelRegistry rule)."""
    models = SERVING / "model_executor" / "models"
    architectures = {p.stem for p in models.glob("*.py")} - MODEL_LIBRARY
    assert {"llama"} <= architectures  # the walk sees the architecture files
    offenders = {
        module: sorted(
            p for p in places if not p.startswith("server/octavo/model_executor/models/")
        )
        for module, places in serving_imports().items()
        if module.startswith("octavo.model_executor.models.")
        and module.rpartition(".")[2] in architectures
    }
    offenders = {module: places for module, places in offenders.items() if places}
    assert not offenders, f"import architectures through models.registry: {offenders}"
