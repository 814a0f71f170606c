#!/usr/bin/env bash
# make bench: throughput figures (medians over steps 2-6), never pass/fail. Prints the machine and its load
# first: the figures are only as good as the machine was quiet.
# Its matmul benchmark, build/bench_matmul, is built from scripts/bench/bench_matmul.c (the benchmark programs
# live in scripts/bench/, beside the OpenMPI and gloo comparison).
set -euo pipefail
cd "$(dirname "$0")/.."
W=$(mktemp -d /tmp/llm4d-bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
./train prepare /usr/share/common-licenses/GPL-3 "$W/data" >/dev/null
PEAK=$(./build/bench_matmul --peak)
echo "measured fp32 FMA peak: $PEAK GFLOP/s per core (build/bench_matmul); bf16 matmuls: $(./train --dtype bf16 --steps 0 --layers 1 --channels 16 --heads 1 --vocab 16 --seq-len 4 | grep -o 'bf16 matmuls: [a-z0-9]*' | cut -d' ' -f3)"

# run LABEL THREADS ARGS...: one line with the median step's tokens/s, GFLOP/s, share of the threads'
# measured peak, and its split between matmuls, attention and the rest (--profile); the median ms is
# left in $W/ms for ratios
run() {
    local label=$1 threads=$2
    shift 2
    ./train --train "$W/data/train.bin" --steps 6 --threads "$threads" --profile --log "$W/b.jsonl" "$@" >"$W/b.out"
    python3 - "$W/b.jsonl" "$W/b.out" "$label" "$threads" "$PEAK" "$W/ms" <<'PY'
import json, re, sys
log, out, label, threads, peak, msfile = sys.argv[1:]
steps = [json.loads(l) for l in open(log) if '"loss"' in l][1:6]  # step 1 warms caches and the allocator
gf = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"step +(\d+)/\d+ .*?\| ([0-9.]+) GFLOP/s", open(out).read())}
med = sorted(steps, key=lambda r: r["ms"])[len(steps) // 2]
g = gf[med["step"]]
mm, at = 100 * med["matmul_ms"] / med["ms"], 100 * med["attention_ms"] / med["ms"]
print(f"{label:<28} threads {threads}: {med['ms']:8.1f} ms {med['tokens_per_s']:9.0f} tokens/s {g:8.2f} GFLOP/s "
      f"{100 * g / (float(peak) * int(threads)):4.0f}% of peak | matmul {mm:3.0f}%, attention {at:3.0f}%, other {100 - mm - at:3.0f}%")
open(msfile, "w").write(str(med["ms"]))
PY
}

SMALL=(--layers 4 --channels 256 --heads 4 --vocab 256 --seq-len 256 --micro-batch 4)
for th in 1 2; do
    run "L4 C256 H4 T256 B4 fp32" $th "${SMALL[@]}"
    fp32=$(cat "$W/ms")
    run "L4 C256 H4 T256 B4 bf16" $th "${SMALL[@]}" --dtype bf16
    echo "    bf16 step is $(python3 -c "print(f'{$fp32 / $(cat "$W/ms"):.2f}')")x faster than fp32 with $th thread(s)"
done
# a Llama of the same size beside GPT-2 (GQA 4 heads on 2 kv heads, SwiGLU F = 768 (8C/3 rounded up to
# 256), tied head): tokens/s, GFLOP/s (its own FLOPs: three MLP matmuls, smaller K/V) and peak share
LLAMA=(--arch llama --layers 4 --channels 256 --heads 4 --kv-heads 2 --vocab 256 --seq-len 256 --micro-batch 4 --tie-embeddings 1)
for th in 1 2; do
    run "L4 C256 H4 T256 B4 fp32" $th "${SMALL[@]}"
    gpt2=$(cat "$W/ms")
    run "Llama L4 C256 H4/KV2 fp32" $th "${LLAMA[@]}"
    echo "    the Llama step takes $(python3 -c "print(f'{$(cat "$W/ms") / $gpt2:.2f}')")x GPT-2's time with $th thread(s)"
done
for th in 1 2; do
    run "d12 (124M) T64 B1 fp32" $th --model d12 --seq-len 64 --micro-batch 1
done
echo
echo "== matmul kernel on the model's shapes (build/bench_matmul) =="
./build/bench_matmul
echo
echo "== Llama kernels: GQA and RoPE against GPT-2's attention, RMSNorm, SwiGLU (scripts/bench_llama.sh) =="
bash scripts/bench_llama.sh
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
echo "== activation recompute (scripts/bench_recompute.sh) =="
bash scripts/bench_recompute.sh
echo
echo "== context parallelism (scripts/bench_cp.sh) =="
bash scripts/bench_cp.sh
echo
echo "== checkpoints (scripts/bench_ckpt.sh) =="
bash scripts/bench_ckpt.sh
echo
echo "== tokenizers: GPT-2 encoding and BPE training (scripts/bench_tokenizer.sh) =="
bash scripts/bench_tokenizer.sh

# collectives against OpenMPI on this node (skipped, saying so, when mpicc is not installed)
bash scripts/bench/compare_mpi.sh

# the collectives' algorithms: fan-in, ring and hierarchy against OpenMPI on one node and across two
# simulated nodes (network namespaces; skipped, saying why, without root or OpenMPI). Long on a loaded
# machine: `make bench QUICK=1` runs its quick mode (4 ranks on one node, 8 across, 1-16 MiB).
echo
echo "== collective algorithms (scripts/bench_algo.sh${QUICK:+, QUICK=$QUICK}) =="
bash scripts/bench_algo.sh
