#!/usr/bin/env bash
# The Llama family's CPU kernels (build/bench_llama): grouped-query attention, alone and with RoPE fused,
# against GPT-2's multi-head attention of the same query shape as a share of the measured fp32 FMA peak
# (build/bench_matmul --peak), and RMSNorm, SwiGLU and RoPE beside LayerNorm and GELU in GB/s. Figures,
# never pass/fail; the machine's load is printed first (a loaded machine makes every figure slower).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/bench_llama ] && [ -x build/bench_matmul ] || make --no-print-directory build/bench_llama build/bench_matmul >/dev/null
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
PEAK=$(./build/bench_matmul --peak)
echo "measured fp32 FMA peak: $PEAK GFLOP/s per core"
./build/bench_llama "$PEAK" 1 2
