#!/bin/bash
# The scaling bench on a machine with no network and no Rust (issue 35's
# 16 cores), from a folder staged by benches/stage_offline.py:
#
#   THREADS=4,8,12,16 REPS=2 ROUNDS=2 bash benches/scaling_offline.sh .offline
#
# POOL_STATS=1 adds `oxillama bench --pool-stats` at the same thread counts.
# Builds llama-bench from the staged source, writes the synthetic 1.7B
# (SHAPE=llama3-8b-slice for the other), then runs bench_llamabench.py.
# Everything printed also goes to $OUT/log.txt when OUT is set.
set -u
STAGE=$(realpath "${1:-.offline}")
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:$STAGE/site HOME=${HOME:-/tmp}
LOG=${OUT:-/tmp}/log.txt
exec > >(tee "$LOG") 2>&1
date; nproc
lscpu | grep -E 'Model name|Socket|Core|Thread|NUMA node|L2|L3' | cut -c1-120
python3 -c "import oxillama._native as n; print('oxillama', n.__version__, '-', n.physical_core_count(), 'physical cores')"
t0=$(date +%s)
BUILD=/tmp/llama-build
mkdir -p /tmp/llama-src && tar xzf "$STAGE/llama.tar.gz" -C /tmp/llama-src
gen=$(command -v ninja >/dev/null && echo "-G Ninja")
# shellcheck disable=SC2046  # the flags are words
( cmake -S /tmp/llama-src -B $BUILD $gen $(cat "$STAGE/cmake_flags.txt") >/tmp/llama-build.log 2>&1 \
  && cmake --build $BUILD --target llama-bench -j"$(nproc)" >>/tmp/llama-build.log 2>&1
  echo "llama-bench build: exit $? after $(( $(date +%s) - t0 )) s" ) &
build=$!
MODEL=$(python3 benches/bench_bandwidth.py --shape "${SHAPE:-smollm2-1.7b}" --write-only 2>/dev/null | tail -1)
# Wait for the build alone: a bare `wait` also waits for the tee above,
# which never ends.
wait $build
echo "model $MODEL; ready after $(( $(date +%s) - t0 )) s"
python3 benches/bench_llamabench.py --llama-bench $BUILD/bin/llama-bench -m "$MODEL" \
  -p "${PP:-512}" -n "${TG:-128}" -t "${THREADS:-4,8,12,16}" -r "${REPS:-2}" --rounds "${ROUNDS:-2}"
# Where the threads' time went (the counters cost up to 1%, so apart from
# the comparison above).
if [ -n "${POOL_STATS:-}" ]; then
  python3 -m oxillama bench --pool-stats -m "$MODEL" -p "${PP:-512}" -n "${TG:-128}" \
    -t "${THREADS:-4,8,12,16}" -r 1 2>&1 | grep -E "pool:|t/s|---|CPU"
fi
echo "done after $(( $(date +%s) - t0 )) s"
