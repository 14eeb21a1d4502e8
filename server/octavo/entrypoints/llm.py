"""The offline API: ``LLM(model=None, **engine_args).generate(prompts, params)``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

from tqdm import tqdm

from octavo.config import EngineArgs
from octavo.engine.batch_defaults import default_token_budget
from octavo.engine.device import select_device
from octavo.engine.llm_engine import LLMEngine
from octavo.inputs.chat import (
    ChatOptions,
    ChatPrompt,
    Message,
    load_chat_template,
    render_chat_prompt,
)
from octavo.inputs.chat_images import split_images
from octavo.inputs.data import EnginePrompt, MultiModalPrompt, PromptType, parse_prompts
from octavo.lora_request import LoRARequest
from octavo.model_executor.model_config import generation_defaults
from octavo.model_executor.model_folders import sampling_defaults
from octavo.multimodal.processor import ProcessedPrompt
from octavo.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from octavo.pooling.params import PoolingParams
from octavo.pooling.scoring import (
    as_texts,
    check_pair_counts,
    class_probabilities,
    plan_scores,
    truncation_limit,
)
from octavo.sampling_params import RequestOutputKind, SamplingParams


class LLM:
    """Generate offline with Octavo's engine. ``model=None`` serves the embedded SmolLM2."""

    def __init__(self, model: str | None = None, **engine_args) -> None:
        chunked = engine_args.get("enable_chunked_prefill", True)  # else: whole prompts
        if chunked and engine_args.get("max_num_batched_tokens") is None:
            # No stream waits for a step offline: bigger default steps (``batch_defaults``)
            device = select_device(engine_args.get("device", EngineArgs.device))
            mode = engine_args.get("performance_mode", EngineArgs.performance_mode)
            engine_args["max_num_batched_tokens"] = default_token_budget(device, True, mode)
        engine_args.setdefault("disable_log_stats", True)  # as vLLM's LLM: no stats lines
        self.engine = LLMEngine(EngineArgs.from_kwargs(model, engine_args))
        self._ids = itertools.count()
        self._defaults = _generation_defaults(self.engine)

    def get_default_sampling_params(self) -> SamplingParams:
        """``SamplingParams()`` with the model's generation_config.json defaults (per
        ``generation_config``), used when ``generate`` is given no sampling params."""
        return SamplingParams(**self._defaults)

    def get_tokenizer(self):
        return self.engine.tokenizer

    def shutdown(self) -> None:
        """Stop the engine's worker processes (with tensor/pipeline parallelism). They also
        stop when this object is collected or the program exits."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """``prompts``: one prompt or a list (texts, token-id lists, ``TextPrompt`` or
        ``TokensPrompt`` dicts, which may carry ``multi_modal_data``: ``{"image": image |
        [images]}``, PIL images, bytes or data: URLs); ``lora_request``: one adapter for
        every prompt, or one (or None) per prompt. Every image is decoded and processed
        before any prompt runs (a bad one is a ValueError)."""
        prompt_list = [self._engine_prompt(prompt) for prompt in parse_prompts(prompts)]
        return self._generate(prompt_list, sampling_params, use_tqdm, lora_request)

    def _engine_prompt(self, prompt: EnginePrompt) -> str | list[int] | ProcessedPrompt:
        if isinstance(prompt, MultiModalPrompt):
            return self.engine.process_multimodal(prompt.prompt, prompt.multi_modal_data)
        return prompt

    def _generate(
        self,
        prompt_list: list[str | list[int] | ProcessedPrompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None,
    ) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params_list = _as_params_list(sampling_params, len(prompt_list))
        adapters = _as_adapter_list(lora_request, len(prompt_list))
        for params in params_list:
            params.check_max_logprobs(self.engine.args.max_logprobs)
            self.engine.check_constraint(params)  # a bad schema fails before anything runs
        final = [replace(p, output_kind=RequestOutputKind.FINAL_ONLY) for p in params_list]
        return self._run_requests(prompt_list, final, adapters, use_tqdm, "generating")

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (``outputs.embedding``), pooled as ``pooling_params``
        say (default: the model's sentence-transformers settings, else its last token,
        normalised). Prompts are batched and share the prefix cache as in ``generate``."""
        prompt_list = [self._engine_prompt(prompt) for prompt in parse_prompts(prompts)]
        params = [self.engine.parts.runner.check_params(pooling_params or PoolingParams())] * len(
            prompt_list
        )
        adapters = _as_adapter_list(lora_request, len(prompt_list))
        outputs = self._run_requests(prompt_list, params, adapters, use_tqdm, "embedding")
        return [EmbeddingRequestOutput.of(output) for output in outputs]

    def score(
        self,
        data_1: str | Sequence[str],
        data_2: str | Sequence[str],
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
    ) -> list[ScoringRequestOutput]:
        """One score per pair (``outputs.score``): ``data_1`` one text (paired with every
        ``data_2``) or as many as ``data_2``. A cross-encoder scores each pair (sigmoid of
        its logit), an embedding model the cosine of the two texts' embeddings.
        ``truncate_prompt_tokens`` (-1: the context) shortens long prompts, else they are a
        ValueError."""
        runner = self.engine.parts.runner
        runner.check_task("score")
        firsts, seconds = as_texts(data_1, "data_1"), as_texts(data_2, "data_2")
        check_pair_counts(firsts, seconds, ("data_1", "data_2"))
        max_len = self.engine.parts.max_model_len
        limit = truncation_limit(truncate_prompt_tokens, max_len)
        cross = runner.pooler.classifies
        plan = plan_scores(self.get_tokenizer(), firsts, seconds, cross, limit, max_len)
        outputs = self._pool(
            [prompt.token_ids for prompt in plan.prompts],
            [prompt.pooling_params() for prompt in plan.prompts],
            use_tqdm,
            "scoring",
        )
        scores = plan.scores([output.pooled for output in outputs])
        pair_outputs = [outputs[plan.pair_prompt_index(pair)] for pair in range(len(scores))]
        return [
            ScoringRequestOutput(output.request_id, output.prompt_token_ids, ScoringOutput(score))
            for output, score in zip(pair_outputs, scores, strict=True)
        ]

    def classify(
        self, prompts: PromptType | Sequence[PromptType], use_tqdm: bool = True
    ) -> list[ClassificationRequestOutput]:
        """A sequence classifier's class probabilities per prompt (``outputs.probs``:
        softmax of its logits; sigmoid for one label)."""
        self.engine.parts.runner.check_task("classify")
        prompt_list = [self._engine_prompt(prompt) for prompt in parse_prompts(prompts)]
        outputs = self._pool(
            prompt_list, [PoolingParams()] * len(prompt_list), use_tqdm, "classifying"
        )
        return [
            ClassificationRequestOutput(
                output.request_id,
                output.prompt_token_ids,
                ClassificationOutput(class_probabilities(output.pooled)),
            )
            for output in outputs
        ]

    def _pool(
        self, prompt_list: list, pooling: list[PoolingParams], use_tqdm: bool, what: str
    ) -> list[RequestOutput]:
        """Pool every prompt with its own settings; every output has its vector."""
        params = [self.engine.parts.runner.check_params(each) for each in pooling]
        outputs = self._run_requests(prompt_list, params, [None] * len(params), use_tqdm, what)
        for output in outputs:
            EmbeddingRequestOutput.of(output)  # ValueError for a request with no vector
        return outputs

    def _run_requests(
        self,
        prompt_list: list,
        params_list: list[SamplingParams],
        adapters: list[LoRARequest | None],
        use_tqdm: bool,
        what: str,
    ) -> list[RequestOutput]:
        """Queue every prompt, step until all are done; on any error abort them all."""
        request_ids = [f"offline-{next(self._ids)}" for _ in prompt_list]
        try:
            for request_id, prompt, params, adapter in zip(
                request_ids, prompt_list, params_list, adapters, strict=True
            ):
                self.engine.add_request(request_id, prompt, params, lora_request=adapter)
            finished = self._run(len(prompt_list), use_tqdm, what)
        except BaseException:
            for request_id in request_ids:
                self.engine.abort_request(request_id)
            self.engine.step()  # drain the abort outputs so the engine is clean
            raise
        return [finished[request_id] for request_id in request_ids]

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        chat_template: str | None = None,
        continue_final_message: bool = False,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation as the server does (``render_chat_prompt``), then generate.

        The rendered prompt goes to the engine as token ids, so the special tokens the
        template wrote (a BOS, say) are not added a second time. ``tools`` (OpenAI tool
        definitions) are shown to the chat template, as vLLM's ``LLM.chat`` does; reading
        calls out of the output is the caller's (or constrain it with
        ``structured_outputs``). ``chat_template`` (a file or the template's text),
        ``continue_final_message`` and ``chat_template_kwargs`` are vLLM's. Image parts
        (``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``)
        become the model's placeholders; the images go through its processor. As the
        server, ``http(s)://`` URLs are fetched only from ``allowed_media_domains`` and
        ``file://`` URLs read only under ``allowed_local_media_path`` (engine args).
        """
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.engine.tokenizer
        options = ChatOptions(
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template=load_chat_template(chat_template) if chat_template else None,
            template_kwargs=dict(chat_template_kwargs or {}),
        )
        prompts, engine_prompts = [], []
        for conversation in conversations:
            processor = self.engine.mm_processor
            placeholder = None if processor is None else processor.prompt_image_token
            template = options.chat_template or getattr(tokenizer, "chat_template", None)
            messages, images = split_images(conversation, placeholder, template)
            prompt = render_chat_prompt(tokenizer, messages, tools=tools, options=options)
            prompts.append(prompt)
            engine_prompts.append(self._chat_prompt(prompt, images))
        outputs = self._generate(engine_prompts, sampling_params, use_tqdm, None)
        for output, prompt in zip(outputs, prompts, strict=True):
            output.prompt = prompt.text
        return outputs

    def _chat_prompt(self, prompt: ChatPrompt, images: list[str]) -> list[int] | ProcessedPrompt:
        """A rendered conversation's token ids, or with images its processed prompt (the
        template wrote the special tokens: none are added)."""
        if not images:
            return prompt.token_ids
        self.engine.mm_processor.check_count(len(images))  # before anything is fetched
        sources = self.engine.media.load_all(images)  # http(s) and file URLs: their bytes
        return self.engine.process_multimodal(prompt.text, {"image": sources}, False)

    def _run(self, total: int, use_tqdm: bool, what: str) -> dict[str, RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=total, desc=what, unit="req", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update()
        return finished


def _generation_defaults(engine: LLMEngine) -> dict:
    """``generation_config``'s sampling defaults: the loaded model's folder for ``auto``."""
    mode = engine.args.generation_config
    if mode == "auto":
        return generation_defaults(engine.parts.folder)
    return sampling_defaults(mode, None)


def _as_params_list(
    params: SamplingParams | Sequence[SamplingParams] | None, count: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    params_list = list(params)
    if len(params_list) != count:
        raise ValueError(f"got {len(params_list)} sampling params for {count} prompts")
    return params_list


def _as_adapter_list(
    lora_request: LoRARequest | Sequence[LoRARequest | None] | None, count: int
) -> list[LoRARequest | None]:
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * count
    adapters = list(lora_request)
    if len(adapters) != count:
        raise ValueError(f"got {len(adapters)} lora_requests for {count} prompts")
    return adapters
