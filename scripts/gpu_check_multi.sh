# gpu_check_multi.sh: the multi-rank sections of scripts/gpu_check.sh (sourced by it; uses its LOG,
# DATA, tmo, compare_losses, prepare_data, BUILD_OK and DATA_OK). Several ranks share the one GPU
# over CUDA IPC (net_ipc.cu), the only multi-rank case a one-GPU machine can run:
#   collectives  build/test_comm --device cuda on 2 and 4 ranks: every collective, type, count and
#                placement against the serial reference, bitwise (the device's reductions must equal
#                the host's); then over TCP with pinned staging on 2 ranks (--quick)
#   layouts      5 bf16 steps of a small model: DP 2, TP 2, PP 2, PP 2 interleaved, CP 2, TP 2 x DP 2,
#                PP 2 x DP 2 and CP 2 x DP 2 against the single-GPU run (losses within 2e-2), and DP 2
#                with ZeRO 1, 2 and 3 bitwise equal (saved model) to ZeRO 0
#   bench        ./train bench-comm --buffers device, all-reduce 2 and 4 ranks, 1 MiB to 256 MiB; the
#                device-to-device copy bandwidth it prints first is the comparator (busbw of ranks
#                sharing one GPU is a memory-bandwidth figure)
# Expected worst case, about 170 s together on one H200.

check_multi_collectives() {
    [ "$BUILD_OK" -eq 1 ] || { echo "build failed"; return 1; }
    make build/test_comm-cuda > "$LOG/test_comm_build.log" 2>&1 || { tail -n 20 "$LOG/test_comm_build.log"; return 1; }
    local n ok=0
    for n in 2 4; do
        timeout "$(tmo 120)" ./build/test_comm-cuda --nproc $n --device cuda --comm-timeout 60 > "$LOG/test_comm_cuda_$n.log" 2>&1 ||
            { tail -n 5 "$LOG/test_comm_cuda_$n.log"; ok=1; }
        tail -n 1 "$LOG/test_comm_cuda_$n.log"
    done
    timeout "$(tmo 60)" ./build/test_comm-cuda --nproc 2 --device cuda --transport tcp --quick --comm-timeout 60 \
        > "$LOG/test_comm_cuda_tcp.log" 2>&1 || { tail -n 5 "$LOG/test_comm_cuda_tcp.log"; ok=1; }
    tail -n 1 "$LOG/test_comm_cuda_tcp.log"
    return $ok
}

check_multi_layouts() {
    [ "$BUILD_OK" -eq 1 ] || { echo "build failed"; return 1; }
    if [ "$DATA_OK" -ne 1 ]; then prepare_data || return 1; fi
    local ok=0 name
    # 4 heads of 32 channels (divisible by TP 2), 4 layers (PP 2 interleaved: 2 chunks of 1 layer per stage),
    # 4 sequences of 128 per step whatever the layout (CP 2: 4 chunks of 32 positions)
    local shape=(--device cuda --dtype bf16 --layers 4 --channels 128 --heads 4 --vocab 256 --seq-len 128 --micro-batch 1
        --batch-tokens 512 --steps 5 --lr 1e-3 --train "$DATA/train.bin")
    timeout "$(tmo 60)" ./train "${shape[@]}" --log "$LOG/multi_single.jsonl" --save-model "$LOG/multi_single.bin" \
        > "$LOG/multi_single.log" 2>&1 || { tail -n 3 "$LOG/multi_single.log"; return 1; }
    for run in "dp2 --nproc 2" "tp2 --nproc 2 --tp 2" "pp2 --nproc 2 --pp 2" "pp2i --nproc 2 --pp 2 --pp-virtual 2" \
        "cp2 --nproc 2 --cp 2" "tp2dp2 --nproc 4 --tp 2" "pp2dp2 --nproc 4 --pp 2" "cp2dp2 --nproc 4 --cp 2"; do
        set -- $run
        name=$1
        shift
        echo "--- $name: $*"
        timeout "$(tmo 90)" ./train "${shape[@]}" "$@" --log "$LOG/multi_$name.jsonl" > "$LOG/multi_$name.log" 2>&1 ||
            { tail -n 3 "$LOG/multi_$name.log"; ok=1; continue; }
        compare_losses "$LOG/multi_single.jsonl" "$LOG/multi_$name.jsonl" 2e-2 || ok=1
    done
    local z
    for z in 0 1 2 3; do
        timeout "$(tmo 60)" ./train "${shape[@]}" --nproc 2 --zero $z --bucket-mb 0.02 --log "$LOG/multi_zero$z.jsonl" \
            --save-model "$LOG/multi_zero$z.bin" > "$LOG/multi_zero$z.log" 2>&1 || { tail -n 3 "$LOG/multi_zero$z.log"; ok=1; continue; }
        if [ "$z" -gt 0 ]; then
            if cmp -s "$LOG/multi_zero0.bin" "$LOG/multi_zero$z.bin"; then echo "zero $z: bitwise equal to zero 0"
            else echo "zero $z: the saved model differs from zero 0's"; ok=1; fi
        fi
    done
    return $ok
}

check_multi_bench() {
    [ "$BUILD_OK" -eq 1 ] || { echo "build failed"; return 1; }
    local n ok=0
    for n in 2 4; do
        timeout "$(tmo 90)" ./train bench-comm --nproc $n --buffers device --op allreduce --min-bytes 1M --max-bytes 256M \
            > "$LOG/bench_comm_ipc_$n.log" 2>&1 || { tail -n 5 "$LOG/bench_comm_ipc_$n.log"; ok=1; continue; }
        cat "$LOG/bench_comm_ipc_$n.log"
        {
            echo "### all-reduce, $n ranks on one GPU (CUDA IPC)"
            echo
            echo '```'
            cat "$LOG/bench_comm_ipc_$n.log"
            echo '```'
            echo
        } >> "$LOG/comm_table.md"
    done
    return $ok
}
