#!/bin/bash
# $1: --stream-interval; $2: label. The embedded SmolLM2-135M (bf16), 20 users.
PORT=8124
cd /work/main
.venv/bin/octavo serve --dtype bfloat16 --port $PORT --max-model-len 1024 --stream-interval $1 > /tmp/serve-$2.log 2>&1 &
SP=$!
for i in $(seq 180); do curl -sf localhost:$PORT/health >/dev/null && break; sleep 1; done
.venv/bin/python -m octavo_bench serve --base-url http://127.0.0.1:$PORT --max-concurrency 20 --num-prompts 20 --input-len 32 --output-len 16 --endpoint completions --disable-tqdm > /dev/null 2>&1
.venv/bin/python -m octavo_bench serve --base-url http://127.0.0.1:$PORT --max-concurrency 20 --num-prompts 80 --input-len 128 --output-len 128 --endpoint completions --disable-tqdm 2>&1 | grep "concurrency 20:"
kill $SP; wait $SP 2>/dev/null
