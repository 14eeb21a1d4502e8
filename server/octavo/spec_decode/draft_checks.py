"""Can this draft model propose tokens for this target? Checked before anything loads."""

from __future__ import annotations

from pathlib import Path

from octavo.distributed.parallel_config import ParallelConfig
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.model_folders import resolve_model_folder
from octavo.spec_decode.config import SpeculativeConfig


def resolve_draft(
    speculative: SpeculativeConfig | None,
    target: ModelConfig,
    max_model_len: int,
    parallel: ParallelConfig,
) -> tuple[Path, ModelConfig] | None:
    """The draft model's folder and config (None without one); ValueError if it cannot
    serve this target."""
    if speculative is None or speculative.method != "draft_model":
        return None
    if parallel.world_size > 1:
        raise ValueError(
            "speculative_config: a draft model runs with tensor_parallel_size and "
            'pipeline_parallel_size 1; with more ranks use {"method": "ngram"}'
        )
    try:
        folder = resolve_model_folder(speculative.model)
        draft = ModelConfig.from_folder(folder)
    except (OSError, ValueError, KeyError) as error:
        message = f"speculative_config: draft model {speculative.model!r}: {error}"
        raise ValueError(message) from None
    check_draft(draft, target, max_model_len, speculative.model or "")
    return folder, draft


def check_draft(draft: ModelConfig, target: ModelConfig, max_model_len: int, name: str) -> None:
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"speculative_config: draft model {name!r} has a vocabulary of {draft.vocab_size} "
            f"tokens but the target has {target.vocab_size}; a draft model must share the "
            "target's tokenizer"
        )
    longest = draft.context.longest if draft.context else draft.max_position_embeddings
    if longest < max_model_len:
        raise ValueError(
            f"speculative_config: draft model {name!r} handles "
            f"{longest} positions, fewer than max_model_len "
            f"{max_model_len}; lower max_model_len"
        )
