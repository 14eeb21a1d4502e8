"""The served core's per-step output work at 256 DELTA streams: text decoded in the core
against token ids only (the server decodes: ``StreamText``), thread CPU ms a step.

    PYTHONPATH=<checkout>/server python served_core.py MODEL_FOLDER [--stop]

``--stop``: the streams carry a stop string (one that never appears, so every stream runs
to max_tokens either way), found by the core or by the server.
"""

import pickle
import statistics
import sys
import time

from octavo import LLM, SamplingParams
from octavo.engine.core_messages import StepDone
from octavo.engine.stream_text import StreamText
from octavo.sampling_params import RequestOutputKind


def timed(engine, name: str, spent: list, then=None) -> None:
    original = getattr(engine, name)

    def wrapper(*args):
        start = time.thread_time()
        result = original(*args)
        if then is not None:
            then(result)
        spent.append(time.thread_time() - start)
        return result

    setattr(engine, name, wrapper)


def one_round(engine, prompts, params, in_server: bool, label: str, spent: dict) -> None:
    texts = [StreamText(engine.tokenizer, prompt, params) for prompt in prompts]
    core_params = StreamText.core_params(params) if in_server else params
    for index, prompt in enumerate(prompts):
        engine.add_request(f"{label}-{index}", prompt, core_params)
    for values in spent.values():
        values.clear()
    while engine.has_unfinished_requests():
        outputs = engine.step()
        start = time.thread_time()
        for output in outputs if in_server else []:
            texts[int(output.request_id.rsplit("-", 1)[1])].fill_output(output)
        spent["server"].append(time.thread_time() - start)
    medians = {k: 1e3 * statistics.median(v[20:]) for k, v in spent.items()}
    where = "server" if in_server else "core"
    print(
        f"{label} text in the {where}: core finish+pickle {medians['finish']:.3f} ms/step "
        f"(record {medians['record']:.3f}); server fill {medians['server']:.3f} ms/step"
    )


def main() -> None:
    llm = LLM(sys.argv[1], load_format="dummy", dtype="float32", device="cpu", max_model_len=2048)
    engine, spent = llm.engine, {"finish": [], "record": [], "server": []}
    timed(engine, "_finish_step", spent["finish"], lambda out: pickle.dumps(StepDone(out, None)))
    timed(engine, "_record_all", spent["record"])
    prompts = [[10 + (i * 7 + j) % 1000 for j in range(200)] for i in range(256)]
    params = SamplingParams(
        temperature=0,
        max_tokens=96,
        ignore_eos=True,
        stop=["never there"] if "--stop" in sys.argv[2:] else None,
        output_kind=RequestOutputKind.DELTA,
    )
    for round_ in range(5):
        for in_server in (False, True):
            one_round(engine, prompts, params, in_server, f"round {round_}", spent)


main()
