"""``octavo launch render``: a server of the render endpoints alone (vLLM's
``vllm launch render``), for an endpoint picker's pod to run beside the picker from the
same image, with no accelerator and no model weights.

Its engine core loads only what rendering reads: the model's config.json (for the
context length and vocabulary size) and its tokenizer with the chat template (a hub
model's snapshot is fetched without its weights). The app, the routes and the request
checks are the full server's (``build_app(render_only=True)``), so a render answers
exactly as the full server's does for the same flags.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from octavo.config import EngineArgs
from octavo.engine.builder import max_model_len_of
from octavo.engine.core_loop import Emit
from octavo.engine.core_messages import STOP, CoreReady, CoreStopped, LoadFailed
from octavo.engine.engine_info import EngineInfo, longest_token_chars
from octavo.inputs.token_range import prompt_token_limit
from octavo.model_executor.hub import download_snapshot, parse_hub_model, served_name
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.model_folders import (
    TOKENIZER_PATTERNS,
    load_tokenizer,
    resolve_model_folder,
)

logger = logging.getLogger(__name__)


class TokenizerCore:
    """An engine core (``EngineCore``) that loads the tokenizer and runs no model: it
    reports ``CoreReady`` with the facts rendering needs, then waits to be stopped."""

    def __init__(self, args: EngineArgs) -> None:
        self._args = args
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, emit: Emit) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(emit,), name="octavo-render", daemon=True
        )
        self._thread.start()

    def _run(self, emit: Emit) -> None:
        try:
            info = load_render_info(self._args)
        except Exception:
            logger.exception("the tokenizer failed to load")
            emit(LoadFailed("the tokenizer failed to load"))
            return
        logger.info(
            "render server ready: %s (max_model_len %d)", info.model_name, info.max_model_len
        )
        emit(CoreReady(info))
        self._stop.wait()
        emit(CoreStopped("the render server stopped", dead=False))

    def send(self, command: Any) -> None:
        if command is not STOP:  # the render-only app has no route that generates
            raise RuntimeError(f"a render server runs no model ({type(command).__name__})")
        self._stop.set()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)


def load_render_info(args: EngineArgs) -> EngineInfo:
    """What the routes read of an engine, from the config and tokenizer alone (the values
    the engine itself derives from them, through the same functions)."""
    folder = config_folder(args.model, args.revision)
    config = ModelConfig.from_folder(folder, args.hf_overrides)
    tokenizer = load_tokenizer(folder, args.tokenizer)
    return EngineInfo(
        tokenizer=tokenizer,
        max_model_len=max_model_len_of(args, config),
        tokenizer_size=len(tokenizer),
        prompt_token_limit=prompt_token_limit(config.vocab_size, len(tokenizer)),
        model_name=served_name(args.model) if args.model else folder.name,
        max_num_seqs=args.max_num_seqs,
        kv_cache_tokens=0,  # no KV cache: nothing here is sized by it
        max_token_chars=longest_token_chars(tokenizer),
        vocab_size=config.vocab_size,
        architecture=config.architecture,
    )


def config_folder(model: str | None, revision: str | None) -> Path:
    """The model's folder; of a hub model, a snapshot of its config and tokenizer files."""
    hub = parse_hub_model(model, revision) if model is not None else None
    if hub is None:
        return resolve_model_folder(model, revision)
    return download_snapshot(hub, "config.json", TOKENIZER_PATTERNS)
