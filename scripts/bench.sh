#!/usr/bin/env bash
# make bench: throughput figures (medians over 5 steps), never pass/fail. Prints the machine first.
set -euo pipefail
cd "$(dirname "$0")/.."
W=$(mktemp -d /tmp/llm4d-bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
./train prepare /usr/share/common-licenses/GPL-3 "$W/data" >/dev/null

median_of() { # jsonl field: median over steps 2..6 (step 1 warms caches and allocator)
    grep '"loss"' "$1" | sed -n '2,6p' | grep -o "\"$2\":[0-9.e+-]*" | cut -d: -f2 | sort -g | sed -n 3p
}

run() { # label threads flops-per-token args...
    local label=$1 threads=$2
    shift 2
    ./train --train "$W/data/train.bin" --steps 6 --threads "$threads" --log "$W/b.jsonl" "$@" >"$W/b.out"
    local tps gf
    tps=$(median_of "$W/b.jsonl" tokens_per_s)
    gf=$(grep -o '[0-9.]* GFLOP/s' "$W/b.out" | sed -n '2,6p' | cut -d' ' -f1 | sort -g | sed -n 3p)
    printf '%-34s threads %d: %9.0f tokens/s  %7.2f GFLOP/s\n' "$label" "$threads" "$tps" "$gf"
}

for th in 1 2; do
    run "L4 C256 H4 T256 B4" $th --layers 4 --channels 256 --heads 4 --vocab 256 --seq-len 256 --micro-batch 4
done
for th in 1 2; do
    run "d12 (124M) T64 B1" $th --model d12 --seq-len 64 --micro-batch 1
done
./build/bench_matmul 1024
echo
echo "== data parallelism (scripts/bench_dp.sh) =="
bash scripts/bench_dp.sh
echo
echo "== tensor parallelism (scripts/bench_tp.sh) =="
bash scripts/bench_tp.sh
echo
echo "== pipeline parallelism (scripts/bench_pp.sh) =="
bash scripts/bench_pp.sh
echo
echo "== checkpoints (scripts/bench_ckpt.sh) =="
bash scripts/bench_ckpt.sh

# collectives against OpenMPI on this node (skipped, saying so, when mpicc is not installed)
bash scripts/bench/compare_mpi.sh
