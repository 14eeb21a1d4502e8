"""The served engine core's output work per step at 256 streaming (DELTA) requests, thread
CPU ms: building the RequestOutputs, the stats, and pickling the StepDone the pipe to the
server carries (and the server's unpickling, outside the core's loop).

    PYTHONPATH=<checkout>/server python served_outputs.py MODEL_FOLDER
"""

import collections
import pickle
import statistics
import sys
import time

from octavo import LLM, SamplingParams
from octavo.engine.core_messages import StepDone
from octavo.sampling_params import RequestOutputKind


def main() -> None:
    llm = LLM(sys.argv[1], load_format="dummy", dtype="float32", device="cpu", max_model_len=2048)
    engine, spent, rows = llm.engine, collections.Counter(), collections.defaultdict(list)
    output_for = engine._output_for

    def timed(request):
        start = time.thread_time()
        output = output_for(request)
        spent["outputs"] += time.thread_time() - start
        return output

    engine._output_for = timed
    params = SamplingParams(
        temperature=0, max_tokens=120, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    for round_index in range(2):
        for i in range(256):
            prompt = [10 + (i * 7 + j) % 1000 for j in range(64)]
            engine.add_request(f"r{round_index}-{i}", prompt, params)
        while engine.has_unfinished_requests():
            spent.clear()
            outputs = engine.step()
            start = time.thread_time()
            stats = engine.stats()
            stats_done = time.thread_time()
            blob = pickle.dumps(StepDone(outputs, stats), protocol=pickle.HIGHEST_PROTOCOL)
            pickled = time.thread_time()
            pickle.loads(blob)
            if len(outputs) == 256:
                rows["make_output"].append(spent["outputs"])
                rows["stats"].append(stats_done - start)
                rows["pickle"].append(pickled - stats_done)
                rows["unpickle(server)"].append(time.thread_time() - pickled)
    medians = " ".join(f"{k} {1e3 * statistics.median(v):.3f}" for k, v in rows.items())
    print(medians, "ms/step median, 256 DELTA outputs")


main()
