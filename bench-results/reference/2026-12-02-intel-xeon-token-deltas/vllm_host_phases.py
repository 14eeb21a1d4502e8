"""vLLM's scheduler phases at 256 greedy rows (the shape of ``host_phases.py``, next to it in
``../2026-12-01-amd-epyc-avx2-host``): thread CPU ms a step, medians.

    OMP_NUM_THREADS=1 .venv-vllm/bin/python vllm_host_phases.py MODEL_FOLDER PROMPT_LEN

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), eager, with
dummy weights; ``update`` is ``Scheduler.update_from_output``, which also builds the
step's ``EngineCoreOutputs`` (Octavo's ``update`` + ``detokenize`` + its outputs, together
``finish_step`` in ``host_phases.py``). vLLM's CPU attention wants a head size of 64 or
more, so the folder's config has hidden 128, 2 query heads and 1 KV head of 64.
"""

import os
import statistics
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams


def timed(owner, name, spent):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.thread_time()
        result = original(*args, **kwargs)
        spent.append(time.thread_time() - start)
        return result

    setattr(owner, name, wrapper)


llm = LLM(
    sys.argv[1],
    load_format="dummy",
    dtype="float32",
    max_model_len=2048,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    enforce_eager=True,
    kv_cache_memory_bytes=2 << 30,
)
core = llm.llm_engine.engine_core.engine_core
spent = {"schedule": [], "update": []}
timed(core.scheduler, "schedule", spent["schedule"])
timed(core.scheduler, "update_from_output", spent["update"])
prompts = [
    {"prompt_token_ids": [10 + (i * 7 + j) % 1000 for j in range(int(sys.argv[2]))]}
    for i in range(256)
]
llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
for _ in range(2):
    for v in spent.values():
        v.clear()
    llm.generate(prompts, params, use_tqdm=False)
    print(
        " ".join(f"{k} {1e3 * statistics.median(v[10:]):.3f}" for k, v in spent.items()),
        "ms/step median (thread CPU)",
        flush=True,
    )
