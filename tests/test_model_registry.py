"""The registry is built from the model classes' own declarations.

``registry.MANIFEST`` (module -> architectures) only says which module to import; each
class declares the architectures it serves, its pooling aliases and whether it takes
images. These tests hold the two together and keep the index lazy.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from octavo.model_executor.models import registry
from octavo.model_executor.models.causal_lm import CausalLM

MODELS = Path(registry.__file__).parent


def all_model_modules() -> list[str]:
    return sorted(path.stem for path in MODELS.glob("*.py") if path.stem != "__init__")


@pytest.mark.parametrize("module", sorted(registry.MANIFEST))
def test_manifest_lists_what_the_module_classes_declare(module: str) -> None:
    classes = registry.module_classes(module)
    declared = [name for cls in classes for name in registry.declared_architectures(cls)]
    assert sorted(declared) == sorted(registry.MANIFEST[module])
    assert len(set(declared)) == len(declared)


def test_no_module_outside_the_manifest_declares_an_architecture() -> None:
    unlisted = [m for m in all_model_modules() if m not in registry.MANIFEST]
    stray = {module: registry.module_classes(module) for module in unlisted}
    assert not any(stray.values()), f"add these modules to registry.MANIFEST: {stray}"


@pytest.mark.parametrize("architecture", registry.supported_architectures())
def test_each_architecture_resolves_to_a_class_that_declares_it(architecture: str) -> None:
    cls = registry.model_class(architecture)
    assert issubclass(cls, CausalLM)
    assert architecture in registry.declared_architectures(cls)
    assert registry.takes_images(architecture) == hasattr(cls, "embed_images")
    if registry.is_pooling_architecture(architecture):
        assert cls.architectures, "a pooling alias is served by a causal LM class"


def test_unknown_architecture_is_one_line_naming_the_supported_ones() -> None:
    with pytest.raises(ValueError, match=r"unsupported architecture 'NoSuchForCausalLM'.*Llama"):
        registry.model_class("NoSuchForCausalLM")


def test_resolving_one_architecture_imports_only_its_module() -> None:
    code = (
        "import sys\n"
        "from octavo.model_executor.models.registry import model_class, PACKAGE\n"
        "model_class('Qwen3ForCausalLM')\n"
        "print(sorted(m.rpartition('.')[2] for m in sys.modules"
        " if m.startswith(PACKAGE + '.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    shared = {"registry", "causal_lm", "decoder", "layer_spec", "sequence_classification"}
    loaded = set(eval(out)) - shared
    assert loaded == {"qwen3"}


def test_gguf_manifest_lists_the_classes_that_declare_each_gguf_architecture() -> None:
    declared = {}
    for module in registry.MANIFEST:
        for cls in registry.module_classes(module):
            layout = vars(cls).get("gguf_layout")
            if layout is not None:
                declared.setdefault(layout.arch, set()).update(cls.architectures)
    assert declared == {arch: set(names) for arch, names in registry.GGUF_MANIFEST.items()}


def test_a_gguf_llama_with_experts_is_read_by_mixtral() -> None:
    assert registry.gguf_class("llama").__name__ == "LlamaForCausalLM"
    assert registry.gguf_class("llama", with_experts=True).__name__ == "MixtralForCausalLM"
    assert registry.gguf_class("qwen3", with_experts=True) is None
    assert registry.gguf_class("qwen2moe") is None
