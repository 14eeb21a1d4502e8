"""Random-weight encoder folders for the embedding and rerank benchmarks, written offline.

Two real shapes, no download: ``bert-small`` is bge-small-en-v1.5's BERT (hidden 384,
12 layers, 12 heads, 1,536 wide MLP, 30,522-token WordPiece vocabulary) as a
sentence-transformers folder (CLS pooling, then Normalize, as bge does);
``cross-encoder-minilm`` is ms-marco-MiniLM-L-6-v2's (the same widths, 6 layers) as a
``BertForSequenceClassification`` with one label (a relevance logit). The WordPiece
vocabulary is generated: the special tokens at BERT's ids, the benchmark texts' words,
single characters and their ``##`` continuations, then made-up pieces up to 30,522, so
texts tokenise into about as many tokens as English does with the real vocabulary.
"""

from __future__ import annotations

import itertools
import json
import string
from collections.abc import Iterator
from pathlib import Path

import torch

BERT_SMALL_SHAPE = {  # bge-small-en-v1.5 / all-MiniLM-L12-v2
    "hidden_size": 384,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}
CROSS_ENCODER_MINILM_SHAPE = {**BERT_SMALL_SHAPE, "num_hidden_layers": 6, "num_labels": 1}
ENCODER_PRESETS: dict[str, dict] = {
    "bert-small": BERT_SMALL_SHAPE,
    "cross-encoder-minilm": CROSS_ENCODER_MINILM_SHAPE,
}
CROSS_ENCODERS = {"cross-encoder-minilm"}
SPECIALS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
EXTRA_WORDS = ["cpus", "instruct", "given", "a", "web", "search", "query", "retrieve"]


def wordpiece_vocab(size: int) -> dict[str, int]:
    """``size`` WordPiece tokens: BERT's special ids, [unusedN] fillers below 999, the
    benchmark words, characters and ``##`` characters, then generated pieces."""
    tokens = [f"[unused{i}]" for i in range(size)]  # placeholders, overwritten below
    for name, index in SPECIALS.items():
        tokens[index] = name
    pieces = iter(dict.fromkeys(candidate_pieces()))  # each once, in order
    for index in range(999, size):
        tokens[index] = next(pieces)
    return {token: index for index, token in enumerate(tokens)}


def candidate_pieces() -> Iterator[str]:
    """Words and pieces in the order the vocabulary takes them (with repeats)."""
    from octavo_bench.embeddings import WORDS  # the benchmark texts' words

    letters = string.ascii_lowercase + string.digits
    yield from [*letters, *string.punctuation, *WORDS, *EXTRA_WORDS]
    yield from ("##" + c for c in letters)
    for length in (2, 3):
        for piece in itertools.product(string.ascii_lowercase, repeat=length):
            yield "".join(piece)
            yield "##" + "".join(piece)


def build_encoder(preset: str, target: Path, shape: dict | None = None) -> Path:
    """``target`` with a random ``preset`` encoder and its tokenizer (kept if it already
    holds one); ``shape`` overrides the preset's (the tests' tiny models)."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizerFast

    if (target / "config.json").is_file():
        return target
    config = BertConfig(**(shape or ENCODER_PRESETS[preset]))
    torch.manual_seed(0)
    architecture = BertForSequenceClassification if preset in CROSS_ENCODERS else BertModel
    model = architecture(config)
    model.eval().save_pretrained(target)
    tokenizer = BertTokenizerFast(vocab=wordpiece_vocab(config.vocab_size), do_lower_case=True)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(target)
    if preset not in CROSS_ENCODERS:
        write_cls_pooling_modules(target, config.hidden_size, config.max_position_embeddings)
    return target


def write_cls_pooling_modules(folder: Path, hidden: int, max_length: int) -> None:
    """sentence-transformers' modules: Transformer, then CLS pooling, then Normalize."""
    kind = "sentence_transformers.models."
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": kind + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": kind + "Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": kind + "Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    settings = {"max_seq_length": max_length, "do_lower_case": False}
    (folder / "sentence_bert_config.json").write_text(json.dumps(settings, indent=2))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "2_Normalize").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": hidden, "pooling_mode_cls_token": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
