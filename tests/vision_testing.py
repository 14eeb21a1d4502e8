"""What the vision tests share: tiny configs, random images and weights, the module's
engine with a small KV pool, HF's cached greedy reference, and the chunked-prefill and
prefix-sharing checks every image model runs against it."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from octavo import SamplingParams
from octavo.entrypoints.llm import LLM

NEW_TOKENS = 12
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
# K+V, 16-token blocks, 2 KV heads of 16, fp32, 2 layers
BLOCK_BYTES = 2 * 16 * 2 * 16 * 4 * 2
SMALL_KV = 64 * BLOCK_BYTES  # 1024 tokens (not the CPU default of 2 GiB per engine)

Case = tuple[str, list]  # (prompt, images)
Reference = Callable[..., list[int]]


def random_image(seed: int, width: int, height: int) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(height, width, 3, generator=generator) * 255).to(torch.uint8)
    return Image.fromarray(pixels.numpy())


def data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def tiny_vision(**extra: Any) -> dict[str, Any]:
    """A two-layer tower of width 32 (the keywords of any ViT-style vision config)."""
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
    return {**sizes, "num_attention_heads": 4, **extra}


def tiny_text(tokenizer, **extra: Any) -> dict[str, Any]:
    """A two-layer decoder of width 64 (4 query heads, 2 KV heads) on ``tokenizer``."""
    sizes = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2}
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    vocab = {"vocab_size": len(tokenizer), "max_position_embeddings": 512}
    return {**sizes, **heads, **vocab, **ids, **extra}


def randomize(model: torch.nn.Module) -> None:
    """Larger weights than the init's: sharper, tie-free argmaxes."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)


def greedy_reference(processor, model) -> Reference:
    """Greedy token ids transformers generates for (prompt, images, processor keywords),
    each computed once."""
    done: dict[tuple, list[int]] = {}

    def generate(prompt: str, images: list, **kwargs: Any) -> list[int]:
        inputs = processor(text=[prompt], images=images or None, return_tensors="pt", **kwargs)
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=model.generation_config.eos_token_id,
            )
        return out[0, inputs["input_ids"].shape[1] :].tolist()

    def cached(prompt: str, images: list, **kwargs: Any) -> list[int]:
        key = (prompt, tuple(map(id, images)), tuple(sorted(kwargs.items())))
        if key not in done:
            done[key] = generate(prompt, images, **kwargs)
        return done[key]

    return cached


def hf_greedy(folder: Path, model_class) -> Reference:
    """``greedy_reference`` of the folder's processor and fp32 ``model_class``."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    model = model_class.from_pretrained(folder, dtype=torch.float32).eval()
    return greedy_reference(processor, model)


@contextmanager
def tiny_llm(folder: Path, **engine: Any) -> Iterator[LLM]:
    """An fp32 engine on ``folder`` with a small KV pool (256 tokens a sequence unless
    ``engine`` says otherwise)."""
    options = {"max_model_len": 256, "kv_cache_memory": SMALL_KV, **engine}
    with LLM(str(folder), dtype="float32", **options) as llm:
        yield llm


def as_prompt(text: str, images: list) -> str | dict:
    return {"prompt": text, "multi_modal_data": {"image": images}} if images else text


def token_ids(outputs) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in outputs]


def check_greedy_matches_hf(llm: LLM, hf_reference: Reference, cases: list[Case], other_image):
    """``cases`` token-identical to HF, and ``cases[0]``'s text with ``other_image``
    answered otherwise (the image, not only the text, decides). Returns the outputs."""
    expected = [hf_reference(text, images) for text, images in cases]
    outputs = llm.generate([as_prompt(*case) for case in cases], GREEDY, use_tqdm=False)
    assert token_ids(outputs) == expected
    other = llm.generate(as_prompt(cases[0][0], [other_image]), GREEDY, use_tqdm=False)
    assert token_ids(other) != expected[:1]  # the image, not only the text, decides
    return outputs


def check_chunked_prefill_and_preemption(
    folder: Path,
    hf_reference: Reference,
    cases: list[Case],
    cache_hits: bool = True,
    **engine: Any,
) -> None:
    """``cases`` on an engine whose small steps and KV pool (``engine``) cut images over
    chunks and preempt: token-identical to HF, preempted, and (``cache_hits``) later
    chunks and recomputes take the encoder's cached features."""
    expected = [hf_reference(text, images) for text, images in cases]
    with tiny_llm(folder, **engine) as llm:
        outputs = llm.generate([as_prompt(*case) for case in cases], GREEDY, use_tqdm=False)
        assert token_ids(outputs) == expected
        assert llm.engine.stats().num_preemptions > 0
        if cache_hits:
            cache = llm.engine.executor.worker.runner.encoder_cache
            assert cache.hits > 0  # later chunks (and recomputes) took the features cached


def check_prefix_sharing(
    llm: LLM, hf_reference: Reference, text: str, images: list, min_cached: int
):
    """``text`` with ``images[0]``, then ``images[1]`` (nothing cached), then a copy of
    ``images[0]`` (at least ``min_cached`` tokens cached): the same tokens, HF's. Returns
    the first output (for the test's own checks of where its image lies)."""
    image, other_image = images
    first = llm.generate(as_prompt(text, [image]), GREEDY, use_tqdm=False)[0]
    other = llm.generate(as_prompt(text, [other_image]), GREEDY, use_tqdm=False)[0]
    same = llm.generate(as_prompt(text, [image.copy()]), GREEDY, use_tqdm=False)[0]
    assert other.num_cached_tokens == 0
    assert same.num_cached_tokens >= min_cached
    assert same.outputs[0].token_ids == first.outputs[0].token_ids
    assert first.outputs[0].token_ids == hf_reference(text, [image])
    return first


def image_start(llm: LLM, output) -> int:
    """Where the prompt's first image placeholder is."""
    return output.prompt_token_ids.index(llm.engine.mm_processor.image_token_id)
