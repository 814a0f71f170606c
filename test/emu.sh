# test/emu.sh: the real CUDA sources on the emulated GPU (emu/; build/*-emu). Sourced by test/run.sh,
# which provides TRAIN, PY, WORK, DATA and have_torch. Each test skips (77) where g++ was missing at
# build time (no build/test_cuda-emu).

EMU_TEST_CUDA=./build/test_cuda-emu
EMU_TRAIN=./build/train-emu
have_emu() { [ -x "$EMU_TEST_CUDA" ] && [ -x "$EMU_TRAIN" ] || { echo "no emulator binaries (g++ missing at build time)"; return 77; }; }

# test_cuda --small: every op and path against the CPU backend with NaN-poisoned outputs, on an
# emulated H100 (sm_90: the mma.sync path, the wgmma one where emu/sm90.h is built in) and A100 (sm_80),
# and on the H100 again with each block's threads scheduled last to first (LLM4D_EMU_REVERSE=1: a
# result that depends on the threads' order without a barrier would differ)
t_emu_kernels() {
    have_emu || return $?
    local ok=0 gpu
    for gpu in h100 a100 h100-reverse; do
        echo "== LLM4D_EMU_GPU=$gpu"
        LLM4D_EMU_REVERSE=$([ $gpu = h100-reverse ] && echo 1 || echo 0) LLM4D_EMU_GPU=${gpu%-reverse} $EMU_TEST_CUDA --small \
            >"$WORK/emu_kernels_$gpu.log" 2>&1 || ok=1
        grep -E "^(FAIL|backend)|emu:" "$WORK/emu_kernels_$gpu.log" | head -n 30
        tail -n 1 "$WORK/emu_kernels_$gpu.log"
        grep -qE "^[0-9]+ passed, 0 failed$" "$WORK/emu_kernels_$gpu.log" || ok=1
    done
    # with the sm_90a module built in, the H100 runs the wgmma GEMM; the A100 never does
    if [ -f emu/sm90.cc ]; then
        grep -q "tensor-core GEMM here: wgmma" "$WORK/emu_kernels_h100.log" || { echo "FAIL: no wgmma on the emulated H100"; ok=1; }
    fi
    grep -q "tensor-core GEMM here: mma.sync" "$WORK/emu_kernels_a100.log" || { echo "FAIL: the emulated A100 did not run mma.sync"; ok=1; }
    return $ok
}

# The checker catches what it exists to catch: broken variants of the real kernels
# (build/test_checker-emu, emu/test_checker.cc) are each reported with the kernel and the reason, and
# the kernels as they are pass silently (the wgmma ones where the sm_90a module is built in).
t_emu_checker() {
    have_emu || return $?
    local ok=0 v op want out rc
    while read -r v op want; do
        [ "$op" = - ] && op=$v v=none # the small kernels of test_checker.cc
        [ "$op" = wgmma ] && [ ! -f emu/sm90.cc ] && { echo "--- $v $op: no sm_90a module, skipped"; continue; }
        out=$(./build/test_checker-emu "$v" "$op" 2>&1)
        rc=$?
        echo "--- $v $op (status $rc)"
        echo "$out"
        if [ "$want" = - ]; then
            { [ $rc -eq 0 ] && ! grep -q "^emu:" <<<"$out"; } || { echo "FAIL: the unbroken kernel was reported"; ok=1; }
        elif [ $rc -eq 0 ] || ! grep -qE -- "$want" <<<"$out"; then
            echo "FAIL: expected a report matching: $want"
            ok=1
        fi
    done <<'LIST'
none gemm -
none attention -
nosync gemm ^emu: kernel gemm_mma_kernel.*: race on shared memory
nosync attention ^emu: kernel fa_fwd_kernel.*: race on shared memory
waitlow gemm ^emu: kernel gemm_mma_kernel.*while the cp.async that thread [0-9]+ issued into it is in flight
waitlow attention ^emu: kernel fa_fwd_kernel.*while the cp.async that thread [0-9]+ issued into it is in flight
noattr gemm ^emu: launch of gemm_mma_kernel.*bytes of dynamic shared memory, above the kernel's limit of 49152 bytes
none wgmma -
swizzle wgmma ^emu: kernel gemm_wgmma_kernel.*through a descriptor with 64-byte swizzle .* that a TMA copy wrote with 128-byte swizzle
expect_tx wgmma ^emu: kernel gemm_wgmma_kernel.*deadlock: .*tx-count 16 \(expected 49168 bytes, copies completed 49152\)
deadlock - ^emu: kernel half_barrier_kernel block \(0,0,0\): deadlock: .*threads 0-63 wait at __syncthreads at test_checker.cc
diverge - ^emu: kernel half_shuffle_kernel block \(0,0,0\) thread 16: exited while lane 0 of its warp waits at shfl.sync.bfly \(divergence\)
LIST
    # the runtime itself: host loads from device memory fault, stream order, late events, each device's limits
    for gpu in h100 a100; do
        LLM4D_EMU_GPU=$gpu ./build/test_checker-emu none runtime || { echo "FAIL: the runtime checks on $gpu"; ok=1; }
    done
    return $ok
}

# LLM4D_CUDA_SYNC=1 names the failing kernel (test_cuda --fault: a bad pointer); without it the next
# waiting call reports the failure and says how to name it
t_emu_sync_names_kernel() {
    have_emu || return $?
    local out ok=0 rc
    out=$(LLM4D_CUDA_SYNC=1 $EMU_TEST_CUDA --fault 2>&1)
    rc=$?
    echo "$out"
    [ $rc -eq 1 ] && grep -q "^error: CUDA kernel residual_fwd_kernel failed: .*(LLM4D_CUDA_SYNC=1)" <<<"$out" || ok=1
    grep -q "^emu: kernel residual_fwd_kernel<float> block (0,0,0) thread 0: illegal address" <<<"$out" || ok=1
    out=$($EMU_TEST_CUDA --fault 2>&1)
    rc=$?
    echo "$out"
    [ $rc -eq 1 ] && grep -q "^error: CUDA .*LLM4D_CUDA_SYNC=1 names it" <<<"$out" || ok=1
    return $ok
}

# A driver older than the build's CUDA runtime (cudaGetDeviceCount: cudaErrorInsufficientDriver) is
# named as such with both versions, not as "no CUDA device"; no driver at all says so.
t_emu_old_driver() {
    have_emu || return $?
    local out ok=0
    out=$(LLM4D_EMU_DRIVER=11040 $EMU_TRAIN --device cuda --steps 0 2>&1)
    [ $? -eq 1 ] && [ "$(wc -l <<<"$out")" -eq 1 ] &&
        grep -q "^error: --device cuda: the NVIDIA driver supports CUDA 11.4, older than the CUDA 12.8 this binary was built with: install a driver for CUDA 12.8 or later$" <<<"$out" ||
        { echo "old driver: $out"; ok=1; }
    out=$(LLM4D_EMU_DRIVER=0 $EMU_TRAIN --device cuda --steps 0 2>&1)
    [ $? -eq 1 ] && grep -q "^error: --device cuda: no CUDA device is available (no NVIDIA driver is installed)$" <<<"$out" ||
        { echo "no driver: $out"; ok=1; }
    return $ok
}

# losses of two runs (JSON Lines) within a relative tolerance, step by step
emu_losses_close() { # tol ref cand
    $PY - "$@" <<'PYEOF'
import json, sys
tol = float(sys.argv[1])
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[2:4])
assert len(a) == len(b) and a, f"{len(a)} and {len(b)} steps"
err = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"losses {a} vs {b}: max relative difference {err:.2e} (tolerance {tol})")
sys.exit(0 if err <= tol else 1)
PYEOF
}

# ./train --device cuda on the emulated GPU against --device cpu: fp32 (1e-4, as scripts/gpu_check.sh)
# and bf16 with heads of 64 channels (the tensor-core GEMMs and the flash kernels; 2e-2, the README's
# bf16 tolerance); recompute selective and full bitwise --recompute none on the device
t_emu_train() {
    have_emu || return $?
    local ok=0 d=$WORK/emu_train r
    mkdir -p "$d"
    local shape=(--layers 2 --channels 64 --heads 1 --vocab 256 --seq-len 64 --micro-batch 2 --steps 2 --lr 1e-3 --train "$DATA/train.bin")
    for dt in fp32 bf16; do
        $TRAIN --device cpu "${shape[@]}" --dtype $dt --log "$d/cpu_$dt.jsonl" >"$d/cpu_$dt.out" 2>&1 || { tail -n 3 "$d/cpu_$dt.out"; return 1; }
        $EMU_TRAIN --device cuda "${shape[@]}" --dtype $dt --log "$d/emu_$dt.jsonl" --save-model "$d/emu_$dt.bin" >"$d/emu_$dt.out" 2>&1 ||
            { tail -n 5 "$d/emu_$dt.out"; return 1; }
        emu_losses_close "$([ $dt = fp32 ] && echo 1e-4 || echo 2e-2)" "$d/cpu_$dt.jsonl" "$d/emu_$dt.jsonl" || ok=1
    done
    for r in selective full; do
        $EMU_TRAIN --device cuda "${shape[@]}" --dtype bf16 --recompute $r --save-model "$d/emu_bf16_$r.bin" >"$d/emu_$r.out" 2>&1 ||
            { tail -n 5 "$d/emu_$r.out"; return 1; }
        if cmp "$d/emu_bf16.bin" "$d/emu_bf16_$r.bin"; then echo "--recompute $r: bitwise --recompute none"
        else echo "--recompute $r: the model differs from --recompute none"; ok=1; fi
    done
    return $ok
}

# Several ranks on one emulated GPU through net_ipc.cu (CUDA IPC: each rank maps its peers' device
# memory from their memfd): DP 2 x ZeRO 0 and 3 (bitwise between the stages), TP 2, PP 2, CP 2, and
# TP 2 x PP 2 on four ranks; DP 2 on two emulated GPUs and over TCP; in
# fp32 against the single emulated GPU within 1e-4 (TP and CP split the GEMMs' and attention's sums
# differently: parameters differ by ~5e-5 after Adam; losses agree to the printed digit)
t_emu_multirank() {
    have_emu || return $?
    local ok=0 d=$WORK/emu_multi l n
    mkdir -p "$d"
    local shape=(--device cuda --dtype fp32 --layers 2 --channels 64 --heads 2 --vocab 256 --seq-len 32 --micro-batch 2 --steps 1
        --lr 1e-3 --train "$DATA/train.bin" --comm-timeout 120)
    $EMU_TRAIN "${shape[@]}" --batch-tokens 128 --log "$d/one.jsonl" --save-model "$d/one.bin" >"$d/one.out" 2>&1 || { tail -n 5 "$d/one.out"; return 1; }
    for l in "dp2z0|--zero 0" "dp2z1|--zero 1" "dp2z2|--zero 2" "dp2z3|--zero 3" "tp2|--tp 2" "pp2|--pp 2" "cp2|--cp 2"; do
        n=${l%%|*}
        $EMU_TRAIN --nproc 2 ${l#*|} "${shape[@]}" --batch-tokens 128 --log "$d/$n.jsonl" --save-model "$d/$n.bin" >"$d/$n.out" 2>&1 ||
            { echo "$n failed:"; tail -n 5 "$d/$n.out"; ok=1; continue; }
    done
    # DP 2 with each rank on its own emulated GPU, and DP 2 over TCP (device memory through pinned staging)
    LLM4D_EMU_DEVICES=2 $EMU_TRAIN --nproc 2 "${shape[@]}" --batch-tokens 128 --log "$d/dp2gpus.jsonl" --save-model "$d/dp2gpus.bin" \
        >"$d/dp2gpus.out" 2>&1 || { echo "dp2 on 2 GPUs failed:"; tail -n 5 "$d/dp2gpus.out"; ok=1; }
    $EMU_TRAIN --nproc 2 --transport tcp "${shape[@]}" --batch-tokens 128 --log "$d/dp2tcp.jsonl" --save-model "$d/dp2tcp.bin" \
        >"$d/dp2tcp.out" 2>&1 || { echo "dp2 over tcp failed:"; tail -n 5 "$d/dp2tcp.out"; ok=1; }
    # each rank sees only its own GPU, as device 0 (CUDA_VISIBLE_DEVICES or Slurm's --gpus-per-task per
    # rank): the peers' memory is on another GPU although the ordinals agree (told apart by UUID)
    LLM4D_EMU_GPU_IDS=local-rank $EMU_TRAIN --nproc 2 --zero 1 "${shape[@]}" --batch-tokens 128 --log "$d/dp2own.jsonl" \
        --save-model "$d/dp2own.bin" >"$d/dp2own.out" 2>&1 || { echo "dp2, a GPU each seen as device 0, failed:"; tail -n 5 "$d/dp2own.out"; ok=1; }
    # four ranks on four emulated GPUs: TP 2 x DP 2 (ZeRO-1)
    LLM4D_EMU_DEVICES=4 $EMU_TRAIN --nproc 4 --tp 2 --zero 1 "${shape[@]}" --batch-tokens 128 --log "$d/tp2dp2.jsonl" \
        --save-model "$d/tp2dp2.bin" >"$d/tp2dp2.out" 2>&1 || { echo "tp2 x dp2 on 4 GPUs failed:"; tail -n 5 "$d/tp2dp2.out"; ok=1; }
    # four ranks on one emulated GPU: TP 2 x PP 2
    $EMU_TRAIN --nproc 4 --tp 2 --pp 2 "${shape[@]}" --batch-tokens 128 --log "$d/tp2pp2.jsonl" --save-model "$d/tp2pp2.bin" \
        >"$d/tp2pp2.out" 2>&1 || { echo "tp2 x pp2 failed:"; tail -n 5 "$d/tp2pp2.out"; ok=1; }
    $PY test/compare_runs.py 1e-4 "$d/one" "$d/dp2z0" "$d/dp2z1" "$d/dp2z2" "$d/dp2z3" "$d/tp2" "$d/pp2" "$d/cp2" "$d/dp2gpus" \
        "$d/dp2tcp" "$d/dp2own" "$d/tp2dp2" "$d/tp2pp2" || ok=1
    for z in 1 2 3; do cmp "$d/dp2z0.bin" "$d/dp2z$z.bin" && echo "ZeRO-$z bitwise ZeRO-0" || ok=1; done
    # four blocks: interleaved PP 2 x V 2, and a 3-D layout, TP 2 x PP 2 x DP 2 (ZeRO-1), eight ranks on one GPU
    local deep=("${shape[@]}" --layers 4 --micro-batch 1 --batch-tokens 128)
    $EMU_TRAIN "${deep[@]}" --log "$d/one4.jsonl" --save-model "$d/one4.bin" >"$d/one4.out" 2>&1 || { tail -n 5 "$d/one4.out"; return 1; }
    $EMU_TRAIN --nproc 2 --pp 2 --pp-virtual 2 "${deep[@]}" --log "$d/pp2v2.jsonl" --save-model "$d/pp2v2.bin" >"$d/pp2v2.out" 2>&1 ||
        { echo "interleaved pp2 x v2 failed:"; tail -n 5 "$d/pp2v2.out"; ok=1; }
    $EMU_TRAIN --nproc 8 --tp 2 --pp 2 --zero 1 "${deep[@]}" --log "$d/3d.jsonl" --save-model "$d/3d.bin" >"$d/3d.out" 2>&1 ||
        { echo "tp2 x pp2 x dp2 failed:"; tail -n 5 "$d/3d.out"; ok=1; }
    # zb-v: the first stage holds the embedding and the head (the tied gradients joined on the device),
    # the last turns round in place (a device copy); --pp-times auto times its passes on the device
    $EMU_TRAIN --nproc 2 --pp 2 --pp-schedule zb-v --pp-times auto "${deep[@]}" --log "$d/zbv.jsonl" --save-model "$d/zbv.bin" >"$d/zbv.out" 2>&1 ||
        { echo "zb-v pp2 failed:"; tail -n 5 "$d/zbv.out"; ok=1; }
    grep -q '^zb-v: the first step measured F, B, W = ' "$d/zbv.out" || { echo "FAIL: zb-v --pp-times auto measured nothing on the device"; ok=1; }
    $PY test/compare_runs.py 1e-4 "$d/one4" "$d/pp2v2" "$d/3d" "$d/zbv" || ok=1
    cmp "$d/dp2z1.bin" "$d/dp2own.bin" && echo "a GPU each (seen as device 0) bitwise one GPU" || ok=1
    return $ok
}

# gemm_check's correctness part on the emulated GPU (--small: the ragged shapes' small ones x 4
# layouts x every epilogue, automatic and forced split-K, against an fp64 reference): the mma.sync
# kernel on an A100, and on an H100 the wgmma kernel too where the sm_90a module is built in
t_emu_gemm_check() {
    have_emu || return $?
    local ok=0 k=mma
    [ -f emu/sm90.cc ] && k=all
    LLM4D_EMU_GPU=a100 ./build/gemm_check-emu --check --small --kernel mma >"$WORK/emu_gemm_a100.log" 2>&1 || ok=1
    LLM4D_EMU_GPU=h100 ./build/gemm_check-emu --check --small --kernel $k >"$WORK/emu_gemm_h100.log" 2>&1 || ok=1
    grep -hE "^(FAIL|device:)|gemm_check:|emu:" "$WORK/emu_gemm_a100.log" "$WORK/emu_gemm_h100.log" | head -n 30
    return $ok
}

# The Llama family on the emulated GPU. A Llama has no --save-model: each run is checkpointed at its
# last step and its model taken from the checkpoint (test/ckpt_model.py), as t_llama_layouts does.
emu_lrun() { # dir name binary flags...
    local d=$1 n=$2 bin=$3; shift 3
    rm -rf "$d/$n.ck"
    $bin "$@" --log "$d/$n.jsonl" --ckpt-dir "$d/$n.ck" --ckpt-every 2 >"$d/$n.out" 2>&1 ||
        { echo "$n failed:"; tail -n 5 "$d/$n.out"; return 1; }
    $PY test/ckpt_model.py "$d/$n.ck/ckpt_00000002" "$d/$n.bin" >/dev/null
}

# ./train --device cuda --model llama3-tiny (GQA: 4 query heads on 2 kv heads, hs 16, untied head) on
# the emulated GPU against --device cpu: fp32 losses and parameters within 1e-4 (as t_emu_train), bf16
# losses within 2e-2, and bf16 with heads of 64 channels on one kv head (the tensor-core flash kernels
# with RoPE fused in); recompute full bitwise --recompute none on the device
t_emu_llama() {
    have_emu || return $?
    local ok=0 d=$WORK/emu_llama dt
    mkdir -p "$d"
    local shape=(--model llama3-tiny --seq-len 32 --micro-batch 2 --steps 2 --lr 1e-3 --train "$DATA/train.bin")
    local wide=(--arch llama --layers 2 --channels 128 --heads 2 --kv-heads 1 --ffn 192 --vocab 256 --max-seq-len 64
        --seq-len 64 --micro-batch 2 --steps 2 --lr 1e-3 --train "$DATA/train.bin" --dtype bf16)
    emu_lrun "$d" cpu_fp32 "$TRAIN" --device cpu "${shape[@]}" --dtype fp32 || return 1
    emu_lrun "$d" emu_fp32 "$EMU_TRAIN" --device cuda "${shape[@]}" --dtype fp32 || return 1
    $PY test/compare_runs.py 1e-4 "$d/cpu_fp32" "$d/emu_fp32" || ok=1
    for dt in bf16 wide; do
        if [ $dt = bf16 ]; then set -- "${shape[@]}" --dtype bf16; else set -- "${wide[@]}"; fi
        $TRAIN --device cpu "$@" --log "$d/cpu_$dt.jsonl" >"$d/cpu_$dt.out" 2>&1 || { tail -n 3 "$d/cpu_$dt.out"; return 1; }
        emu_lrun "$d" "emu_$dt" "$EMU_TRAIN" --device cuda "$@" || return 1
        emu_losses_close 2e-2 "$d/cpu_$dt.jsonl" "$d/emu_$dt.jsonl" || ok=1
    done
    emu_lrun "$d" emu_bf16_full "$EMU_TRAIN" --device cuda "${shape[@]}" --dtype bf16 --recompute full || return 1
    if cmp "$d/emu_bf16.bin" "$d/emu_bf16_full.bin"; then echo "--recompute full: bitwise --recompute none"
    else echo "--recompute full: the model differs from --recompute none"; ok=1; fi
    return $ok
}

# llama3-tiny on several ranks of one emulated GPU (CUDA IPC) against the single emulated GPU, fp32
# within 1e-4: TP 4 (2 kv heads, each on two ranks: their dK, dV summed before the weight gradient),
# PP 2 (the untied head on the last stage), CP 2 (the kv heads' K and V on the ring, RoPE at each zigzag
# chunk's global positions)
t_emu_llama_multirank() {
    have_emu || return $?
    local ok=0 d=$WORK/emu_llama_multi l n
    mkdir -p "$d"
    local shape=(--device cuda --dtype fp32 --model llama3-tiny --seq-len 32 --micro-batch 2 --batch-tokens 128 --steps 2
        --lr 1e-3 --train "$DATA/train.bin" --comm-timeout 120)
    emu_lrun "$d" one "$EMU_TRAIN" "${shape[@]}" || return 1
    for l in "tp4|--nproc 4 --tp 4" "pp2|--nproc 2 --pp 2 --micro-batch 1" "cp2|--nproc 2 --cp 2"; do
        n=${l%%|*}
        # shellcheck disable=SC2086 # the flags split into words
        emu_lrun "$d" "$n" "$EMU_TRAIN" "${shape[@]}" ${l#*|} || { ok=1; continue; }
    done
    $PY test/compare_runs.py 1e-4 "$d/one" "$d/tp4" "$d/pp2" "$d/cp2" || ok=1
    return $ok
}
