#!/usr/bin/env bash
# gpu_check.sh: everything that needs a GPU, in one prepared pass (make test-gpu), about 6-8 minutes on
# one H200. Run from the repository root on a machine with one CUDA GPU:
#   1. device: nvidia-smi summary
#   2. build: ./train with the CUDA backend, build/test_cuda (test/test_cuda.c), build/gemm_check and
#      build/bench_attention (their sources in scripts/gpu/: programs this script runs, not tests)
#   3. kernels: build/test_cuda (every CUDA op against the CPU reference on every code path, fp32 and
#      bf16, streams and events, scratch reuse), then one kernel on a bad pointer: with LLM4D_CUDA_SYNC=1
#      the error must name it, without it the error must say how to name it
#   4. tensor-core GEMM: build/gemm_check per kernel against an fp64 CPU reference, SASS when cuobjdump
#      is there, then TFLOP/s against cuBLAS at 4096^3, 8192^3 and d12's shapes
#   5. attention: build/bench_attention, flash forward and backward TFLOP/s at T = 1024-4096, head
#      sizes 64 and 128, against the simple kernels (results and times), and PyTorch's
#      scaled_dot_product_attention on the same shapes when PyTorch is there (comparator only)
#   6. training: 5 steps of small models on CPU and GPU, fp32 (losses equal to 1e-4) and bf16 with head
#      sizes 64 and 128 (the tensor-core paths; losses equal to 2e-2)
#   7. recompute: --recompute selective and full train bitwise the model file of --recompute none (bf16)
#   8. throughput: GPT-2 124M (d12), bf16, T = 1024, micro-batch 64 (or the largest of 64, 32, 16 that
#      fits): tokens/s and MFU against 989 TFLOP/s (dense bf16 peak of the H100/H200 datasheet)
#   9. several ranks sharing the GPU (scripts/gpu_check_multi.sh): the collectives on device memory over
#      CUDA IPC and TCP staging, DP/TP/PP/CP layouts against the single-GPU run, ZeRO 0-3 bitwise, and
#      bench-comm over CUDA IPC against the device-to-device copy bandwidth
# Each section prints PASS, FAIL or SKIP; the script exits non-zero if any section failed. A section
# that would not finish within the time budget (LLM4D_GPU_BUDGET seconds, default 480) is skipped.
# Logs go to build/gpucheck/. With $OUT set, exactly two files are written there: $OUT/gpu_table.md
# (the summary: sections, the GEMM, attention, throughput and bench-comm tables) and $OUT/gpucheck_logs.tar.gz.
set -uo pipefail

cd "$(dirname "$0")/.."
LOG=build/gpucheck
DATA=build/gpucheck_data
rm -rf "$LOG"
mkdir -p "$LOG"
BUDGET=${LLM4D_GPU_BUDGET:-480}
PEAK_TFLOPS=989
SUMMARY=$LOG/gpu_table.md

FAILED=0
SECTIONS=()

# tmo N: a command's time limit, N seconds or what is left of the budget (plus a minute of grace), so
# that the script ends, and writes its table, before whoever runs it gives up on it
tmo() {
    local left=$((BUDGET + 60 - SECONDS))
    [ "$left" -lt 1 ] && left=1
    [ "$1" -lt "$left" ] && left=$1
    echo "$left"
}

finish() {
    {
        echo "# gpu_check: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1), $(date -u +%Y-%m-%dT%H:%MZ), ${SECONDS} s"
        echo
        echo "| section | result |"
        echo "|---|---|"
        for s in "${SECTIONS[@]}"; do echo "| ${s#* } | ${s%% *} |"; done
        for f in gemm_table.md attention_table.md torch_attention.md throughput.md comm_table.md; do
            [ -f "$LOG/$f" ] || continue
            echo
            case $f in
            gemm_table.md) echo "## tensor-core GEMM (build/gemm_check --bench)" ;;
            attention_table.md) echo "## attention (build/bench_attention; causal, bf16, 16384 tokens per call, 16 heads)" ;;
            torch_attention.md) echo "## attention, PyTorch scaled_dot_product_attention (comparator)" ;;
            throughput.md) echo "## training throughput" ;;
            comm_table.md) echo "## bench-comm over CUDA IPC (the first line: device-to-device copy, the comparator)" ;;
            esac
            echo
            cat "$LOG/$f"
        done
    } > "$SUMMARY"
    if [ -n "${OUT:-}" ]; then
        cp -f "$SUMMARY" "$OUT/gpu_table.md"
        tar czf "$OUT/gpucheck_logs.tar.gz" -C build gpucheck 2>/dev/null || true
    fi
}
trap finish EXIT

# section NAME SECONDS FUNCTION: runs FUNCTION when SECONDS (its expected worst case) still fit in the
# budget, records PASS/FAIL/SKIP. Functions check each command themselves.
section() {
    local name=$1 need=$2 fn=$3
    echo
    echo "=== $name ($SECONDS s elapsed) ==="
    if [ $((SECONDS + need)) -gt "$BUDGET" ]; then
        echo "SKIP $name: $need s would pass the budget of $BUDGET s"
        SECTIONS+=("SKIP $name")
        return
    fi
    if "$fn"; then
        echo "PASS $name"
        SECTIONS+=("PASS $name")
    else
        echo "FAIL $name"
        SECTIONS+=("FAIL $name")
        FAILED=$((FAILED + 1))
    fi
}

# ---------------------------------------------------------------------------------------------------

check_device() {
    command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found"; return 1; }
    nvidia-smi -L || return 1
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu,clocks.max.sm \
        --format=csv || return 1
}

BUILD_OK=0
check_build() {
    make -j"$(nproc)" all build/test_cuda build/gemm_check build/bench_attention > "$LOG/make.log" 2>&1
    local rc=$?
    tail -n 5 "$LOG/make.log"
    [ "$rc" -eq 0 ] || return 1
    grep -q "backends: cpu+cuda" "$LOG/make.log" || { echo "./train was built without the CUDA backend (nvcc not found?)"; return 1; }
    BUILD_OK=1
}

check_kernels() {
    [ "$BUILD_OK" -eq 1 ] || { echo "build failed"; return 1; }
    timeout "$(tmo 240)" ./build/test_cuda > "$LOG/test_cuda.log" 2>&1
    local rc=$? ok=0
    grep -E "^(FAIL|skipped|backend)" "$LOG/test_cuda.log" | head -n 40
    tail -n 1 "$LOG/test_cuda.log"
    [ "$rc" -eq 0 ] || { echo "build/test_cuda exited with status $rc"; ok=1; }
    grep -q "^no CUDA device: skipped" "$LOG/test_cuda.log" && { echo "no CUDA device was found"; ok=1; }
    grep -qE "^[0-9]+ passed, 0 failed$" "$LOG/test_cuda.log" || ok=1
    # a failing kernel: named with LLM4D_CUDA_SYNC=1, and the hint without it
    LLM4D_CUDA_SYNC=1 timeout "$(tmo 60)" ./build/test_cuda --fault > "$LOG/fault_sync.log" 2>&1
    rc=$?
    cat "$LOG/fault_sync.log"
    if [ "$rc" -ne 1 ] || ! grep -q "^error: CUDA kernel residual_fwd_kernel failed: " "$LOG/fault_sync.log"; then
        echo "LLM4D_CUDA_SYNC=1 did not name the failing kernel (status $rc)"
        ok=1
    fi
    timeout "$(tmo 60)" ./build/test_cuda --fault > "$LOG/fault.log" 2>&1
    rc=$?
    cat "$LOG/fault.log"
    if [ "$rc" -ne 1 ] || ! grep -q "^error: CUDA .*LLM4D_CUDA_SYNC=1 names it" "$LOG/fault.log"; then
        echo "without LLM4D_CUDA_SYNC the error did not point to it (status $rc)"
        ok=1
    fi
    return $ok
}

check_gemm() {
    [ "$BUILD_OK" -eq 1 ] || { echo "build failed"; return 1; }
    local ok=0 good=() k rc
    if command -v cuobjdump >/dev/null; then
        cuobjdump --dump-sass build/gemm_cu.o > "$LOG/gemm_sass.txt" 2>&1
        cuobjdump --dump-sass build/attention_cu.o > "$LOG/attention_sass.txt" 2>&1
        local hg hm ha
        hg=$(grep -c HGMMA "$LOG/gemm_sass.txt" || true)
        hm=$(grep -c HMMA "$LOG/gemm_sass.txt" || true)
        ha=$(grep -c HMMA "$LOG/attention_sass.txt" || true)
        echo "SASS: gemm_cu.o $hg HGMMA, $hm HMMA; attention_cu.o $ha HMMA"
        [ "$hg" -gt 0 ] && [ "$hm" -gt 0 ] && [ "$ha" -gt 0 ] || { echo "expected HGMMA and HMMA in gemm_cu.o, HMMA in attention_cu.o"; ok=1; }
    fi
    for k in mma wgmma; do
        timeout "$(tmo 150)" ./build/gemm_check --check --kernel "$k" > "$LOG/gemm_check_$k.log" 2>&1
        rc=$?
        grep -E "^(FAIL|gemm_check:|device:)|skipped" "$LOG/gemm_check_$k.log" | head -n 40
        tail -n 3 "$LOG/gemm_check_$k.log"
        if [ "$rc" -eq 0 ]; then
            grep -q "skipped" "$LOG/gemm_check_$k.log" || good+=("$k")
        else
            echo "gemm_check --check --kernel $k exited with status $rc"
            ok=1
        fi
    done
    if [ "${#good[@]}" -eq 0 ]; then
        echo "no GEMM kernel passed its check: no benchmark"
        return 1
    fi
    k=all
    [ "${#good[@]}" -eq 1 ] && k=${good[0]}
    timeout "$(tmo 150)" ./build/gemm_check --bench --kernel "$k" --table "$LOG/gemm_table.md" > "$LOG/gemm_bench.log" 2>&1
    rc=$?
    tail -n 25 "$LOG/gemm_bench.log"
    [ "$rc" -eq 0 ] || { echo "gemm_check --bench exited with status $rc"; ok=1; }
    return $ok
}

check_attention() {
    [ "$BUILD_OK" -eq 1 ] || { echo "build failed"; return 1; }
    timeout "$(tmo 150)" ./build/bench_attention --table "$LOG/attention_table.md" > "$LOG/bench_attention.log" 2>&1
    local rc=$?
    cat "$LOG/bench_attention.log"
    # the comparator: PyTorch's fused attention on the same shapes (not a pass/fail criterion)
    timeout "$(tmo 120)" python3 - > "$LOG/torch_attention.log" 2>&1 <<'EOF'
import statistics, torch, torch.nn.functional as F
rows = ["| hs | T | B x heads | fwd TFLOP/s | bwd TFLOP/s |", "|---|---|---|---|---|"]
for hs in (64, 128):
    for T in (1024, 2048, 4096):
        B, H = 16384 // T, 16
        q, k, v = (torch.randn(B, H, T, hs, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        g = torch.randn(B, H, T, hs, device="cuda", dtype=torch.bfloat16)
        def timed(fn, n=10):
            for _ in range(2): fn()
            ts = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(n): fn()
                b.record(); torch.cuda.synchronize()
                ts.append(a.elapsed_time(b) / 1e3 / n)
            return statistics.median(ts)
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        both = timed(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), g))
        flops = 2.0 * B * H * T * T * hs
        rows.append(f"| {hs} | {T} | {B} x {H} | {flops / fwd / 1e12:.1f} | {2.5 * flops / max(both - fwd, 1e-9) / 1e12:.1f} |")
print("\n".join(rows))
EOF
    if [ $? -eq 0 ]; then
        grep "^|" "$LOG/torch_attention.log" > "$LOG/torch_attention.md"
        cat "$LOG/torch_attention.md"
    else
        echo "PyTorch comparator not run: $(tail -n 1 "$LOG/torch_attention.log")"
    fi
    [ "$rc" -eq 0 ] || { echo "build/bench_attention exited with status $rc"; return 1; }
}

prepare_data() {
    local text=/usr/share/common-licenses/GPL-3
    if [ ! -f "$text" ]; then
        # no Debian license texts here: any deterministic text of a few tens of KB will do
        text=$LOG/gpucheck_text.txt
        python3 -c 'import random; r = random.Random(1); w = ["the","model","gradient","device","kernel","loss","step","token","layer","norm"]
print("\n".join(" ".join(r.choice(w) for _ in range(12)) for _ in range(4000)))' > "$text" || return 1
    fi
    rm -rf "$DATA"
    mkdir -p "$DATA"
    ./train prepare "$text" "$DATA" > "$LOG/prepare.log" 2>&1 || { cat "$LOG/prepare.log"; return 1; }
    [ -f "$DATA/train.bin" ] || { echo "$DATA/train.bin was not written"; return 1; }
}

# compare_losses CPU.jsonl GPU.jsonl TOL: the losses of every step agree to TOL (relative)
compare_losses() {
    python3 - "$@" <<'EOF'
import json, sys
def losses(path):
    return {r["step"]: float(r["loss"]) for r in map(json.loads, filter(str.strip, open(path))) if "loss" in r}
cpu, gpu, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
ok = len(cpu) >= 5 and sorted(cpu) == sorted(gpu)
if not ok: print(f"steps: cpu {sorted(cpu)}, gpu {sorted(gpu)}")
for s in sorted(cpu):
    if s not in gpu: continue
    rel = abs(gpu[s] - cpu[s]) / max(abs(cpu[s]), 1e-12)
    ok = ok and rel <= tol
    print(f"step {s}: cpu loss {cpu[s]:.7f}  gpu loss {gpu[s]:.7f}  rel {rel:.2e}  {'ok' if rel <= tol else 'MISMATCH'}")
sys.exit(0 if ok else 1)
EOF
}

DATA_OK=0
check_training() {
    [ "$BUILD_OK" -eq 1 ] || { echo "build failed"; return 1; }
    prepare_data || return 1
    DATA_OK=1
    local ok=0 name dt tol shape
    # fp32 on both devices must agree to 1e-4; bf16 with heads of 64 and 128 channels runs the tensor-core
    # GEMMs and the flash kernels on the GPU, AVX512-BF16 or fp32 FMAs on the CPU: 2e-2
    for run in "fp32 fp32 1e-4 2 64 4" "bf16-hs64 bf16 2e-2 2 128 2" "bf16-hs128 bf16 2e-2 2 256 2"; do
        set -- $run
        name=$1 dt=$2 tol=$3
        shape=(--layers "$4" --channels "$5" --heads "$6" --vocab 256 --seq-len 128 --micro-batch 4 --steps 5 --lr 1e-3
            --dtype "$dt" --train "$DATA/train.bin")
        echo "--- $name: ${shape[*]}"
        timeout "$(tmo 120)" ./train --device cpu "${shape[@]}" --log "$LOG/train_cpu_$name.jsonl" > "$LOG/train_cpu_$name.log" 2>&1 ||
            { tail -n 3 "$LOG/train_cpu_$name.log"; ok=1; continue; }
        timeout "$(tmo 120)" ./train --device cuda "${shape[@]}" --log "$LOG/train_gpu_$name.jsonl" > "$LOG/train_gpu_$name.log" 2>&1 ||
            { tail -n 3 "$LOG/train_gpu_$name.log"; ok=1; continue; }
        compare_losses "$LOG/train_cpu_$name.jsonl" "$LOG/train_gpu_$name.jsonl" "$tol" || ok=1
    done
    return $ok
}

# the rebuilt activations (gelu_fwd, LayerNorm, the whole block) are bitwise the forward's, so the trained
# model files are identical; the peak activation memory falls
check_recompute() {
    [ "$BUILD_OK" -eq 1 ] || { echo "build failed"; return 1; }
    if [ "$DATA_OK" -ne 1 ]; then prepare_data || return 1; fi
    local r ok=0
    for r in none selective full; do
        timeout "$(tmo 60)" ./train --device cuda --dtype bf16 --train "$DATA/train.bin" --layers 4 --channels 128 --heads 2 \
            --vocab 256 --seq-len 128 --micro-batch 4 --batch-tokens 1024 --steps 4 --recompute $r \
            --log "$LOG/recompute_$r.jsonl" --save-model "$LOG/recompute_$r.bin" > "$LOG/recompute_$r.log" 2>&1 ||
            { echo "--recompute $r failed"; tail -n 5 "$LOG/recompute_$r.log"; return 1; }
        grep "memory of rank 0, peak" "$LOG/recompute_$r.log"
    done
    for r in selective full; do
        if cmp "$LOG/recompute_none.bin" "$LOG/recompute_$r.bin"; then echo "--recompute $r: bitwise --recompute none"
        else echo "--recompute $r: the model differs from --recompute none"; ok=1; fi
    done
    return $ok
}

check_throughput() {
    [ "$BUILD_OK" -eq 1 ] || { echo "build failed"; return 1; }
    if [ "$DATA_OK" -ne 1 ]; then prepare_data || return 1; fi
    local b rc
    for b in 64 32 16; do
        timeout "$(tmo 200)" ./train --device cuda --model d12 --seq-len 1024 --micro-batch "$b" --batch-tokens $((b * 1024)) \
            --steps 8 --dtype bf16 --train "$DATA/train.bin" > "$LOG/throughput_b$b.log" 2>&1
        rc=$?
        tail -n 4 "$LOG/throughput_b$b.log"
        [ "$rc" -eq 0 ] && break
        grep -qi "out of .*memory" "$LOG/throughput_b$b.log" || { echo "d12 at micro-batch $b exited with status $rc"; return 1; }
        echo "micro-batch $b does not fit; trying a smaller one"
    done
    [ "$rc" -eq 0 ] || return 1
    python3 - "$LOG/throughput_b$b.log" "$b" "$PEAK_TFLOPS" > "$LOG/throughput.md" <<'EOF' || return 1
import re, statistics, sys
steps = [(float(m.group(1)), float(m.group(2)), float(m.group(3))) for m in
         (re.search(r"\| ([0-9.]+) ms \| ([0-9.]+) tok/s \| ([0-9.]+) GFLOP/s", l) for l in open(sys.argv[1])) if m]
later = steps[2:]  # the first steps warm up (scratch, GEMM probe, tensor maps)
if not later: sys.exit("no step lines")
ms, tps, gf = (statistics.median(x[i] for x in later) for i in range(3))
print("| model | micro-batch x T | ms/step | tokens/s | TFLOP/s | MFU |")
print("|---|---|---|---|---|---|")
print(f"| d12 bf16 | {sys.argv[2]} x 1024 | {ms:.1f} | {tps:.0f} | {gf / 1e3:.1f} | {100 * gf / 1e3 / float(sys.argv[3]):.1f}% of {sys.argv[3]} |")
print(f"\nmedian of steps 3-{len(steps)}; FLOPs per token as ./train counts them (6N plus attention)")
EOF
    cat "$LOG/throughput.md"
}

section "device" 10 check_device
section "build" 240 check_build
section "kernels (build/test_cuda, LLM4D_CUDA_SYNC)" 150 check_kernels
section "tensor-core GEMM (build/gemm_check)" 120 check_gemm
section "attention (build/bench_attention)" 60 check_attention
section "training cpu vs gpu" 60 check_training
section "recompute bitwise on the gpu" 45 check_recompute
section "throughput (d12)" 60 check_throughput
# several ranks on the one GPU over CUDA IPC (scripts/gpu_check_multi.sh)
source scripts/gpu_check_multi.sh
section "collectives on device memory, 2 and 4 ranks (CUDA IPC)" 60 check_multi_collectives
section "DP/TP/PP/CP layouts on one GPU vs the single-GPU run; ZeRO 0-3 bitwise" 80 check_multi_layouts
section "bench-comm over CUDA IPC vs device-to-device copy" 30 check_multi_bench

echo
echo "=== summary ($SECONDS s) ==="
for s in "${SECTIONS[@]}"; do echo "$s"; done
if [ "$FAILED" -ne 0 ]; then
    echo "gpu_check: $FAILED section(s) failed"
    exit 1
fi
echo "gpu_check: all sections passed"
