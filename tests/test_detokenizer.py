"""IncrementalDetokenizer with tiny in-memory tokenizers (no downloads)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.sampling_params import RequestOutputKind, SamplingParams

CORPUS = ["héllo wörld 日本語 🙂🙂 emoji", "hello world, stop here", "the end of the text"]


@pytest.fixture(scope="module")
def byte_bpe() -> PreTrainedTokenizerFast:
    """A GPT-2 style byte-level BPE: unseen characters fall apart into byte tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 3, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>")


@pytest.fixture(scope="module")
def sentencepiece_like() -> PreTrainedTokenizerFast:
    """A Llama-style tokenizer: "▁" marks spaces, unknown characters use byte fallback."""
    pieces = [("<unk>", 0.0), ("</s>", 0.0)] + [(f"<0x{b:02X}>", -10.0) for b in range(256)]
    words = ["▁hello", "▁world", "▁this", "▁is", "▁", *"helowrdtis"]
    pieces += [(word, -1.0) for word in words]
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", unk_token="<unk>")


def encode(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def stream(
    tokenizer: PreTrainedTokenizerFast,
    token_ids: list[int],
    params: SamplingParams | None = None,
    prompt: list[int] | None = None,
) -> tuple[IncrementalDetokenizer, list[str], str | None]:
    """Feed tokens one by one; return the detokenizer, all deltas and the stop hit."""
    detok = IncrementalDetokenizer(tokenizer, prompt or [], params or SamplingParams())
    deltas, hit = [], None
    for token_id in token_ids:
        hit = detok.update(token_id)
        if hit is not None:
            break
        deltas.append(detok.get_delta(finished=False))
    deltas.append(detok.get_delta(finished=True))
    return detok, deltas, hit


@pytest.mark.parametrize(
    "text",
    [
        "héllo wörld 日本語 🙂🙂 emoji",
        "naïve café: ÆØÅ ✓ €100 — 你好世界 👩‍👩‍👧 done",  # mostly unseen: byte tokens
        "hello world, stop here",
    ],
)
def test_deltas_concatenate_to_full_decode(byte_bpe: PreTrainedTokenizerFast, text: str) -> None:
    ids = encode(byte_bpe, text)
    detok, deltas, hit = stream(byte_bpe, ids)
    assert hit is None
    assert "".join(deltas) == detok.output_text == text
    assert detok.output_text == byte_bpe.decode(ids, clean_up_tokenization_spaces=False)
    assert detok.token_ids == ids
    assert not any("\ufffd" in delta for delta in deltas)


def test_characters_really_are_split_over_tokens(byte_bpe: PreTrainedTokenizerFast) -> None:
    ids = encode(byte_bpe, "€")
    assert len(ids) == 3  # one byte per token
    assert byte_bpe.decode(ids[:1]).endswith("\ufffd")
    detok = IncrementalDetokenizer(byte_bpe, [], SamplingParams())
    detok.update(ids[0])
    detok.update(ids[1])
    assert detok.get_delta(finished=False) == ""
    detok.update(ids[2])
    assert detok.get_delta(finished=False) == "€"


def test_unfinished_character_is_flushed_at_the_end(byte_bpe: PreTrainedTokenizerFast) -> None:
    ids = encode(byte_bpe, "ab€")[:-1]  # ends inside "€"
    detok, deltas, _ = stream(byte_bpe, ids)
    assert "".join(deltas) == detok.output_text == byte_bpe.decode(ids)
    assert detok.output_text.startswith("ab") and detok.output_text.endswith("\ufffd")


def test_prompt_context_is_not_part_of_output(byte_bpe: PreTrainedTokenizerFast) -> None:
    prompt = encode(byte_bpe, "the end of")
    output = encode(byte_bpe, " the text 日本")
    detok, deltas, _ = stream(byte_bpe, output, prompt=prompt)
    assert "".join(deltas) == detok.output_text == " the text 日本"


def test_sentencepiece_keeps_leading_space(sentencepiece_like: PreTrainedTokenizerFast) -> None:
    tokenizer = sentencepiece_like
    prompt = encode(tokenizer, "hello")
    output = encode(tokenizer, "hello world 日本 this")[len(prompt) :]
    detok, deltas, _ = stream(tokenizer, output, prompt=prompt)
    assert "".join(deltas) == detok.output_text == " world 日本 this"
    assert not any("\ufffd" in delta for delta in deltas)


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens(byte_bpe: PreTrainedTokenizerFast, skip: bool) -> None:
    eos = byte_bpe.convert_tokens_to_ids("<eos>")
    ids = [*encode(byte_bpe, "hello"), eos, *encode(byte_bpe, " world")]
    detok, deltas, _ = stream(byte_bpe, ids, SamplingParams(skip_special_tokens=skip))
    expected = "hello world" if skip else "hello<eos> world"
    assert "".join(deltas) == detok.output_text == expected


@pytest.mark.parametrize(
    ("include", "expected"), [(False, "hello world, "), (True, "hello world, stop")]
)
def test_stop_string_truncates_output(
    byte_bpe: PreTrainedTokenizerFast, include: bool, expected: str
) -> None:
    params = SamplingParams(stop=["stop", "xyz"], include_stop_str_in_output=include)
    detok, deltas, hit = stream(byte_bpe, encode(byte_bpe, "hello world, stop here"), params)
    assert hit == "stop"
    assert detok.stop_reason == "stop"
    assert "".join(deltas) == detok.output_text == expected
    with pytest.raises(ValueError, match="stop"):
        detok.update(0)


def test_stop_string_split_over_single_byte_tokens(byte_bpe: PreTrainedTokenizerFast) -> None:
    # Feed one character per token so "stop" appears piece by piece: "s", "st", ...
    text = "see the st, sto, and stop!"
    ids = [token for char in text for token in encode(byte_bpe, char)]
    detok, deltas, hit = stream(byte_bpe, ids, SamplingParams(stop="stop"))
    assert hit == "stop"
    # Deltas cannot be taken back, so equality proves no part of "stop" was streamed.
    assert "".join(deltas) == detok.output_text == "see the st, sto, and "


def test_holdback_never_exposes_a_completed_stop_prefix(
    byte_bpe: PreTrainedTokenizerFast,
) -> None:
    ids = [token for char in "ab stop" for token in encode(byte_bpe, char)]
    detok = IncrementalDetokenizer(byte_bpe, [], SamplingParams(stop=["stop"]))
    emitted = ""
    for token_id in ids:
        if detok.update(token_id) is not None:
            break
        emitted += detok.get_delta(finished=False)
        assert len(detok.output_text) - len(emitted) == min(3, len(detok.output_text))
    emitted += detok.get_delta(finished=True)
    assert emitted == "ab "


def test_earliest_stop_string_wins(byte_bpe: PreTrainedTokenizerFast) -> None:
    params = SamplingParams(stop=["here", "world"])
    detok, _, hit = stream(byte_bpe, encode(byte_bpe, "hello world, stop here"), params)
    assert hit == "world" and detok.output_text == "hello "


def test_stop_strings_ignored_before_min_tokens(byte_bpe: PreTrainedTokenizerFast) -> None:
    ids = [token for char in "ab ab ab" for token in encode(byte_bpe, char)]
    detok, _, hit = stream(byte_bpe, ids, SamplingParams(stop="ab", min_tokens=4))
    assert hit == "ab" and detok.output_text == "ab "


class DecodeOnly:
    """A tokenizer with only ``decode`` (like a slow, pure-Python one): the window fallback."""

    def __init__(self, fast: PreTrainedTokenizerFast) -> None:
        self._fast = fast

    def decode(self, ids: list[int], **kwargs) -> str:
        return self._fast.decode(ids, **kwargs)


@pytest.mark.parametrize(
    "text", ["naïve café: ÆØÅ ✓ €100 — 你好 👩‍👩‍👧 done", "hello world 日本 this"]
)
@pytest.mark.parametrize("fixture", ["byte_bpe", "sentencepiece_like"])
def test_the_stream_decoder_and_the_window_fallback_agree(request, fixture: str, text: str) -> None:
    fast = request.getfixturevalue(fixture)
    prompt, output = encode(fast, "hello"), encode(fast, text)
    fast_detok, fast_deltas, _ = stream(fast, output, prompt=prompt)
    slow_detok, slow_deltas, _ = stream(DecodeOnly(fast), output, prompt=prompt)
    assert fast_detok._stream is not None and slow_detok._stream is None
    assert fast_deltas == slow_deltas and fast_detok.output_text == slow_detok.output_text


FINAL_ONLY = SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY)


@pytest.mark.parametrize("text", ["naïve café: ÆØÅ ✓ €100 — 你好 👩‍👩‍👧 done", "ab€"])
@pytest.mark.parametrize("fixture", ["byte_bpe", "sentencepiece_like"])
def test_a_deferred_completion_catches_up_to_the_streamed_text(
    request, fixture: str, text: str
) -> None:
    """One final output, no stop strings: the ids go through the stream when the output is
    made, in one loop or in two (an abort's output, then the rest), to the same text."""
    tokenizer = request.getfixturevalue(fixture)
    prompt, output = encode(tokenizer, "hello"), encode(tokenizer, text)[:-1]  # ends mid-€
    streamed, _, _ = stream(tokenizer, output, prompt=prompt)
    for cut in (len(output), len(output) // 2):
        deferred = IncrementalDetokenizer(tokenizer, prompt, FINAL_ONLY)
        assert deferred.deferred
        deferred.catch_up(output[:cut])
        deferred.catch_up(output)
        assert deferred.token_ids == output
        assert deferred.get_delta(finished=True) == streamed.output_text
        assert deferred.output_text == streamed.output_text


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(output_kind=RequestOutputKind.DELTA),
        SamplingParams(output_kind=RequestOutputKind.CUMULATIVE),
        SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, stop=["end"]),
    ],
)
def test_streamed_outputs_and_stop_strings_decode_every_step(
    byte_bpe: PreTrainedTokenizerFast, params: SamplingParams
) -> None:
    assert not IncrementalDetokenizer(byte_bpe, [], params).deferred
    assert not IncrementalDetokenizer(DecodeOnly(byte_bpe), [], FINAL_ONLY).deferred
