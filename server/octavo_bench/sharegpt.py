"""ShareGPT-format datasets for ``python -m octavo_bench serve --dataset-name sharegpt``.

``sample_sharegpt`` draws requests from a ShareGPT JSON file the way vLLM's
``benchmark_serving.py`` / ``vllm bench serve --dataset-name sharegpt`` does: conversations
with at least two turns, shuffled with the seed; the first turn is the prompt, the second
turn's token count is the request's ``max_tokens`` (unless a fixed output length is
given); pairs with a prompt or output under 4 tokens, a prompt over 1,024 tokens or a total
over 2,048 are skipped. Lengths come from the served model's tokenizer.

``python -m octavo_bench sharegpt-synth OUT.json`` writes a seeded file in the same format
for machines that cannot download the real one (``ShareGPT_V3_unfiltered_cleaned_split.json``):
prompt and reply lengths are log-normal with ShareGPT's means as the vLLM paper reports
them (161 input, 338 output tokens), the text random common words (about one token each).
Figures from it are "ShareGPT-shaped", not ShareGPT's: say which file a report used.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from octavo.arg_types import positive_int
from octavo_bench.parsers import register_subcommand, standalone_parser
from octavo_bench.serve_workload import WORDS, PromptSpec

MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048  # vLLM's is_valid_sequence
SHAREGPT_MEAN_INPUT, SHAREGPT_MEAN_OUTPUT = 161.31, 337.99  # vLLM paper, Table 1


@dataclass(frozen=True)
class LogNormal:
    """A log-normal length distribution given by its mean and the sigma of its log."""

    mean: float
    sigma: float

    def draw(self, rng: random.Random, low: int, high: int) -> int:
        mu = math.log(self.mean) - self.sigma**2 / 2
        return max(low, min(high, round(rng.lognormvariate(mu, self.sigma))))


def valid_pair(prompt_len: int, output_len: int, fixed_output: bool) -> bool:
    """vLLM's filter for a (prompt, output) pair drawn from ShareGPT."""
    if prompt_len < MIN_LEN or (not fixed_output and output_len < MIN_LEN):
        return False
    return prompt_len <= MAX_PROMPT_LEN and prompt_len + output_len <= MAX_TOTAL_LEN


def conversations(path: Path) -> list[dict]:
    """The file's entries with at least two turns (a prompt and a reply)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: a ShareGPT file is a JSON list of conversations")
    return [entry for entry in data if len(entry.get("conversations", [])) >= 2]


def sample_sharegpt(
    path: Path,
    count_tokens: Callable[[str], int],
    num_requests: int,
    seed: int,
    output_len: int | None = None,
) -> list[PromptSpec]:
    """``num_requests`` prompts drawn as vLLM draws them (fewer if the file runs out)."""
    entries = conversations(path)
    random.Random(seed).shuffle(entries)
    picked: list[PromptSpec] = []
    for prompt, reply in _turn_pairs(entries):
        if len(picked) == num_requests:
            break
        prompt_len = count_tokens(prompt)
        wanted = output_len if output_len is not None else count_tokens(reply)
        if valid_pair(prompt_len, wanted, output_len is not None):
            picked.append(PromptSpec(prompt, prompt_len, wanted))
    if not picked:
        raise ValueError(f"{path}: no conversation passes ShareGPT's length filter")
    return picked


def _turn_pairs(entries: list[dict]) -> Iterator[tuple[str, str]]:
    for entry in entries:
        first, second = entry["conversations"][:2]
        yield str(first.get("value", "")), str(second.get("value", ""))


@cache
def token_counter(model_folder: str | Path) -> Callable[[str], int]:
    """Token counts as vLLM's client computes them: the served model's tokenizer, with its
    special tokens (loaded once per folder, however many levels ask)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_folder))
    return lambda text: len(tokenizer(text).input_ids)


def synthesize(num_conversations: int, seed: int) -> list[dict]:
    """ShareGPT-format conversations with ShareGPT's mean lengths (see the module doc)."""
    rng = random.Random(seed)
    prompts = LogNormal(SHAREGPT_MEAN_INPUT, 1.0)
    replies = LogNormal(SHAREGPT_MEAN_OUTPUT, 0.8)
    entries = []
    for index in range(num_conversations):
        prompt = " ".join(rng.choice(WORDS) for _ in range(prompts.draw(rng, 2, 1500)))
        reply = " ".join(rng.choice(WORDS) for _ in range(replies.draw(rng, 2, 1500)))
        turns = [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]
        entries.append({"id": f"synthetic-{seed}-{index}", "conversations": turns})
    return entries


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", type=Path, help="JSON file to write")
    parser.add_argument("--num-conversations", type=positive_int, default=1000)
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    entries = synthesize(args.num_conversations, args.seed)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(entries))
    print(f"wrote {len(entries)} ShareGPT-format conversations to {args.output}")
    return 0


def register(kinds: argparse._SubParsersAction) -> None:
    help_text = "write a seeded ShareGPT-format (ShareGPT-shaped) dataset file"
    register_subcommand(kinds, "sharegpt-synth", help_text, __doc__, "", add_arguments, run)


def build_parser() -> argparse.ArgumentParser:
    return standalone_parser("sharegpt-synth", __doc__, "", add_arguments)
