"""Sentence-transformers folders as the installed sentence-transformers saves them (6.x
names its modules ``sentence_transformers.base.modules.transformer.Transformer``, ...;
older versions ``sentence_transformers.models.Transformer``): Octavo reads either and
embeds as sentence-transformers' own ``encode`` does (fp32, 1e-5)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from octavo.entrypoints.llm import LLM
from octavo.pooling.model_defaults import read_pooler_config
from octavo.pooling.params import PoolingType
from test_embeddings import ENGINE, TEXTS, st_reference

from embedding_models import build_embedding_model

MODES = {"lasttoken": PoolingType.LAST, "mean": PoolingType.MEAN, "cls": PoolingType.CLS}


# sentence-transformers 6 renders plain text through the chat template when the tokenizer
# has one ("message" modality); Octavo, like vLLM, embeds the text as given: text only here.
TEXT_ONLY = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}


def saved_by_sentence_transformers(source: Path, out: Path, mode: str, normalize: bool) -> Path:
    """``source``'s decoder wrapped in Transformer → Pooling (→ Normalize) and written by
    ``SentenceTransformer.save`` (the installed version's layout, nothing hand-written)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    transformer = Transformer(
        str(source), modality_config=TEXT_ONLY, module_output_name="token_embeddings"
    )
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=mode)]
    model = SentenceTransformer(modules=modules + ([Normalize()] if normalize else []))
    model.save(str(out))
    return out


@pytest.fixture(scope="module")
def decoder_folder(tmp_path_factory, smol_tokenizer) -> Path:
    return build_embedding_model(tmp_path_factory.mktemp("emb-src"), smol_tokenizer, "LAST")


@pytest.mark.parametrize(
    ("mode", "normalize"), [("lasttoken", True), ("mean", False), ("cls", True)]
)
def test_the_installed_versions_folder_gives_its_pooling_defaults(
    decoder_folder, tmp_path, mode, normalize
):
    folder = saved_by_sentence_transformers(decoder_folder, tmp_path / "st", mode, normalize)
    kinds = [module["type"] for module in json.loads((folder / "modules.json").read_text())]
    assert not any(kind.startswith("sentence_transformers.models.") for kind in kinds), kinds
    config = read_pooler_config(folder, hidden_size=64)
    assert (config.pooling_type, config.normalize) == (MODES[mode], normalize)


def test_the_installed_versions_folder_embeds_as_it_encodes(decoder_folder, tmp_path):
    folder = saved_by_sentence_transformers(decoder_folder, tmp_path / "st", "lasttoken", True)
    with LLM(str(folder), **ENGINE) as llm:
        assert llm.engine.parts.runner.kind == "pooling"
        got = np.array([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
    np.testing.assert_allclose(got, st_reference(folder, TEXTS), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "kinds",
    [
        ("sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling"),
        (
            "sentence_transformers.base.modules.transformer.Transformer",
            "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
            "sentence_transformers.base.modules.normalize.Normalize",
        ),
    ],
)
def test_old_and_new_module_paths_read_alike(tmp_path, kinds):
    write_modules(tmp_path, kinds, {"pooling_mode": ["cls"]})
    config = read_pooler_config(tmp_path, hidden_size=8)
    assert config.pooling_type == PoolingType.CLS
    assert config.normalize == kinds[-1].endswith("Normalize")


@pytest.mark.parametrize(
    ("kinds", "pooling", "message"),
    [
        (("my_package.Transformer",), {}, "'my_package.Transformer' is not supported"),
        (
            ("sentence_transformers.models.LayerNorm",),
            {},
            "'LayerNorm' is not supported",
        ),
        (
            ("sentence_transformers.sentence_transformer.modules.pooling.Pooling",),
            {"pooling_mode": "max"},
            "pooling_mode 'max'",
        ),
    ],
)
def test_what_octavo_does_not_run_is_named(tmp_path, kinds, pooling, message):
    write_modules(tmp_path, kinds, pooling)
    with pytest.raises(ValueError, match=message):
        read_pooler_config(tmp_path, hidden_size=8)


def write_modules(folder: Path, kinds: tuple[str, ...], pooling: dict) -> None:
    modules = [
        {"idx": i, "name": str(i), "path": "1_Pooling" if "Pooling" in kind else "", "type": kind}
        for i, kind in enumerate(kinds)
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (folder / "config.json").write_text(json.dumps({"hidden_size": 8}))


def test_a_chat_rendering_folder_is_warned_about(tmp_path, caplog):
    """sentence-transformers 6 renders text through the chat template for such a folder;
    Octavo does not (as vLLM), and says so."""
    write_modules(tmp_path, ("sentence_transformers.models.Pooling",), {"pooling_mode": "mean"})
    settings = {"modality_config": {"text": {}, "message": {"format": "flat"}}}
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps(settings))
    with caplog.at_level("WARNING", logger="octavo.pooling.model_defaults"):
        read_pooler_config(tmp_path, hidden_size=8)
    assert "chat template" in caplog.text
