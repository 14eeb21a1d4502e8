"""What an encoder model (``EncoderModel``: BERT, RoBERTa, XLM-R) changes in an engine:
its prompts are computed whole in one step (the token budget holds the longest), prefix
caching and decode CUDA graphs are off (a token's keys depend on later tokens; nothing
decodes), speculative decoding and LoRA are refused, and the longest prompt is what the
position table holds (RoBERTa's starts past the padding index)."""

from __future__ import annotations

import logging

from octavo.config import EngineArgs
from octavo.model_executor.context_length import context_length_of
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.registry import model_class

logger = logging.getLogger(__name__)


def encoder_settings(args: EngineArgs, config: ModelConfig) -> bool:
    """Is the model an encoder? Then ``config.context`` becomes its position table's
    length; ValueError for what an encoder cannot run with."""
    cls = model_class(config.architecture)
    if not cls.is_encoder:
        return False
    name = config.architecture
    if args.speculative_config is not None:
        raise ValueError(f"{name} is an encoder: it generates nothing to speculate on")
    if args.enable_lora:
        raise ValueError(f"{name} is an encoder: LoRA adapters are not supported for it")
    positions = {"max_position_embeddings": cls.max_positions(config)}
    config.context = context_length_of(positions, config.rope)
    if args.enable_prefix_caching:
        logger.info("prefix caching off: %s attends both ways (keys depend on later tokens)", name)
    return True


def encoder_token_budget(budget: int, max_model_len: int) -> int:
    """A step's tokens: at least one whole prompt of the longest length."""
    return max(budget, max_model_len)
