"""Host phases of 256 greedy decode rows, thread CPU ms per step (steal time on a shared
VM moves wall time by up to 2x between runs; thread CPU time much less).

    PYTHONPATH=<checkout>/server python host_phases.py MODEL_FOLDER PROMPT_LEN

MODEL_FOLDER: a config-only folder (dummy weights); these runs used SmolLM2's config cut to
2 layers, hidden 64, vocabulary 2048, so the forward is small beside the host's work.
"""

import collections
import statistics
import sys
import time

from octavo import LLM, SamplingParams


def timed(owner, name, label, spent):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.thread_time()
        result = original(*args, **kwargs)
        spent[label].append(time.thread_time() - start)
        return result

    setattr(owner, name, wrapper)


def main() -> None:
    folder, prompt_len = sys.argv[1], int(sys.argv[2])
    llm = LLM(folder, load_format="dummy", dtype="float32", device="cpu", max_model_len=2048)
    engine, spent = llm.engine, collections.defaultdict(list)
    timed(engine.scheduler, "schedule", "schedule", spent)
    timed(engine.executor.worker.runner, "prepare", "prepare", spent)
    timed(engine.scheduler, "update_from_output", "update", spent)
    timed(engine, "_record_all", "detokenize", spent)
    timed(engine, "_finish_step", "finish_step", spent)
    prompts = [[10 + (i * 7 + j) % 1000 for j in range(prompt_len)] for i in range(256)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    spent.clear()
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    for _ in range(2):
        llm.generate(prompts, params, use_tqdm=False)
    medians = " ".join(f"{k} {1e3 * statistics.median(v):.3f}" for k, v in spent.items())
    print(medians, "ms/step median (thread CPU)")


main()
