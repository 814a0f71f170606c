#!/usr/bin/env bash
# gpu_check.sh: everything that needs a GPU, in one prepared pass (make test-gpu). Run from the repository
# root on a machine with one CUDA GPU (an H200 is the target):
#   1. nvidia-smi summary
#   2. build: make (./train with the CUDA backend) and build/test_cuda
#   3. build/test_cuda: every CUDA kernel against the CPU reference, fp32 and bf16, and determinism
#   4. training: 5 steps of a small model on CPU and on GPU (both fp32), losses equal to 1e-4 relative
#   5. recompute: --recompute selective and full give the model file of --recompute none, byte for byte (bf16)
#   6. throughput: 10 steps of GPT-2 124M (d12) in bf16 on the GPU
#   7. tensor-core GEMM (gemm.cu): build/gemm_check, each kernel against a CPU fp64 reference, then the
#      timing table against cuBLAS (build/gpucheck/gemm_table.md, and $OUT/gemm_table.md)
# Each section prints PASS or FAIL; the script exits non-zero if any section failed. Logs go to
# build/gpucheck/ and, when $OUT is set, are copied there at the end.
set -euo pipefail

cd "$(dirname "$0")/.."
LOG=build/gpucheck
DATA=build/gpucheck_data
mkdir -p "$LOG"

FAILED=0
SECTIONS=()

copy_logs() {
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT/gpucheck"
        cp -f "$LOG"/* "$OUT/gpucheck/" 2>/dev/null || true
        cp -f build/gpucheck_cpu.jsonl build/gpucheck_gpu.jsonl "$OUT/gpucheck/" 2>/dev/null || true
    fi
}
trap copy_logs EXIT

# section NAME FUNCTION: runs FUNCTION, records PASS/FAIL. Functions check each command themselves
# (errexit does not apply inside a function called from a condition).
section() {
    local name=$1 fn=$2
    echo
    echo "=== $name ==="
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
# 1. device summary

check_device() {
    command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found"; return 1; }
    nvidia-smi -L || return 1
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu,clocks.max.sm \
        --format=csv || return 1
}

# ---------------------------------------------------------------------------------------------------
# 2. build

BUILD_OK=0
check_build() {
    make -j"$(nproc)" 2>&1 | tee "$LOG/make.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
    grep -q "cpu+cuda" "$LOG/make.log" || { echo "./train was built without the CUDA backend (nvcc not found?)"; return 1; }
    make build/test_cuda 2>&1 | tee -a "$LOG/make.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
    BUILD_OK=1
}

# ---------------------------------------------------------------------------------------------------
# 3. kernels against the CPU reference

check_kernels() {
    [ "$BUILD_OK" -eq 1 ] || { echo "skipped: build failed"; return 1; }
    timeout 600 ./build/test_cuda 2>&1 | tee "$LOG/test_cuda.log"
    local rc=${PIPESTATUS[0]}
    grep -E "^FAIL" "$LOG/test_cuda.log" || true
    tail -n 1 "$LOG/test_cuda.log"
    [ "$rc" -eq 0 ] || { echo "build/test_cuda exited with status $rc"; return 1; }
    grep -q "^no CUDA device: skipped" "$LOG/test_cuda.log" && { echo "no CUDA device was found"; return 1; }
    grep -qE "^[0-9]+ passed, 0 failed$" "$LOG/test_cuda.log" || return 1
}

# ---------------------------------------------------------------------------------------------------
# 4. training on GPU against training on CPU

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
    ./train prepare "$text" "$DATA" 2>&1 | tee "$LOG/prepare.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
    [ -f "$DATA/train.bin" ] || { echo "$DATA/train.bin was not written"; return 1; }
}

DATA_OK=0
check_training() {
    [ "$BUILD_OK" -eq 1 ] || { echo "skipped: build failed"; return 1; }
    prepare_data || return 1
    DATA_OK=1
    # fp32 on both devices (the GPU default is bf16), so that the losses must agree to 1e-4
    local common=(--train "$DATA/train.bin" --layers 2 --channels 64 --heads 4 --vocab 256 --seq-len 64
        --micro-batch 4 --steps 5 --lr 1e-3 --dtype fp32)
    rm -f build/gpucheck_cpu.jsonl build/gpucheck_gpu.jsonl
    echo "--- cpu"
    timeout 600 ./train --device cpu "${common[@]}" --log build/gpucheck_cpu.jsonl 2>&1 | tee "$LOG/train_cpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "CPU training run failed"; return 1; }
    echo "--- cuda"
    timeout 600 ./train --device cuda "${common[@]}" --log build/gpucheck_gpu.jsonl 2>&1 | tee "$LOG/train_gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "GPU training run failed"; return 1; }
    python3 - build/gpucheck_cpu.jsonl build/gpucheck_gpu.jsonl <<'EOF' || return 1
import json, sys

def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            if "loss" in rec:
                out[rec["step"]] = float(rec["loss"])
    return out

cpu, gpu = losses(sys.argv[1]), losses(sys.argv[2])
ok = True
if not cpu or sorted(cpu) != sorted(gpu):
    print(f"step mismatch: cpu steps {sorted(cpu)}, gpu steps {sorted(gpu)}")
    ok = False
for s in sorted(cpu):
    if s not in gpu:
        continue
    a, b = gpu[s], cpu[s]
    rel = abs(a - b) / max(abs(b), 1e-12)
    good = rel <= 1e-4
    ok = ok and good
    print(f"step {s}: cpu loss {b:.7f}  gpu loss {a:.7f}  rel {rel:.2e}  {'ok' if good else 'MISMATCH'}")
if len(cpu) < 5:
    print(f"expected 5 logged steps, got {len(cpu)}")
    ok = False
sys.exit(0 if ok else 1)
EOF
}

# ---------------------------------------------------------------------------------------------------
# 5. activation recompute on the GPU: the rebuilt activations (gelu_fwd, LayerNorm, the whole block) are
#    bitwise the forward's, so the trained model files are identical; the peak activation memory falls

check_recompute() {
    [ "$BUILD_OK" -eq 1 ] || { echo "skipped: build failed"; return 1; }
    if [ "$DATA_OK" -ne 1 ]; then prepare_data || return 1; fi
    local r ok=0
    for r in none selective full; do
        timeout 600 ./train --device cuda --dtype bf16 --train "$DATA/train.bin" --layers 4 --channels 128 --heads 4 \
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

# ---------------------------------------------------------------------------------------------------
# 6. throughput

check_throughput() {
    [ "$BUILD_OK" -eq 1 ] || { echo "skipped: build failed"; return 1; }
    if [ "$DATA_OK" -ne 1 ]; then prepare_data || return 1; fi
    rm -f "$LOG/timing.jsonl"
    timeout 600 ./train --device cuda --model d12 --seq-len 256 --micro-batch 8 --steps 10 --dtype bf16 \
        --train "$DATA/train.bin" --log "$LOG/timing.jsonl" > "$LOG/timing.log" 2>&1
    local rc=$?
    tail -n 20 "$LOG/timing.log"
    [ "$rc" -eq 0 ] || { echo "timing run exited with status $rc"; return 1; }
    python3 - "$LOG/timing.jsonl" <<'EOF' || true
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r for r in recs if "loss" in r]
later = steps[2:] or steps  # skip warm-up steps
if later:
    ms = sum(r.get("ms", 0) for r in later) / len(later)
    tps = sum(r.get("tokens_per_s", 0) for r in later) / len(later)
    print(f"d12 bf16 B=8 T=256: {ms:.1f} ms/step, {tps:.0f} tokens/s (mean of steps {later[0]['step']}..{later[-1]['step']})")
EOF
}

# ---------------------------------------------------------------------------------------------------
# 7. the tensor-core GEMM: each kernel checked in its own process (one that faults or traps cannot hide
#    the other), the SASS looked at when cuobjdump is there, then the benchmark of those that passed

check_gemm() {
    [ "$BUILD_OK" -eq 1 ] || { echo "skipped: build failed"; return 1; }
    make -j"$(nproc)" build/gemm_check 2>&1 | tee "$LOG/gemm_build.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
    local ok=0 good=() k rc
    if command -v cuobjdump >/dev/null; then
        cuobjdump --dump-sass build/gemm_cu.o > "$LOG/gemm_sass.txt" 2>&1
        local hg hm
        hg=$(grep -c HGMMA "$LOG/gemm_sass.txt" || true)
        hm=$(grep -c HMMA "$LOG/gemm_sass.txt" || true)
        echo "SASS of gemm_cu.o: $hg HGMMA, $hm HMMA instructions"
        [ "$hg" -gt 0 ] && [ "$hm" -gt 0 ] || { echo "expected both HGMMA (wgmma kernel) and HMMA (mma.sync kernel)"; ok=1; }
    fi
    for k in mma wgmma; do
        timeout 300 ./build/gemm_check --check --kernel "$k" > "$LOG/gemm_check_$k.log" 2>&1
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
    timeout 300 ./build/gemm_check --bench --kernel "$k" --table "$LOG/gemm_table.md" 2>&1 | tee "$LOG/gemm_bench.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { echo "gemm_check --bench exited with status $rc"; ok=1; }
    if [ -n "${OUT:-}" ] && [ -f "$LOG/gemm_table.md" ]; then cp -f "$LOG/gemm_table.md" "$OUT/gemm_table.md"; fi
    return $ok
}

section "device" check_device
section "build" check_build
section "kernels (build/test_cuda)" check_kernels
section "tensor-core GEMM (build/gemm_check)" check_gemm
section "training cpu vs gpu" check_training
section "recompute bitwise on the gpu" check_recompute
section "throughput" check_throughput

echo
echo "=== summary ==="
for s in "${SECTIONS[@]}"; do echo "$s"; done
if [ "$FAILED" -ne 0 ]; then
    echo "gpu_check: $FAILED section(s) failed"
    exit 1
fi
echo "gpu_check: all sections passed"
