#!/bin/bash
# after the gated run: scratch PPO until about 12:40 UTC, then CMA-ES at the residual run's budget
cd /work/wt-measure/benchmarks
while kill -0 $(cat out/gated.pid) 2>/dev/null; do sleep 10; done
now=$(date -u +%s); until=$(date -u -d "12:38" +%s)
mins=$(( (until - now) / 60 )); [ $mins -lt 5 ] && mins=5
echo "start $(date -u) max-minutes $mins"
nice -n 10 ../.venv/bin/python finetune.py scratch --max-minutes $mins --every 65536 --test-episodes 200 --cmaes --cmaes-budget 431551 --jsonl out/scratch.jsonl --write
echo "end $(date -u)"
