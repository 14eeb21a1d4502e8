#!/bin/bash
# $1: --stream-interval; $2: label. The 2-layer SmolLM2-shaped model (hidden 64, SmolLM2's
# vocabulary), dummy weights: the host's work per token dominates, as on a GPU.
PORT=8123
cd /work/main
.venv/bin/octavo serve ${MODEL:-/tmp/hostmodel2} --load-format dummy --dtype float32 --port $PORT --max-num-seqs 256 --max-model-len 1024 --stream-interval $1 > /tmp/serve-$2.log 2>&1 &
SP=$!
for i in $(seq 120); do curl -sf localhost:$PORT/health >/dev/null && break; sleep 1; done
.venv/bin/python -m octavo_bench serve --base-url http://127.0.0.1:$PORT --max-concurrency 64 --num-prompts 64 --input-len 32 --output-len 16 --tokenizer ${MODEL:-/tmp/hostmodel2} --endpoint completions --disable-tqdm > /dev/null 2>&1
pids=$(pgrep -P $SP; echo $SP)
cpu() { for p in $pids; do awk '{print $14+$15}' /proc/$p/stat; done | paste -sd+ | bc; }
before=$(cpu)
.venv/bin/python -m octavo_bench serve --base-url http://127.0.0.1:$PORT --max-concurrency 256 --num-prompts 512 --input-len 32 --output-len 128 --tokenizer ${MODEL:-/tmp/hostmodel2} --endpoint completions --disable-tqdm 2>&1 | grep "concurrency 256:"
after=$(cpu)
echo "$2: server CPU ticks (all its processes) $((after - before))"
kill $SP; wait $SP 2>/dev/null
