"""``openai-harmony``'s gpt-oss encoding, loaded once.

It needs OpenAI's ``o200k_base`` vocabulary: downloaded on first use, or read from
``TIKTOKEN_ENCODINGS_BASE`` (a folder holding ``o200k_base.tiktoken``; the package checks
its hash) where the server cannot reach the internet, as for vLLM. A server that cannot
load it renders gpt-oss prompts with the model's own chat template instead (gpt-oss's
template writes Harmony too), and says so once in its log.
"""

from __future__ import annotations

import functools
import logging
import os

from openai_harmony import HarmonyEncoding, HarmonyEncodingName, HarmonyError
from openai_harmony import load_harmony_encoding as _load

ENCODINGS_BASE = "TIKTOKEN_ENCODINGS_BASE"
logger = logging.getLogger(__name__)


def harmony_encoding() -> HarmonyEncoding | None:
    """The encoding (None where it cannot be loaded), once per vocabulary folder."""
    return _encoding_from(os.environ.get(ENCODINGS_BASE))


@functools.cache
def _encoding_from(base: str | None) -> HarmonyEncoding | None:
    try:
        return _load(HarmonyEncodingName.HARMONY_GPT_OSS)
    except HarmonyError as error:
        logger.warning(
            "openai-harmony cannot load gpt-oss's encoding (%s); gpt-oss prompts are rendered "
            "by the model's chat template. Set %s to a folder holding o200k_base.tiktoken.",
            error,
            ENCODINGS_BASE,
        )
        return None
