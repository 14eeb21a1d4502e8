"""Tiny random-weight encoder checkpoints (BERT, RoBERTa, cross-encoders, sentence-transformers
bi-encoders) built in the test, no downloads. Each folder has a real fast tokenizer built from a
made-up word vocabulary (``w0 w1 ...``), so routes that take text work on them.

Weights are drawn with a larger spread than HF's default (``initializer_range=0.2``) so scores,
logits and rankings differ clearly between inputs."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

SPECIAL_BERT = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# RoBERTa's ids: <s>=0, <pad>=1, </s>=2; its position ids count from pad_token_id + 1.
SPECIAL_ROBERTA = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "initializer_range": 0.2,
}


def words(count: int) -> list[str]:
    """Plain words of the made-up vocabulary, ``w0 .. w{count-1}``."""
    return [f"w{index}" for index in range(count)]


def bert_tokenizer(vocab_size: int = 300):
    """A BERT WordPiece tokenizer over ``[PAD] [UNK] [CLS] [SEP] [MASK] w0 w1 ...``."""
    from transformers import BertTokenizerFast

    vocab = SPECIAL_BERT + words(vocab_size - len(SPECIAL_BERT))
    return BertTokenizerFast(vocab={word: index for index, word in enumerate(vocab)})


def roberta_tokenizer(vocab_size: int = 300):
    """The same word-level tokenizer with RoBERTa's special tokens and ids (<s>=0, <pad>=1)."""
    from transformers import BertTokenizerFast

    vocab = SPECIAL_ROBERTA + words(vocab_size - len(SPECIAL_ROBERTA))
    roles = ("cls_token", "pad_token", "sep_token", "unk_token", "mask_token")
    names = dict(zip(roles, SPECIAL_ROBERTA, strict=True))
    return BertTokenizerFast(vocab={word: index for index, word in enumerate(vocab)}, **names)


def _save(model, tokenizer, folder: Path) -> Path:
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _labels(num_labels: int) -> dict:
    id2label = {index: f"label_{index}" for index in range(num_labels)}
    return {"num_labels": num_labels, "id2label": id2label}


def build_bert(folder: Path, kind: str = "model", num_labels: int = 3, **config) -> Path:
    """A random BERT folder. ``kind``: "model" (BertModel), "classifier"
    (BertForSequenceClassification with ``num_labels`` labels named ``label_<i>``) or
    "cross_encoder" (the same head with one label, as ms-marco / bge rerankers ship).
    ``config`` overrides BertConfig fields."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    tokenizer = bert_tokenizer(config.pop("vocab_size", 300))
    settings = {**TINY, "vocab_size": len(tokenizer), "max_position_embeddings": 128}
    settings["type_vocab_size"] = 2
    if kind == "cross_encoder":
        settings.update(_labels(1))
    elif kind == "classifier":
        settings.update(_labels(num_labels))
    elif kind != "model":
        raise ValueError(f"kind must be model, classifier or cross_encoder, not {kind!r}")
    cfg = BertConfig(**{**settings, **config})
    torch.manual_seed(1234)
    model = BertModel(cfg) if kind == "model" else BertForSequenceClassification(cfg)
    return _save(model.eval(), tokenizer, folder)


def build_roberta(folder: Path, classifier: bool = False, **config) -> Path:
    """A random RoBERTa folder (RobertaModel, or RobertaForSequenceClassification when
    ``classifier``; pass ``num_labels`` / ``id2label`` in ``config``). Positions are offset by
    ``pad_token_id + 1`` as in RoBERTa, so max_position_embeddings is 130 for 128 tokens."""
    from transformers import RobertaConfig, RobertaForSequenceClassification, RobertaModel

    tokenizer = roberta_tokenizer(config.pop("vocab_size", 300))
    settings = {**TINY, "vocab_size": len(tokenizer), "max_position_embeddings": 130}
    settings.update({"type_vocab_size": 1, "pad_token_id": 1, "bos_token_id": 0})
    settings["eos_token_id"] = 2
    if classifier and "num_labels" not in config:
        settings.update(_labels(1))
    cfg = RobertaConfig(**{**settings, **config})
    torch.manual_seed(1234)
    model = RobertaForSequenceClassification(cfg) if classifier else RobertaModel(cfg)
    return _save(model.eval(), tokenizer, folder)


def build_st_bert(folder: Path, pooling: str = "CLS", normalize: bool = True, **config) -> Path:
    """A sentence-transformers bi-encoder around a random BertModel (Transformer → Pooling
    (``pooling`` "CLS" or "MEAN") → Normalize when ``normalize``), written by
    sentence-transformers' own ``save`` so the layout is what the installed version writes."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    scratch = Path(tempfile.mkdtemp(prefix="st-bert-"))
    try:
        build_bert(scratch, kind="model", **config)
        transformer = Transformer(str(scratch))
        width = config.get("hidden_size", TINY["hidden_size"])
        modules = [transformer, Pooling(width, pooling_mode=pooling.lower())]
        if normalize:
            modules.append(Normalize())
        SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Path(folder)
