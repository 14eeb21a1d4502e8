#!/bin/bash
# $1: PYTHONPATH server dir; $2: label
export PYTHONPATH=$1:/work/main
PORT=8123
/tmp/ci1/.venv/bin/octavo serve /tmp/hostmodel2 --load-format dummy --dtype float32 --port $PORT --max-num-seqs 256 --max-model-len 1024 > /tmp/serve-$2.log 2>&1 &
SP=$!
for i in $(seq 120); do curl -sf localhost:$PORT/health >/dev/null && break; sleep 1; done
# warm
/tmp/ci1/.venv/bin/python -m octavo_bench serve --base-url http://127.0.0.1:$PORT --max-concurrency 64 --num-prompts 64 --input-len 32 --output-len 16 --tokenizer /tmp/hostmodel2 --endpoint completions --disable-tqdm > /dev/null 2>&1
pids=$(pgrep -P $SP; echo $SP)
cpu() { for p in $pids; do awk '{print $14+$15}' /proc/$p/stat; done | paste -sd' '; }
before=$(cpu)
/tmp/ci1/.venv/bin/python -m octavo_bench serve --base-url http://127.0.0.1:$PORT --max-concurrency 256 --num-prompts 512 --input-len 32 --output-len 128 --tokenizer /tmp/hostmodel2 --endpoint completions --disable-tqdm 2>&1 | grep "concurrency 256:"
after=$(cpu)
echo "$2 pids: $pids; cpu ticks before: $before; after: $after"
for p in $pids; do echo "$p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-80)"; done
kill $SP; wait $SP 2>/dev/null
