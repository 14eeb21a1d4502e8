#!/bin/bash
# Served throughput of `octavo serve` on the 2-layer host model, 256 streams at a time.
#   VENV=<venv> bash served_cpu.sh SERVER_DIR LABEL
# SERVER_DIR: the checkout's server/ folder measured (PYTHONPATH); MODEL: the model folder
# (config-only, dummy weights; vocabulary 49,152 as the client sends random ids).
# Prints the client's line and the CPU ticks of the server's processes (API, resource
# tracker, engine core) over the measured run. Run it without `| head`: a closed pipe
# would end the script before it stops the server.
VENV=${VENV:-.venv}
MODEL=${MODEL:-/tmp/hostmodel2}
export PYTHONPATH=$1:$1/..
PORT=8123
$VENV/bin/octavo serve $MODEL --load-format dummy --dtype float32 --port $PORT --max-num-seqs 256 --max-model-len 1024 > /tmp/serve-$2.log 2>&1 &
SP=$!
for i in $(seq 120); do curl -sf localhost:$PORT/health >/dev/null && break; sleep 1; done
bench() {
    $VENV/bin/python -m octavo_bench serve --base-url http://127.0.0.1:$PORT --tokenizer $MODEL \
        --endpoint completions --disable-tqdm --input-len 32 "$@"
}
bench --max-concurrency 64 --num-prompts 64 --output-len 16 > /dev/null 2>&1  # warm-up
pids=$(pgrep -f "multiprocessing|octavo serve" | sort -n)
cpu() { for p in $pids; do awk "{print \$14+\$15}" /proc/$p/stat 2>/dev/null; done | paste -sd' '; }
before=$(cpu)
bench --max-concurrency 256 --num-prompts 512 --output-len 128 2>&1 | grep "concurrency 256:"
after=$(cpu)
echo "$2 cpu ticks before: $before; after: $after"
kill $SP; wait $SP 2>/dev/null
