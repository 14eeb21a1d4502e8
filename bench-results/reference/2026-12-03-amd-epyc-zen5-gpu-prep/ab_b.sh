#!/bin/bash
# alternate the 11-29 tree (9a1c075) and HEAD on offline workload (b), bf16, octavo only
for round in 1 2 3; do
  for label in old new; do
    if [ $label = old ]; then src=/tmp/wt-old/server; else src=/work/main/server; fi
    out=/tmp/ab-$label-$round
    PYTHONPATH=$src:/work/main/server env -u PYTHONDONTWRITEBYTECODE /work/main/.venv/bin/python -m octavo_bench offline --workloads b --baselines '' --dtype bfloat16 --output-dir $out > $out.log 2>&1
    echo "$label $round $(grep -a 'octavo (b)' $out.log | tail -1)"
  done
done
