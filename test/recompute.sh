# test/recompute.sh: activation recompute (bitwise against --recompute none under every layout family),
# the measured memory per rank against closed forms, and ./train plan --exact against the measurement.
# Sourced by test/run.sh, which provides TRAIN, PY, WORK, DATA and have_torch.

RC_DIR=$WORK/recompute
RC_SHAPE=(--layers 4 --channels 32 --heads 4 --vocab 256 --max-seq-len 64 --seq-len 32 --steps 2 --lr 1e-3 --warmup 1
    --weight-decay 0.1 --comm-timeout 60)
# name | layout and batch flags | recompute modes run (each logs its per-rank memory_peak records)
RC_FAMILIES=(
    "one||--micro-batch 2 --batch-tokens 128|none selective full"
    "bf16||--dtype bf16 --micro-batch 2 --batch-tokens 128|none selective full"
    "dp2z3|--nproc 2 --zero 3|--micro-batch 2 --batch-tokens 256|none selective full"
    "dp2z2|--nproc 2 --zero 2 --bucket-mb 0.02|--micro-batch 2 --batch-tokens 128|none full"
    "dp2z1|--nproc 2 --zero 1|--micro-batch 2 --batch-tokens 256 --steps 4 --ckpt-every 2|none"
    "tp2sp|--nproc 2 --tp 2 --sp|--micro-batch 2 --batch-tokens 128|none selective full"
    "tp2|--nproc 2 --tp 2|--micro-batch 2 --batch-tokens 128|none"
    "pp2|--nproc 2 --pp 2|--micro-batch 2 --batch-tokens 192|none selective full"
    "pp2zb|--nproc 2 --pp 2 --pp-schedule zb-h1|--micro-batch 2 --batch-tokens 192|none selective full"
    "pp2zbv|--nproc 2 --pp 2 --pp-schedule zb-v|--micro-batch 2 --batch-tokens 192|none selective full"
    "pp2v2|--nproc 2 --pp 2 --pp-virtual 2|--micro-batch 1 --batch-tokens 128|none full"
    "3d|--nproc 4 --tp 2 --sp --pp 2 --pp-virtual 2|--dtype bf16 --micro-batch 1 --batch-tokens 128|none full"
    "cp2|--nproc 2 --cp 2|--micro-batch 2 --batch-tokens 128|none selective full"
    "cp2tp2sp|--nproc 4 --tp 2 --sp --cp 2 --zero 3|--micro-batch 2 --batch-tokens 128|none full"
    "b4||--micro-batch 4 --batch-tokens 128|none"
    "t64||--seq-len 64 --micro-batch 2 --batch-tokens 128|none"
    # the collectives' algorithms' own buffers (every communicator's ring staging, the hierarchy's
    # partial sums and output piece) in comm buffers, which plan --exact --algo counts the same
    "dp2z3ring|--nproc 2 --zero 3 --algo ring|--micro-batch 2 --batch-tokens 256|none"
    "dp2z2hier|--nproc 2 --zero 2 --bucket-mb 0.02 --algo hier|--micro-batch 2 --batch-tokens 128|none"
    "3dring|--nproc 4 --tp 2 --sp --pp 2 --algo ring|--micro-batch 1 --batch-tokens 128|none"
    "cp2tp2hier|--nproc 4 --tp 2 --cp 2 --algo hier|--micro-batch 2 --batch-tokens 128|none"
)

# The same families for llama3-tiny (4 blocks, so that PP 2 interleaves), in $RC_LLAMA_DIR: the layouts
# the Llama block trains under (TP 4 puts each of the 2 kv heads on two ranks). Its weights
# stay in checkpoints (llm.c model files are GPT-2 only), so these runs save no model file.
RC_LLAMA_DIR=$WORK/recompute_llama
RC_LLAMA_MODEL=(--model llama3-tiny --layers 4)
RC_LLAMA_SHAPE=("${RC_LLAMA_MODEL[@]}" --seq-len 32 --steps 2 --lr 1e-3 --warmup 1 --weight-decay 0.1 --comm-timeout 60)
RC_LLAMA_FAMILIES=(
    "one||--micro-batch 2 --batch-tokens 128|none selective full"
    "bf16||--dtype bf16 --micro-batch 2 --batch-tokens 128|none full"
    "dp2z3|--nproc 2 --zero 3|--micro-batch 2 --batch-tokens 256|none full"
    "dp2z2|--nproc 2 --zero 2 --bucket-mb 0.02|--micro-batch 2 --batch-tokens 128|none"
    "dp2z1|--nproc 2 --zero 1|--micro-batch 2 --batch-tokens 256 --steps 4 --ckpt-every 2|none"
    "pp2|--nproc 2 --pp 2|--micro-batch 2 --batch-tokens 192|none selective full"
    "pp2v2|--nproc 2 --pp 2 --pp-virtual 2|--micro-batch 1 --batch-tokens 128|none full"
    "tp2sp|--nproc 2 --tp 2 --sp|--micro-batch 2 --batch-tokens 128|none full"
    "tp4|--nproc 4 --tp 4|--micro-batch 2 --batch-tokens 128|none"
    "cp2|--nproc 2 --cp 2|--micro-batch 2 --batch-tokens 128|none full"
)

# Every run of a family list, once, into DIR: DIR/NAME-MODE.{jsonl,out} (and .bin with SAVE 1), and
# DIR/runs.txt listing "NAME MODE RANKS FLAGS..." for the checkers. dp2z1 also writes checkpoints (its
# staging counts as "other"). Usage: rc_family_runs DIR SHAPE-ARRAY FAMILIES-ARRAY SAVE
rc_family_runs() {
    local dir=$1 save=$4
    local -n shape=$2 families=$3
    rm -rf "$dir"
    mkdir -p "$dir"
    local fam name layout batch modes mode args n
    for fam in "${families[@]}"; do
        IFS='|' read -r name layout batch modes <<<"$fam"
        for mode in $modes; do
            read -ra args <<<"$layout $batch"
            n=1
            [[ " $layout " =~ " --nproc "([0-9]+)" " ]] && n=${BASH_REMATCH[1]}
            [ "$name" = dp2z1 ] && args+=(--ckpt-dir "$dir/$name-$mode.ckpt")
            [ "$save" = 1 ] && args+=(--save-model "$dir/$name-$mode.bin")
            timeout 300 $TRAIN "${shape[@]}" "${args[@]}" --train "$DATA/train.bin" --recompute "$mode" \
                --log "$dir/$name-$mode.jsonl" >"$dir/$name-$mode.out" 2>&1 ||
                { echo "$name --recompute $mode failed"; tail -5 "$dir/$name-$mode.out"; return 1; }
            echo "$name $mode $n ${layout//--nproc $n/} $batch" >>"$dir/runs.txt"
        done
    done
}

# Every GPT-2 run above, once (the three tests below share them), in $RC_DIR; dp2z1 is also resumed from
# step 2 under full recompute (NAME-resume).
rc_runs() {
    [ -f "$RC_DIR/done" ] && return 0
    rc_family_runs "$RC_DIR" RC_SHAPE RC_FAMILIES 1 || return 1
    local args
    # checkpoint/resume: the none run's checkpoint of step 2, continued under full recompute
    read -ra args <<<"--nproc 2 --zero 1 --micro-batch 2 --batch-tokens 256 --steps 4"
    cp "$RC_DIR/dp2z1-none.jsonl" "$RC_DIR/dp2z1-resume.jsonl"
    timeout 300 $TRAIN "${RC_SHAPE[@]}" "${args[@]}" --train "$DATA/train.bin" --recompute full \
        --resume "$RC_DIR/dp2z1-none.ckpt/ckpt_00000002" --ckpt-dir "$RC_DIR/dp2z1-resume.ckpt" \
        --log "$RC_DIR/dp2z1-resume.jsonl" --save-model "$RC_DIR/dp2z1-resume.bin" >"$RC_DIR/dp2z1-resume.out" 2>&1 ||
        { echo "the resumed run failed"; tail -5 "$RC_DIR/dp2z1-resume.out"; return 1; }
    touch "$RC_DIR/done"
}

# Recompute changes no bit: under each layout family (one rank fp32 and bf16, DP x ZeRO-2 streaming and
# ZeRO-3 gathers, TP + SP, PP plain and interleaved, TP x SP x interleaved PP in bf16, CP alone and with
# TP x SP x ZeRO-3 (full recompute runs the ring again), a checkpoint resumed under another mode) every mode's losses and final model file equal --recompute none's, byte for byte;
# and ZeRO-3 gathers no more units per step (the rebuild uses the weights gathered for the backward).
t_recompute() {
    rc_runs || return 1
    local ok=0 fam name layout batch modes mode
    losses() { grep -o '"step":[0-9]*,"tokens":[0-9]*,"loss":[^,]*' "$1"; }
    for fam in "${RC_FAMILIES[@]}"; do
        IFS='|' read -r name layout batch modes <<<"$fam"
        for mode in $modes; do
            [ "$mode" = none ] && continue
            if cmp -s "$RC_DIR/$name-none.bin" "$RC_DIR/$name-$mode.bin" &&
                diff <(losses "$RC_DIR/$name-none.jsonl") <(losses "$RC_DIR/$name-$mode.jsonl") >/dev/null; then
                echo "ok $name: --recompute $mode is bitwise --recompute none"
            else
                echo "FAIL $name: --recompute $mode differs from --recompute none"
                ok=1
            fi
        done
    done
    grep -q "^resumed from $RC_DIR/dp2z1-none.ckpt/ckpt_00000002: step 2" "$RC_DIR/dp2z1-resume.out" || { echo "dp2z1 did not resume"; ok=1; }
    if cmp -s "$RC_DIR/dp2z1-none.bin" "$RC_DIR/dp2z1-resume.bin" &&
        diff <(losses "$RC_DIR/dp2z1-none.jsonl") <(losses "$RC_DIR/dp2z1-resume.jsonl") >/dev/null; then
        echo "ok dp2z1: resumed from step 2 under --recompute full, bitwise the uninterrupted --recompute none run"
    else
        echo "FAIL dp2z1: the run resumed under --recompute full differs"
        ok=1
    fi
    local g
    for mode in none selective full; do
        g=$(grep -o '"zero3_gathers":[0-9]*' "$RC_DIR/dp2z3-$mode.jsonl" | sort -u | tr '\n' ' ')
        echo "ZeRO-3 gathers per step, --recompute $mode: $g"
        [ "$g" = "$(grep -o '"zero3_gathers":[0-9]*' "$RC_DIR/dp2z3-none.jsonl" | sort -u | tr '\n' ' ')" ] && [ -n "$g" ] ||
            { echo "FAIL: --recompute $mode changes the ZeRO-3 gathers"; ok=1; }
    done
    return $ok
}

# The peak activation and recompute memory of every rank of every run against llm4d's activation
# inventory written out independently (test/memory_check.py), which also shows that it falls as it should
# with recompute, TP, SP, PP, the micro-batch size and the sequence length.
t_memory_formulas() {
    rc_runs || return 1
    $PY test/memory_check.py formulas "$RC_DIR" "$TRAIN"
}

# ./train plan --exact (llm4d's buffers built dry for the layout) predicts every rank's measured peak per
# category within 5%, for GPT-2 and for llama3-tiny; the runs under --algo ring and hier with plan
# --exact --algo (comm buffers then hold each communicator's staging: 2 MiB a ring, 6 MiB a hierarchy of
# 2 on one node).
t_plan_exact() {
    rc_runs || return 1
    $PY test/memory_check.py exact "$RC_DIR" "$TRAIN" || return 1
    rc_family_runs "$RC_LLAMA_DIR" RC_LLAMA_SHAPE RC_LLAMA_FAMILIES 0 || return 1
    $PY test/memory_check.py exact "$RC_LLAMA_DIR" "$TRAIN" "${RC_LLAMA_MODEL[@]}" || return 1
    # zb-v's lists built for pass times (--pp-times) hold another pool of sets than the unit lists at
    # PP 4, M 4 (the first stages fewer): plan --exact follows them
    local zshape=(--layers 8 --channels 32 --heads 4 --vocab 256 --max-seq-len 64) zdir=$WORK/plan_zbv_times
    local zfam=("pp4zbvt|--nproc 4 --pp 4 --pp-schedule zb-v --pp-times 1,0.5,0.2|--micro-batch 1 --batch-tokens 128|none")
    local zrun=("${zshape[@]}" --seq-len 32 --steps 2 --lr 1e-3 --comm-timeout 60)
    rc_family_runs "$zdir" zrun zfam 0 || return 1
    $PY test/memory_check.py exact "$zdir" "$TRAIN" "${zshape[@]}" || return 1
    local a b plan=($TRAIN plan "${zshape[@]}" --seq-len 32 --gpus 4 --pp 4 --batch-tokens 128 --micro-batches 4 --exact --device cpu
        --dtype fp32 --pp-schedule zb-v --json)
    a=$("${plan[@]}" --pp-times unit | $PY -c 'import json, sys; print([s["activations"] for s in json.load(sys.stdin)["layouts"][0]["exact"]["stages"]])')
    b=$("${plan[@]}" --pp-times 1,0.5,0.2 | $PY -c 'import json, sys; print([s["activations"] for s in json.load(sys.stdin)["layouts"][0]["exact"]["stages"]])')
    [ -n "$a" ] && [ "$a" != "$b" ] || { echo "FAIL: plan --exact zb-v counts the same sets with and without --pp-times ($a)"; return 1; }
    echo "ok zb-v PP 4 M 4 activations per stage: unit lists $a, lists for --pp-times 1,0.5,0.2 $b (plan --exact = measured)"
}
