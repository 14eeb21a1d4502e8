"""The served core's output work at 256 DELTA streams (ids only: the server decodes the
text), with and without token deltas, alternating in one engine; thread CPU ms a step.

    PYTHONPATH=<checkout>/server python token_deltas.py MODEL_FOLDER [ROUNDS]

core: ``_finish_step`` (the scheduler's update, the tokens' bookkeeping and the outputs),
of which ``outputs`` (``_output_for`` over the step's rows), then ``StepDone`` pickled (its
outputs packed); server: the blob unpickled, token deltas expanded.
"""

import pickle
import statistics
import sys
import time

from octavo import LLM, SamplingParams
from octavo.engine.core_messages import StepDone
from octavo.engine.stream_text import StreamText
from octavo.engine.token_deltas import TokenDeltaExpander
from octavo.sampling_params import RequestOutputKind


def timed(owner, name: str, spent: list) -> None:
    original = getattr(owner, name)

    def wrapper(*args):
        start = time.thread_time()
        result = original(*args)
        spent.append(time.thread_time() - start)
        return result

    setattr(owner, name, wrapper)


def one_round(engine, prompts, params, token_deltas: bool, spent: dict) -> str:
    engine.token_deltas = token_deltas
    for index, prompt in enumerate(prompts):
        engine.add_request(f"{token_deltas}-{index}", prompt, params)
    engine.token_deltas = False
    rows = {key: [] for key in ("finish", "outputs", "pickle", "server")}
    expander = TokenDeltaExpander()
    while engine.has_unfinished_requests():
        for values in spent.values():
            values.clear()
        outputs = engine.step()
        start = time.thread_time()
        blob = pickle.dumps(StepDone(outputs, None))
        middle = time.thread_time()
        expander.expand(pickle.loads(blob).outputs)
        rows["server"].append(time.thread_time() - middle)
        rows["pickle"].append(middle - start)
        rows["finish"].append(sum(spent["finish"]))
        rows["outputs"].append(sum(spent["outputs"]))
    medians = " ".join(f"{k} {1e3 * statistics.median(v[20:]):.3f}" for k, v in rows.items())
    return f"token deltas {'on ' if token_deltas else 'off'}: {medians} ms/step"


def main() -> None:
    llm = LLM(sys.argv[1], load_format="dummy", dtype="float32", device="cpu", max_model_len=2048)
    engine, spent = llm.engine, {"finish": [], "outputs": []}
    timed(engine, "_finish_step", spent["finish"])
    timed(engine, "_output_for", spent["outputs"])
    prompts = [[10 + (i * 7 + j) % 1000 for j in range(200)] for i in range(256)]
    delta = SamplingParams(
        temperature=0, max_tokens=96, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    params = StreamText.core_params(delta)  # what the server sends the core
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 4):
        for token_deltas in (False, True):
            print(one_round(engine, prompts, params, token_deltas, spent), flush=True)


main()
