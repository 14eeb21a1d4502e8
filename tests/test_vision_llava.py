"""LLaVA-1.5 (images in, text out) on a tiny random checkpoint, against HF ``generate``.

The folder is written here: a tiny CLIP vision tower + projector + Llama text model, the
HF processor (CLIP image processor and the tests' tokenizer with an ``<image>`` token).
Greedy fp32 outputs must be token-identical to transformers on the processor's inputs:
one image, two images, text only; also with chunked prefill splitting the placeholder
range, preemption and recompute, and through ``LLM.chat``'s image_url parts. Prefix-cache
blocks are shared by the same image only.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from PIL import Image

from octavo.entrypoints.llm import LLM
from vision_testing import (
    BLOCK_BYTES,
    GREEDY,
    NEW_TOKENS,
    SMALL_KV,
    as_prompt,
    check_chunked_prefill_and_preemption,
    check_greedy_matches_hf,
    check_prefix_sharing,
    data_url,
    hf_greedy,
    image_start,
    random_image,
    randomize,
    tiny_llm,
    tiny_text,
    tiny_vision,
    token_ids,
)

IMAGE_SIZE, PATCH = 28, 7  # 16 patches: 16 placeholder tokens per image

IMAGES = [random_image(1, 40, 30), random_image(2, 28, 28), random_image(3, 33, 50)]
CASES = [  # (prompt, images)
    ("<image>\nWhat is in this picture?", [IMAGES[0]]),
    ("Compare <image> with <image> please", [IMAGES[0], IMAGES[1]]),
    ("Hello there, how are you", []),
]


def build_llava(folder: Path, smol_folder: Path) -> Path:
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = AutoTokenizer.from_pretrained(smol_folder)
    tokenizer.add_tokens(["<image>"], special_tokens=True)
    vision = CLIPVisionConfig(**tiny_vision(image_size=IMAGE_SIZE, patch_size=PATCH))
    text = LlamaConfig(**tiny_text(tokenizer))
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(1234)
    model = LlavaForConditionalGeneration(config).eval()
    randomize(model)
    model.save_pretrained(folder)
    crop = {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    image_processor = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE}, crop_size=crop)
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # the class token the tower adds (and LLaVA drops)
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llava_folder(tmp_path_factory, smol_folder) -> Path:
    return build_llava(tmp_path_factory.mktemp("llava"), smol_folder)


@pytest.fixture(scope="module")
def hf_reference(llava_folder):
    from transformers import LlavaForConditionalGeneration

    return hf_greedy(llava_folder, LlavaForConditionalGeneration)


@pytest.fixture(scope="module")
def llava(llava_folder):
    with tiny_llm(llava_folder, limit_mm_per_prompt='{"image": 2}') as llm:  # vLLM's JSON form
        yield llm


def test_greedy_matches_hf_with_one_two_and_no_images(llava, hf_reference):
    check_greedy_matches_hf(llava, hf_reference, CASES, IMAGES[2])


def test_chunked_prefill_inside_placeholders_and_preemption_match_hf(llava_folder, hf_reference):
    cases = [*CASES, (CASES[0][0], [IMAGES[2]]), (CASES[1][0], [IMAGES[2], IMAGES[0]])]
    check_chunked_prefill_and_preemption(
        llava_folder,
        hf_reference,
        cases,
        max_model_len=128,
        max_num_batched_tokens=8,  # every image's 16 placeholders span chunks
        kv_cache_memory=9 * BLOCK_BYTES,
    )


def test_prefix_blocks_are_shared_by_the_same_image_only(llava, hf_reference):
    text = "Look at this: <image>\nDescribe the colours you see in it"  # block 0 ends mid-image
    # the rest of the image comes from the encoder cache
    first = check_prefix_sharing(llava, hf_reference, text, IMAGES[:2], min_cached=16)
    start = image_start(llava, first)
    assert 0 < start < 16 < start + 16  # the first block ends inside the placeholders


def test_chat_image_url_parts_match_hf(llava, hf_reference):
    content = [
        {"type": "image_url", "image_url": {"url": data_url(IMAGES[0])}},
        {"type": "text", "text": "What is in this picture?"},
    ]
    outputs = llava.chat([{"role": "user", "content": content}], GREEDY, use_tqdm=False)
    rendered = llava.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": "<image>\nWhat is in this picture?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert token_ids(outputs) == [hf_reference(rendered, [IMAGES[0]], add_special_tokens=False)]


def test_bad_image_inputs_are_value_errors(llava):
    three = as_prompt("<image> <image> <image>", IMAGES)
    with pytest.raises(ValueError, match="3 images, more than the 2 allowed"):
        llava.generate(three, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="could not be decoded"):
        llava.generate(as_prompt(CASES[0][0], [b"not an image"]), GREEDY, use_tqdm=False)
    bad_url = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    with pytest.raises(ValueError, match="could not be decoded"):
        llava.chat([{"role": "user", "content": bad_url}], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="2 images"):
        llava.generate(as_prompt(CASES[0][0], IMAGES[:2]), GREEDY, use_tqdm=False)
    assert not llava.engine.has_unfinished_requests()


def test_decompression_bomb_is_refused_before_decoding():
    from octavo.multimodal.images import load_image

    buffer = io.BytesIO()
    Image.new("L", (4000, 4000)).save(buffer, format="PNG")  # small file, 16 M pixels
    with pytest.raises(ValueError, match="4000x4000 pixels, more than the 1000000 allowed"):
        load_image(buffer.getvalue(), max_pixels=1_000_000)


def test_a_text_only_model_refuses_images(tiny_folder):
    with LLM(
        str(tiny_folder("llama3")), dtype="float32", max_model_len=128, kv_cache_memory=8 << 20
    ) as llm:
        with pytest.raises(ValueError, match="text-only"):
            llm.generate(as_prompt("Hi", [IMAGES[0]]), GREEDY, use_tqdm=False)
        content = [{"type": "image_url", "image_url": {"url": data_url(IMAGES[0])}}]
        with pytest.raises(ValueError, match="text-only"):
            llm.chat([{"role": "user", "content": content}], GREEDY, use_tqdm=False)


def test_block_hashes_name_the_images_their_placeholders_overlap():
    from octavo.kv_cache.block_hash import BlockKeys

    keys = BlockKeys(image_spans=((3, 19, "a"), (19, 35, "b")))
    assert keys.extra_keys(0, 16) == (("image", "a"),)
    assert keys.extra_keys(1, 16) == (("image", "a"), ("image", "b"))
    assert keys.extra_keys(2, 16) == (("image", "b"),)
    assert keys.extra_keys(3, 16) is None


def test_placeholder_runs_and_limits():
    from octavo.multimodal.inputs import placeholder_runs
    from octavo.multimodal.limits import parse_limit_mm_per_prompt

    assert placeholder_runs([1, 9, 9, 2, 9, 3], 9) == [(1, 2), (4, 1)]
    assert parse_limit_mm_per_prompt('{"image": 3}') == {"image": 3}
    with pytest.raises(ValueError, match="unknown modality 'video'"):
        parse_limit_mm_per_prompt('{"video": 1}')
    with pytest.raises(ValueError, match="count >= 0"):
        parse_limit_mm_per_prompt({"image": -1})


def test_only_base64_data_urls_are_read():
    from octavo.multimodal.images import load_image

    with pytest.raises(ValueError, match="only data: URLs are accepted here, got https"):
        load_image("https://example.com/cat.png")
    with pytest.raises(ValueError, match="must be base64"):
        load_image("data:image/png,abc")
    with pytest.raises(ValueError, match="not valid base64"):
        load_image("data:image/png;base64,@@@")
    assert load_image(data_url(IMAGES[1])).size == (28, 28)


def test_placeholders_past_max_model_len_are_refused(llava):
    many = "<image> <image> " + "word " * 240
    with pytest.raises(ValueError, match="max_model_len is 256"):
        llava.generate(as_prompt(many, IMAGES[:2]), GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="holds the image placeholder <image> but no image"):
        llava.generate("<image> alone", GREEDY, use_tqdm=False)
    assert not llava.engine.has_unfinished_requests()


@pytest.fixture(scope="module")
def llava_url(llava_folder):
    from octavo.entrypoints.openai.context import ServerConfig

    from server_harness import ThreadedServer, build_local_app, torch_threads

    config = ServerConfig(served_model_names=["llava"], model_root="llava")
    engine = {
        "dtype": "float32",
        "max_model_len": 256,
        "limit_mm_per_prompt": {"image": 2},
        "kv_cache_memory": SMALL_KV,
    }
    app = build_local_app(str(llava_folder), config, None, **engine)
    with torch_threads(1), ThreadedServer(app) as server:
        yield server.wait_ready().url


def image_message(*urls: str, text: str = "What is in this picture?") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def post_chat(url: str, messages: list[dict], model: str = "llava"):
    import httpx

    body = {"model": model, "messages": messages, "max_tokens": NEW_TOKENS, "temperature": 0}
    return httpx.post(f"{url}/v1/chat/completions", json={**body, "ignore_eos": True}, timeout=120)


def test_server_chat_with_an_image_answers_as_the_offline_api(llava_url, llava):
    messages = image_message(data_url(IMAGES[0]))
    response = post_chat(llava_url, messages)
    assert response.status_code == 200, response.text
    expected = llava.chat(messages, GREEDY, use_tqdm=False)[0]
    assert response.json()["choices"][0]["message"]["content"] == expected.outputs[0].text
    assert response.json()["usage"]["prompt_tokens"] == len(expected.prompt_token_ids)


@pytest.mark.parametrize(
    ("urls", "match"),
    [
        (["data:image/png;base64,AAAA"], "could not be decoded"),
        ([data_url(IMAGES[0])] * 3, "3 images, more than the 2 allowed"),
        (["https://example.com/cat.png"], "only data: URLs"),
    ],
)
def test_server_bad_images_are_400s(llava_url, urls, match):
    response = post_chat(llava_url, image_message(*urls))
    assert response.status_code == 400, response.text
    assert match in response.json()["error"]["message"]


def test_server_text_only_model_refuses_images_with_400(tiny_folder):
    from conftest import tiny_server

    with tiny_server(tiny_folder, "tiny") as server:
        response = post_chat(server.url, image_message(data_url(IMAGES[0])), model="tiny")
    assert response.status_code == 400, response.text
    assert "text-only" in response.json()["error"]["message"]


def test_the_openai_client_sends_base64_images_whole_and_streamed(llava_url, llava):
    """The `openai` package as a user runs it: an image_url part holding a base64 PNG."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{llava_url}/v1", api_key="unused", max_retries=0)
    messages = image_message(data_url(IMAGES[1]), text="Describe it")
    expected = llava.chat(messages, GREEDY, use_tqdm=False)[0].outputs[0].text
    settings = {"model": "llava", "messages": messages, "max_tokens": NEW_TOKENS}
    settings |= {"temperature": 0, "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(**settings)
    assert whole.choices[0].message.content == expected
    stream = client.chat.completions.create(**settings, stream=True)
    parts = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert "".join(parts) == expected and len(parts) > 1
