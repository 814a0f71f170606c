# test/ckpt.sh: checkpoints, restarts, bad checkpoints, the directory lock, the data fingerprint, the manifest's field
# checks, loss spikes, stragglers and safe files.
# Sourced by test/run.sh, which provides TRAIN, ASAN, PY, WORK, DATA, have_torch and expect_error.

CK=(--layers 4 --channels 32 --heads 4 --vocab 256 --seq-len 32 --micro-batch 1 --lr 1e-3 --warmup 2 --weight-decay 0.1
    --bucket-mb 0.01 --comm-timeout 60)

same_losses() { # A.jsonl B.jsonl: the per-step losses, byte for byte
    diff <(grep -o '"step":[0-9]*,"loss":[^,]*' "$1") <(grep -o '"step":[0-9]*,"loss":[^,]*' "$2") >/dev/null
}

# Bitwise resume: under each layout, a run of 6 steps that checkpoints every 2, and a run resumed from its
# checkpoint of step 2 (writing into another directory), give the same losses and the same model file.
t_ckpt_resume() {
    local d=$WORK/ckr ok=0 i=0 layout
    mkdir -p "$d"
    for layout in "" "--nproc 2 --zero 0" "--nproc 2 --zero 1" "--nproc 2 --zero 2" "--nproc 2 --zero 3" "--nproc 2 --tp 2 --sp" \
        "--nproc 2 --pp 2" "--nproc 2 --pp 2 --pp-virtual 2" "--nproc 2 --cp 2 --zero 2" \
        "--nproc 8 --tp 2 --pp 2 --pp-virtual 2 --zero 3"; do
        i=$((i + 1))
        local a=$d/$i args
        read -ra args <<<"$layout"
        args+=("${CK[@]}" --train "$DATA/train.bin" --batch-tokens 256 --steps 6)
        timeout 300 $TRAIN "${args[@]}" --ckpt-dir "$a.c1" --ckpt-every 2 --log "$a.a.jsonl" --save-model "$a.a.bin" >"$a.out" 2>&1 ||
            { echo "'$layout': the first run failed"; tail -5 "$a.out"; return 1; }
        cp "$a.a.jsonl" "$a.b.jsonl"
        timeout 300 $TRAIN "${args[@]}" --resume "$a.c1/ckpt_00000002" --ckpt-dir "$a.c2" --log "$a.b.jsonl" \
            --save-model "$a.b.bin" >>"$a.out" 2>&1 || { echo "'$layout': the resumed run failed"; tail -5 "$a.out"; return 1; }
        grep -q "^resumed from $a.c1/ckpt_00000002: step 2" "$a.out" || { echo "'$layout': did not resume"; ok=1; }
        grep -q "^note: --seed" "$a.out" && { echo "'$layout': a note on the seed, which did not change"; ok=1; }
        if cmp -s "$a.a.bin" "$a.b.bin" && same_losses "$a.a.jsonl" "$a.b.jsonl"; then
            echo "ok '${layout:-one rank}': resumed bitwise"
        else
            echo "FAIL '${layout:-one rank}': the resumed run differs"
            ok=1
        fi
    done
    return $ok
}

# The first boundary of a resumed run: it validates and samples where the checkpoint's run did not
# before writing (the manifest's boundary.validated and boundary.sampled), and not again where it did.
# Reference: an uninterrupted run with the resumed run's flags, whose step-2 validation and sample the
# resumed run must print bitwise (the same model at step 2, the same data, the sampler a function of
# seed and step).
t_ckpt_boundary() {
    local d=$WORK/ckb ok=0
    rm -rf "$d" && mkdir -p "$d"
    local S=("${CK[@]}" --train "$DATA/train.bin" --batch-tokens 64 --steps 4)
    local E=(--val "$DATA/val.bin" --val-every 2 --val-steps 2 --sample-every 2 --sample-tokens 6)
    timeout 300 $TRAIN "${S[@]}" "${E[@]}" --log "$d/ref.jsonl" >"$d/ref.out" 2>&1 || { echo "FAIL: the reference run"; return 1; }
    # written without --val or --sample-every, resumed with them: step 2 is validated and sampled now
    timeout 300 $TRAIN "${S[@]}" --ckpt-dir "$d/a" --ckpt-every 2 >/dev/null 2>&1 || { echo "FAIL: the first run"; return 1; }
    grep -q '"validated": false' "$d/a/ckpt_00000002/manifest.json" && grep -q '"sampled": false' "$d/a/ckpt_00000002/manifest.json" ||
        { echo "FAIL: the manifest of a run without --val says it validated: $(grep -A3 boundary "$d/a/ckpt_00000002/manifest.json")"; ok=1; }
    timeout 300 $TRAIN "${S[@]}" "${E[@]}" --resume "$d/a/ckpt_00000002" --ckpt-dir "$d/a2" --log "$d/a.jsonl" >"$d/a.out" 2>&1 ||
        { echo "FAIL: the resumed run"; return 1; }
    diff <(grep val_loss "$d/ref.jsonl" | grep -v '"step":0,') <(grep val_loss "$d/a.jsonl") >/dev/null ||
        { echo "FAIL: the resumed run's validations differ from the reference's:"; grep val_loss "$d/ref.jsonl" "$d/a.jsonl"; ok=1; }
    local want got
    want=$(sed -n '/^sample at step 2:/,/^---$/p' "$d/ref.out") got=$(sed -n '/^sample at step 2:/,/^---$/p' "$d/a.out")
    [ -n "$want" ] && [ "$want" = "$got" ] || { echo "FAIL: the step-2 sample: '$got', the reference's '$want'"; ok=1; }
    # written with them, resumed with them: step 2 is not done twice
    timeout 300 $TRAIN "${S[@]}" "${E[@]}" --ckpt-dir "$d/b" --ckpt-every 2 --log "$d/b.jsonl" >/dev/null 2>&1 || { echo "FAIL: run b"; return 1; }
    grep -q '"validated": true' "$d/b/ckpt_00000002/manifest.json" && grep -q '"sampled": true' "$d/b/ckpt_00000002/manifest.json" ||
        { echo "FAIL: the manifest does not say step 2 was validated and sampled"; ok=1; }
    timeout 300 $TRAIN "${S[@]}" "${E[@]}" --resume "$d/b/ckpt_00000002" --ckpt-dir "$d/b2" --log "$d/b.jsonl" >"$d/b.out" 2>&1 ||
        { echo "FAIL: resumed run b"; return 1; }
    grep -q "^sample at step 2:" "$d/b.out" && { echo "FAIL: step 2 sampled again"; ok=1; }
    # a stop signal during the sample of step 2: the run stops there (exit 0, a checkpoint recording the
    # sample as not done), and the resumed run prints that sample whole, ending as the reference did
    LLM4D_FAULT="rank=0,step=2,at=sigterm-sample" timeout 300 $TRAIN "${S[@]}" "${E[@]}" --ckpt-dir "$d/s" --log "$d/s.jsonl" \
        >"$d/s.out" 2>&1 || { echo "FAIL: the run stopped during its sample: exit $?: $(tail -2 "$d/s.out")"; return 1; }
    grep -q "^received SIGTERM during the sample: stopping cleanly after 2 of 4 steps, with a checkpoint; the resumed run prints the sample" \
        "$d/s.out" && grep -q '"sampled": false' "$d/s/ckpt_00000002/manifest.json" || { echo "FAIL: $(grep -i 'received\|stopping' "$d/s.out")"; ok=1; }
    timeout 300 $TRAIN "${S[@]}" "${E[@]}" --ckpt-dir "$d/s" --resume --log "$d/s.jsonl" >"$d/s2.out" 2>&1 || { echo "FAIL: its resume"; return 1; }
    got=$(sed -n '/^sample at step 2:/,/^---$/p' "$d/s2.out")
    [ "$want" = "$got" ] || { echo "FAIL: the resumed step-2 sample: '$got', the reference's '$want'"; ok=1; }
    same_losses "$d/ref.jsonl" "$d/s.jsonl" && diff <(grep val_loss "$d/ref.jsonl") <(grep val_loss "$d/s.jsonl") >/dev/null ||
        { echo "FAIL: the stopped and resumed run's log differs from the reference's"; ok=1; }
    # a manifest written before the boundary section: read as both done (the behaviour then), not refused
    $PY test/ckpt_craft.py "$d/b/ckpt_00000002" "$d/old/ckpt_00000002" -boundary || return 1
    timeout 300 $TRAIN "${S[@]}" "${E[@]}" --resume "$d/old/ckpt_00000002" --ckpt-dir "$d/old2" >"$d/old.out" 2>&1 ||
        { echo "FAIL: a manifest without the boundary section: $(tail -2 "$d/old.out")"; return 1; }
    grep -q "^sample at step 2:\|^step 2 | val loss" "$d/old.out" && { echo "FAIL: an older manifest's step 2 done again"; ok=1; }
    diff <(grep val_loss "$d/ref.jsonl") <(grep val_loss "$d/b.jsonl") >/dev/null ||
        { echo "FAIL: run b's log (resumed into it) differs from the reference's:"; grep val_loss "$d/b.jsonl"; ok=1; }
    return $ok
}

# Re-sharding: a checkpoint of step 4 written under one layout, continued under another to step 8, equals
# the uninterrupted single-rank run (losses of all 8 steps and final parameters within 1e-5).
t_ckpt_reshard() {
    have_torch || return $?
    local d=$WORK/ckrs ok=0 i=0 pair
    mkdir -p "$d"
    local S=("${CK[@]}" --layers 8 --train "$DATA/train.bin" --batch-tokens 128 --steps 8)
    $TRAIN "${S[@]}" --log "$d/ref.jsonl" --save-model "$d/ref.bin" >/dev/null || return 1
    local runs=()
    for pair in "--nproc 4 --zero 3|--nproc 4 --tp 2 --pp 2" "--nproc 4 --tp 2 --zero 1|" "|--nproc 4 --pp 4 --pp-virtual 2" \
        "--nproc 8 --tp 2 --pp 2 --zero 3 --sp|--nproc 2 --zero 2" "--nproc 4 --pp 2 --pp-virtual 2 --zero 1|--nproc 4 --tp 4 --sp" \
        "--nproc 4 --cp 2 --pp 2 --pp-virtual 2 --zero 1|" "|--nproc 4 --cp 2 --tp 2 --zero 3"; do
        i=$((i + 1))
        local from to
        read -ra from <<<"${pair%|*}"
        read -ra to <<<"${pair#*|}"
        timeout 300 $TRAIN "${from[@]}" "${S[@]}" --ckpt-dir "$d/c$i" --ckpt-every 4 --log "$d/r$i.jsonl" >"$d/r$i.out" 2>&1 ||
            { echo "'${pair%|*}' failed"; tail -5 "$d/r$i.out"; return 1; }
        timeout 300 $TRAIN "${to[@]}" "${S[@]}" --resume "$d/c$i/ckpt_00000004" --log "$d/r$i.jsonl" --save-model "$d/r$i.bin" \
            >>"$d/r$i.out" 2>&1 || { echo "'${pair#*|}' from '${pair%|*}' failed"; tail -5 "$d/r$i.out"; return 1; }
        echo "$i: '${pair%|*}' -> '${pair#*|}'"
        runs+=("$d/r$i")
    done
    $PY test/compare_runs.py 1e-5 "$d/ref" "${runs[@]}"
}

# The documented format, read without this project: test/ckpt_reader.py (numpy, zlib) checks the
# checksums, puts the full tensors together from the runs of every shard and compares the master weights
# with --save-model's file, for a 3D layout with ZeRO-3 and for TP 3 (the vocabulary padded internally).
t_ckpt_reader() {
    have_torch || return $?
    local d=$WORK/ckrd
    mkdir -p "$d"
    timeout 300 $TRAIN --nproc 8 --tp 2 --pp 2 --zero 3 "${CK[@]}" --vocab 200 --train "$DATA/train.bin" --batch-tokens 256 \
        --steps 3 --ckpt-dir "$d/a" --save-model "$d/a.bin" >"$d/a.out" 2>&1 || { tail -5 "$d/a.out"; return 1; }
    $PY test/ckpt_reader.py "$d/a/ckpt_00000003" "$d/a.bin" || return 1
    timeout 300 $TRAIN --nproc 6 --tp 3 --pp 2 --zero 1 --layers 2 --channels 48 --heads 6 --vocab 200 --seq-len 48 \
        --micro-batch 1 --batch-tokens 96 --steps 2 --comm-timeout 60 --train "$DATA/train.bin" --ckpt-dir "$d/b" \
        --save-model "$d/b.bin" >"$d/b.out" 2>&1 || { tail -5 "$d/b.out"; return 1; }
    $PY test/ckpt_reader.py "$d/b/ckpt_00000002" "$d/b.bin"
}

# Automatic restart: 10 rank deaths at seeded random steps and ranks, over three layouts (one of them
# killed halfway through writing its checkpoint shard), under --max-restarts; each run's final model
# and losses equal the uninterrupted run's, byte for byte, and no temporary is left behind.
t_ckpt_restarts() {
    local d=$WORK/ckrst ok=0 i=0 plan layout deaths faults
    mkdir -p "$d"
    # within a run the steps increase, so that each fault fires after the relaunch before it resumed
    plan=$($PY - <<'EOF'
import random
random.seed(11)
for layout, deaths in (("--nproc 4 --zero 1", 4), ("--nproc 4 --tp 2 --pp 2", 3), ("--nproc 4 --pp 2 --pp-virtual 2 --zero 3", 3)):
    items = []
    for launch, step in enumerate(sorted(random.sample(range(2, 12), deaths))):
        at = ",at=ckpt-write" if "zero 3" in layout and launch == deaths - 1 else ""
        items.append(f"rank={random.randrange(4)},step={step},launch={launch}{at}")
    print(f"{layout}|{deaths}|{';'.join(items)}")
EOF
    )
    while IFS='|' read -r layout deaths faults; do
        i=$((i + 1))
        local args
        read -ra args <<<"$layout"
        args+=("${CK[@]}" --train "$DATA/train.bin" --batch-tokens 128 --steps 12 --comm-timeout 20)
        timeout 300 $TRAIN "${args[@]}" --log "$d/ref$i.jsonl" --save-model "$d/ref$i.bin" >"$d/ref$i.out" 2>&1 || return 1
        LLM4D_FAULT="$faults" timeout 600 $TRAIN "${args[@]}" --ckpt-dir "$d/c$i" --ckpt-every 1 --max-restarts "$deaths" \
            --log "$d/f$i.jsonl" --save-model "$d/f$i.bin" >"$d/f$i.out" 2>&1
        local rc=$? restarts
        restarts=$(grep -c "^restart [0-9]* of $deaths: the job failed" "$d/f$i.out")
        echo "'$layout' with LLM4D_FAULT='$faults': exit status $rc, $restarts restart(s)"
        if [ $rc -ne 0 ] || [ "$restarts" -ne "$deaths" ]; then
            echo "FAIL: expected $deaths restarts and success"
            grep -v '^step\|^memory' "$d/f$i.out" | tail -20
            ok=1
            continue
        fi
        cmp "$d/ref$i.bin" "$d/f$i.bin" || { echo "FAIL: the model differs from the uninterrupted run's"; ok=1; }
        same_losses "$d/ref$i.jsonl" "$d/f$i.jsonl" || { echo "FAIL: the losses differ"; ok=1; }
        [ -z "$(find "$d/c$i" -name '*.tmp.*')" ] || { echo "FAIL: temporaries left: $(find "$d/c$i" -name '*.tmp.*')"; ok=1; }
    done <<<"$plan"
    # llm.c's -e FILE is --init-from: the relaunch that resumes drops it as it drops --init-from (it
    # kept it, and the resumed launch refused --init-from with --resume)
    $TRAIN "${CK[@]}" --steps 0 --save-model "$d/init.bin" >/dev/null || return 1
    local E=(--nproc 2 -e "$d/init.bin" --seq-len 32 --micro-batch 1 --lr 1e-3 --train "$DATA/train.bin" --batch-tokens 128 --steps 8
        --comm-timeout 20)
    timeout 300 $TRAIN "${E[@]}" --save-model "$d/eref.bin" >/dev/null 2>&1 || return 1
    LLM4D_FAULT="rank=1,step=6" timeout 600 $TRAIN "${E[@]}" --ckpt-dir "$d/ce" --ckpt-every 2 --max-restarts 1 --save-model "$d/e.bin" \
        >"$d/e.out" 2>&1 || { echo "FAIL: -e FILE under --max-restarts: exit status $?"; tail -3 "$d/e.out"; ok=1; }
    cmp "$d/eref.bin" "$d/e.bin" || { echo "FAIL: -e FILE restarted: the model differs from the uninterrupted run's"; ok=1; }
    return $ok
}

# Bad checkpoints: a flipped byte, a truncated shard, a missing shard, a missing manifest in the newest
# checkpoint are each reported in one line naming the file, and the one before it is used (the final
# model then equals the uninterrupted run's); --keep 2 kept only the newest two; incompatible
# checkpoints and a used --ckpt-dir without --resume are refused in one line.
t_ckpt_bad() {
    local d=$WORK/ckbad ok=0 case f
    mkdir -p "$d"
    local S=(--nproc 2 "${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64 --steps 6)
    timeout 300 $TRAIN "${S[@]}" --ckpt-dir "$d/c" --ckpt-every 2 --keep 2 --save-model "$d/ref.bin" >"$d/ref.out" 2>&1 || return 1
    [ "$(ls -I llm4d.lock "$d/c")" = "$(printf 'ckpt_00000004\nckpt_00000006')" ] || { echo "FAIL --keep 2 left: $(ls -I llm4d.lock "$d/c")"; ok=1; }
    for case in flip truncate shard manifest; do
        rm -rf "$d/$case"
        cp -r "$d/c" "$d/$case"
        f=$d/$case/ckpt_00000006/rank_00001.safetensors
        case $case in
        flip) printf '\xff' | dd of="$f" bs=1 seek=100000 conv=notrunc 2>/dev/null ;;
        truncate) truncate -s 100000 "$f" ;;
        shard) rm "$f" ;;
        manifest) f=$d/$case/ckpt_00000006/manifest.json; rm "$f" ;;
        esac
        timeout 300 $TRAIN "${S[@]}" --ckpt-dir "$d/$case" --resume --save-model "$d/$case.bin" >"$d/$case.out" 2>"$d/$case.err"
        local rc=$? warn
        warn=$(grep -c . "$d/$case.err")
        echo "$case: $(cat "$d/$case.err")"
        if [ $rc -ne 0 ] || [ "$warn" -ne 1 ] || ! grep -q "^warning: checkpoint unusable: $f: " "$d/$case.err" ||
            ! grep -q "^resumed from $d/$case/ckpt_00000004: step 4" "$d/$case.out" || ! cmp -s "$d/ref.bin" "$d/$case.bin"; then
            echo "FAIL $case: expected one warning naming $f, the checkpoint of step 4 used, and the same model"
            ok=1
        fi
    done
    expect_error "holds another model shape (layers 2, channels 32, heads 4, max seq len 32, padded vocabulary 256; this run: 3," "${S[@]:2}" \
        --layers 3 --resume "$d/c/ckpt_00000004" || ok=1
    expect_error "holds a model with a vocabulary of 256, this run's has 300" "${S[@]:2}" --vocab 300 --resume "$d/c/ckpt_00000004" || ok=1
    expect_error "trained with --seq-len 32 --batch-tokens 64, this run has 32 and 128" "${S[@]:2}" --batch-tokens 128 \
        --resume "$d/c/ckpt_00000004" || ok=1
    cp -r "$d/c/ckpt_00000006" "$d/given" # --resume PATH: no other checkpoint is tried
    printf '\xff' | dd of="$d/given/rank_00000.safetensors" bs=1 seek=1000 conv=notrunc 2>/dev/null
    expect_error "resume: $d/given/rank_00000.safetensors: checksum mismatch" "${S[@]:2}" --resume "$d/given" || ok=1
    expect_error "ckpt-dir $d/c already holds checkpoints (the newest of step 6): pass --resume" "${S[@]:2}" --ckpt-dir "$d/c" || ok=1
    # the only checkpoint unusable: said so, not "trying the one before it"; refused, exit 1
    rm -rf "$d/only" && mkdir "$d/only" && cp -r "$d/c/ckpt_00000006" "$d/only/" || return 1
    truncate -s 1000 "$d/only/ckpt_00000006/rank_00000.safetensors"
    timeout 300 $TRAIN "${S[@]}" --ckpt-dir "$d/only" --resume >/dev/null 2>"$d/only.err" && { echo "FAIL: resumed from nothing"; ok=1; }
    grep -q "^warning: checkpoint unusable: .*; there is none before it$" "$d/only.err" || { echo "FAIL only: $(cat "$d/only.err")"; ok=1; }
    # links: a checkpoint moved to other storage and linked back is resumed from; a link named as a newer
    # one to a directory without a manifest (an incomplete one) is removed, never what it points to (that
    # emptied the directory); a name ckpt_path never writes is left alone
    rm -rf "$d/links" "$d/precious" "$d/store" && cp -r "$d/c" "$d/links" && mkdir "$d/precious" "$d/store" "$d/links/ckpt_+0000009" &&
        echo notes >"$d/precious/notes.txt" && ln -s ../precious "$d/links/ckpt_00000008" &&
        mv "$d/links/ckpt_00000006" "$d/store/" && ln -s ../store/ckpt_00000006 "$d/links/ckpt_00000006" || return 1
    timeout 300 $TRAIN "${S[@]}" --steps 7 --ckpt-dir "$d/links" --resume >"$d/links.out" 2>&1 || { echo "FAIL links: $(tail -3 "$d/links.out")"; ok=1; }
    grep -q "^resumed from $d/links/ckpt_00000006: step 6" "$d/links.out" || { echo "FAIL links: did not resume from the linked step 6"; ok=1; }
    [ "$(cat "$d/precious/notes.txt" 2>/dev/null)" = notes ] && [ ! -e "$d/links/ckpt_00000008" ] && [ -d "$d/links/ckpt_+0000009" ] ||
        { echo "FAIL: the link's target or the odd name was touched: $(grep removed "$d/links.out")"; ok=1; }
    return $ok
}

# A full disk during a save (a small tmpfs): the checkpoint is given up with a warning, the previous
# one stays intact, no temporary is left, the run goes on to its end, where it exits 1 saying that its
# last checkpoint failed; resuming from the survivor gives the uninterrupted run's model.
t_ckpt_full_disk() {
    [ "$(id -u)" -eq 0 ] || { echo "not root: cannot mount a small tmpfs"; return 77; }
    local d=$WORK/ckfull
    mkdir -p "$d/mnt"
    local S=(--nproc 2 "${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64 --steps 6)
    timeout 300 $TRAIN "${S[@]}" --ckpt-dir "$d/probe" --ckpt-every 6 --save-model "$d/ref.bin" >/dev/null 2>&1 || return 1
    local bytes
    bytes=$(cat "$d"/probe/ckpt_00000006/* | wc -c) # room for one checkpoint, not for another rank's shard besides
    mount -t tmpfs -o size=$((bytes * 5 / 4)) llm4d-test "$d/mnt" 2>/dev/null || { echo "cannot mount a tmpfs here"; return 77; }
    local rc=0
    # every checkpoint after the first fails, the last one included: the run trains to its end and exits 1,
    # its last line saying that the last checkpoint was not written
    timeout 300 $TRAIN "${S[@]}" --ckpt-dir "$d/mnt/c" --ckpt-every 2 >"$d/out" 2>"$d/err"
    local st=$?
    cat "$d/err"
    [ $st -eq 1 ] || { echo "FAIL: exit status $st with the last checkpoint unwritten (expected 1)"; rc=1; }
    grep -q '^step    6/6 ' "$d/out" || { echo "FAIL: the run did not train to its end"; rc=1; }
    tail -n 1 "$d/err" | grep -q "^error: the last checkpoint (step 6, $d/mnt/c/ckpt_00000006) could not be written (rank [01]: .*No space left on device): the run ends with an error" ||
        { echo "FAIL: the last line does not say that the last checkpoint failed"; rc=1; }
    grep -q "^warning: the checkpoint of step 4 was not written (rank [01]: cannot write $d/mnt/c/ckpt_00000004/rank_0000[01].safetensors: No space left on device); training goes on" "$d/err" ||
        { echo "FAIL: no warning for the checkpoint of step 4"; rc=1; }
    [ "$(ls -I llm4d.lock "$d/mnt/c")" = ckpt_00000002 ] || { echo "FAIL: left in the tmpfs: $(ls -I llm4d.lock "$d/mnt/c")"; rc=1; }
    [ -z "$(find "$d/mnt" -name '*.tmp.*')" ] || { echo "FAIL: temporaries left"; rc=1; }
    # (its own last checkpoint has no room either: it exits 1 too, with the model saved)
    timeout 300 $TRAIN "${S[@]}" --ckpt-dir "$d/mnt/c" --resume --save-model "$d/resumed.bin" >"$d/out2" 2>&1
    st=$?
    [ $st -eq 1 ] && tail -n 1 "$d/out2" | grep -q "^error: the last checkpoint (step 6, .*its model is in --save-model$" ||
        { echo "FAIL: the resumed run: exit status $st, last line $(tail -n 1 "$d/out2")"; rc=1; }
    grep -q "^resumed from $d/mnt/c/ckpt_00000002: step 2" "$d/out2" || { echo "FAIL: did not resume from step 2"; rc=1; }
    cmp "$d/ref.bin" "$d/resumed.bin" || rc=1
    umount "$d/mnt"
    return $rc
}

# SIGTERM (preemption) to every rank mid-run: each stops at the same step boundary, writes a
# checkpoint and exits 0; continuing from it gives the uninterrupted run's model, byte for byte.
t_ckpt_sigterm() {
    local d=$WORK/ckterm
    mkdir -p "$d"
    local S=("${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64 --schedule constant)
    # (validation every 1000 steps: the run stopping at boundary s < 1000 validates at 0 only, as the
    # uninterrupted run does there, not a last time at s)
    $TRAIN --nproc 2 "${S[@]}" --steps 100000 --val "$DATA/val.bin" --val-every 1000 --ckpt-dir "$d/c" --log "$d/log.jsonl" >"$d/out" 2>&1 &
    local launcher=$! i
    await_true grep -q '"step":3,' "$d/log.jsonl" # until the run is training
    pkill -TERM -P "$launcher" || { kill $launcher; return 1; }
    wait $launcher || { echo "FAIL: exit status $?"; return 1; }
    local s
    s=$(sed -n 's/^received SIGTERM: stopping cleanly after \([0-9]*\) of 100000 steps, with a checkpoint$/\1/p' "$d/out")
    [ -n "$s" ] || { echo "FAIL: no stop message"; tail -5 "$d/out"; return 1; }
    echo "stopped after $s steps"
    [ -f "$d/c/$(printf 'ckpt_%08d' "$s")/manifest.json" ] || { echo "FAIL: no complete checkpoint of step $s"; return 1; }
    local vals
    vals=$(grep -c '"val_loss"' "$d/log.jsonl")
    [ "$vals" = 1 ] || { echo "FAIL: $vals validation records, expected the one of step 0"; grep '"val_loss"' "$d/log.jsonl"; return 1; }
    $TRAIN --nproc 2 "${S[@]}" --steps $((s + 3)) --save-model "$d/ref.bin" >/dev/null 2>&1 || return 1
    $TRAIN --nproc 2 "${S[@]}" --steps $((s + 3)) --resume "$d/c/$(printf 'ckpt_%08d' "$s")" --save-model "$d/resumed.bin" \
        >/dev/null 2>&1 || return 1
    cmp "$d/ref.bin" "$d/resumed.bin"
}

# Ctrl-C on a single rank (no launcher): SIGINT after its first step stops it at the next step boundary
# with a checkpoint and exit status 130, as under --nproc; continuing from that checkpoint gives the
# uninterrupted run's model, byte for byte.
t_ckpt_sigint() {
    local d=$WORK/ckint
    mkdir -p "$d"
    local S=("${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64 --schedule constant)
    $TRAIN "${S[@]}" --steps 100000 --ckpt-dir "$d/c" --log "$d/log.jsonl" >"$d/out" 2>&1 &
    local pid=$! i
    await_true grep -q '"step":1,' "$d/log.jsonl" # until its first step is logged
    kill -INT $pid
    wait $pid
    local st=$?
    [ $st -eq 130 ] || { echo "FAIL: exit status $st (expected 130)"; tail -5 "$d/out"; return 1; }
    local s
    s=$(sed -n 's/^received SIGINT: stopping cleanly after \([0-9]*\) of 100000 steps, with a checkpoint$/\1/p' "$d/out")
    [ -n "$s" ] || { echo "FAIL: no stop message"; tail -5 "$d/out"; return 1; }
    echo "stopped after $s steps"
    [ -f "$d/c/$(printf 'ckpt_%08d' "$s")/manifest.json" ] || { echo "FAIL: no complete checkpoint of step $s"; return 1; }
    $TRAIN "${S[@]}" --steps $((s + 2)) --save-model "$d/ref.bin" >/dev/null 2>&1 || return 1
    $TRAIN "${S[@]}" --steps $((s + 2)) --resume "$d/c/$(printf 'ckpt_%08d' "$s")" --save-model "$d/resumed.bin" \
        >/dev/null 2>&1 || return 1
    cmp "$d/ref.bin" "$d/resumed.bin"
}

# A stop signal that lands during the last step (LLM4D_FAULT at=sigterm / at=sigint: no clock) cuts
# nothing short: the run ends as the uninterrupted one does, its last validation included (the resumed
# run would have nothing left to train, so a skipped one would be lost), with the last checkpoint
# written and the same model; SIGINT under --nproc 2 on rank 1 alike, exit 130 as for Ctrl-C.
t_ckpt_signal_last_step() {
    local d=$WORK/cklast ok=0
    mkdir -p "$d"
    local S=("${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64 --steps 4 --val "$DATA/val.bin" --val-every 3)
    local spec run st np
    for np in 1 2; do # the uninterrupted runs
        $TRAIN --nproc $np "${S[@]}" --log "$d/ref$np.jsonl" --save-model "$d/ref$np.bin" >/dev/null 2>&1 || return 1
        grep '"val_loss"' "$d/ref$np.jsonl" >"$d/ref$np.val"
        [ "$(wc -l <"$d/ref$np.val")" = 3 ] || { echo "FAIL: the reference validates $(wc -l <"$d/ref$np.val") times, expected 3 (steps 0, 3, 4)"; return 1; }
    done
    for spec in "sigterm|1|0" "sigint|2|130"; do
        IFS='|' read -r sig np want <<<"$spec"
        run=$d/$sig
        LLM4D_FAULT="rank=$((np - 1)),step=4,at=$sig" $TRAIN --nproc $np "${S[@]}" --ckpt-dir "$run.ck" --log "$run.jsonl" \
            --save-model "$run.bin" >"$run.out" 2>&1
        st=$?
        [ $st -eq $want ] || { echo "FAIL: $sig: exit status $st, expected $want"; tail -3 "$run.out"; ok=1; continue; }
        grep -q "^received .* during the last step: the run ends as it would have" "$run.out" ||
            { echo "FAIL: $sig: no line saying the signal came during the last step"; ok=1; }
        grep '"val_loss"' "$run.jsonl" | cmp -s - "$d/ref$np.val" || { echo "FAIL: $sig: validation records differ:"; grep '"val_loss"' "$run.jsonl"; ok=1; }
        [ -f "$run.ck/ckpt_00000004/manifest.json" ] || { echo "FAIL: $sig: no checkpoint of step 4"; ok=1; }
        cmp -s "$run.bin" "$d/ref$np.bin" || { echo "FAIL: $sig: the model differs from the uninterrupted run's"; ok=1; }
    done
    return $ok
}

# One stop delivered twice at once (timeout(1) signals its child, then its process group) is one clean
# stop: LLM4D_FAULT at=sigterm-twice raises SIGTERM twice in a row, each handled before the next (two
# kill(1)s would merge into one pending signal): a checkpoint, the model saved, exit 0, not the end at
# once that a second signal brings.
t_ckpt_signal_twice() {
    local d=$WORK/cktwice st
    mkdir -p "$d"
    LLM4D_FAULT="rank=0,step=3,at=sigterm-twice" $TRAIN "${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64 \
        --steps 100 --ckpt-dir "$d/c" --save-model "$d/m.bin" >"$d/out" 2>&1
    st=$?
    [ $st -eq 0 ] || { echo "FAIL: exit status $st after one doubled SIGTERM (expected 0)"; tail -3 "$d/out"; return 1; }
    grep -q '^received SIGTERM: stopping cleanly after 3 of 100 steps, with a checkpoint and the model saved' "$d/out" ||
        { echo "FAIL: no clean stop after step 3"; tail -3 "$d/out"; return 1; }
    [ -f "$d/c/ckpt_00000003/manifest.json" ] && [ -f "$d/m.bin" ] || { echo "FAIL: no checkpoint of step 3 or no model"; return 1; }
}

# --skip-spikes: a NaN loss on one rank (a silent data corruption) in the last step is skipped on every
# rank, so the model equals the run one step shorter (constant learning rate); a 1000-fold loss spike
# is skipped and counted; without --skip-spikes a NaN ends the run with one line.
t_skip_spikes() {
    local d=$WORK/spikes ok=0
    mkdir -p "$d"
    local S=(--nproc 4 --tp 2 "${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64 --schedule constant --warmup 0)
    timeout 300 $TRAIN "${S[@]}" --steps 7 --save-model "$d/ref.bin" >/dev/null 2>&1 || return 1
    LLM4D_FAULT="rank=1,step=8,at=nan" timeout 300 $TRAIN "${S[@]}" --steps 8 --skip-spikes 3 --log "$d/nan.jsonl" \
        --save-model "$d/nan.bin" >/dev/null 2>&1 || { echo "FAIL: the run with a NaN stopped"; return 1; }
    cmp "$d/ref.bin" "$d/nan.bin" || { echo "FAIL: the NaN step was applied"; ok=1; }
    grep -q '"step":8,.*"skipped":1,"skipped_total":1}' "$d/nan.jsonl" || { echo "FAIL: step 8 not logged as skipped"; ok=1; }
    # the log stays JSON (which has no NaN): a skipped step's NaN loss is null, and plot.py draws the log
    LLM4D_FAULT="rank=0,step=3,at=nan" timeout 300 $TRAIN "${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 32 \
        --steps 4 --skip-spikes 3 --log "$d/nan1.jsonl" >/dev/null 2>&1 || { echo "FAIL: the one-rank run with a NaN"; ok=1; }
    $PY - "$d/nan1.jsonl" <<'PY' || ok=1
import json, sys
def refuse(c): raise ValueError("not JSON: " + c)
recs = [json.loads(l, parse_constant=refuse) for l in open(sys.argv[1])]
s3 = [r for r in recs if r.get("step") == 3 and "loss" in r]
assert s3 and s3[0]["loss"] is None and s3[0]["skipped"] == 1, "step 3: %r" % (s3[0] if s3 else "no record")
PY
    $PY scripts/plot.py "$d/nan1.jsonl" -o "$d/nan.png" >/dev/null && [ -s "$d/nan.png" ] || { echo "FAIL: plot.py on the log"; ok=1; }
    LLM4D_FAULT="rank=3,step=7,at=spike" timeout 300 $TRAIN "${S[@]}" --steps 8 --skip-spikes 3 --log "$d/spike.jsonl" \
        >/dev/null 2>&1 || { echo "FAIL: the run with a spike stopped"; return 1; }
    grep -q '"step":7,.*"skipped":1,"skipped_total":1}' "$d/spike.jsonl" || { echo "FAIL: step 7 not skipped"; ok=1; }
    grep -q '"step":8,.*"skipped":0,"skipped_total":1}' "$d/spike.jsonl" || { echo "FAIL: step 8 not applied"; ok=1; }
    LLM4D_FAULT="rank=0,step=3,at=nan" expect_error "loss is nan at step 3: training diverged" "${CK[@]}" --layers 2 \
        --train "$DATA/train.bin" --batch-tokens 32 --steps 4 || ok=1
    return $ok
}

# Stragglers: a rank made 300 ms slower per step from step 2 (LLM4D_FAULT at=slow) is reported by rank
# and host after --straggler-steps 3 steps; every step record carries the slowest and median compute.
t_stragglers() {
    local d=$WORK/strag
    mkdir -p "$d"
    LLM4D_FAULT="rank=2,step=2,at=slow,ms=300" timeout 300 $TRAIN --nproc 3 "${CK[@]}" --layers 2 --train "$DATA/train.bin" \
        --batch-tokens 96 --steps 5 --straggler-steps 3 --log "$d/log.jsonl" >"$d/out" 2>"$d/err" || return 1
    cat "$d/err"
    grep -q "^warning: straggler: rank 2 on $(hostname) has computed more than 50% longer than the median for 3 steps" "$d/err" || return 1
    grep -q "\"straggler\":2,\"host\":\"$(hostname)\"" "$d/log.jsonl" || return 1
    [ "$(grep -c '"compute_ms_max":[0-9.]*,"compute_ms_median":[0-9.]*,"slowest_rank":2' "$d/log.jsonl")" -ge 4 ]
}

# A rank stopped for a while (SIGSTOP after the log shows step 5, SIGCONT about 2 s later, both timed by
# this test's own clock) in a 2-rank run: every second of the run is in some step's record (the steps'
# wall times add up to the run's time at the last record, which is below the run's time seen from here),
# one step's wall time holds the whole stop, and that step's record (or, for a stop that fell on a step
# boundary, its neighbour's) names rank 1 as the rank that did not run, as the slowest rank and as the
# straggler (--straggler-steps 1); no record names rank 0.
t_stragglers_stop() {
    local d=$WORK/stragstop
    mkdir -p "$d"
    local t0 t1 t2 t3
    t0=$(date +%s.%N)
    # steps without end, stopped by SIGTERM once the stall is well behind it: a fast machine must not
    # finish the run before the test has found its ranks
    timeout 300 $TRAIN --nproc 2 "${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64 --steps 100000 \
        --straggler 0.5 --straggler-steps 1 --log "$d/log.jsonl" >"$d/out" 2>"$d/err" &
    local launcher=$! i p rank1=
    await_true grep -q '"step":5,' "$d/log.jsonl" # until step 5 is logged
    local train_pid
    train_pid=$(pgrep -P "$launcher") || { echo "no launcher"; return 1; }
    for p in $(pgrep -P "$train_pid"); do
        tr '\0' '\n' <"/proc/$p/environ" | grep -qx RANK=1 && rank1=$p
    done
    [ -n "$rank1" ] || { echo "FAIL: rank 1 not found"; kill "$launcher"; return 1; }
    t1=$(date +%s.%N)
    kill -STOP "$rank1"
    sleep 2 # the stall itself
    kill -CONT "$rank1"
    t2=$(date +%s.%N)
    local last
    last=$(grep -o '"step":[0-9]*,' "$d/log.jsonl" | tail -n 1 | tr -dc 0-9)
    await_true grep -q "\"step\":$((last + 5))," "$d/log.jsonl" # until 5 more steps are logged, then a clean stop
    pkill -TERM -P "$train_pid" # the ranks: each stops at the next step boundary and exits 0
    wait "$launcher" || { echo "FAIL: exit status $?"; cat "$d/err"; return 1; }
    t3=$(date +%s.%N)
    cat "$d/err"
    $PY - "$d" "$t0" "$t1" "$t2" "$t3" <<'EOF'
import json, re, sys
d = sys.argv[1]
t0, t1, t2, t3 = map(float, sys.argv[2:])
stop_ms = (t2 - t1) * 1e3
steps = [r for r in map(json.loads, open(f"{d}/log.jsonl")) if "loss" in r]
bad = []
if len(steps) < 10 or [r["step"] for r in steps] != list(range(1, len(steps) + 1)):
    bad.append("not one record per step")
total = sum(r["wall_ms"] for r in steps)
if abs(total - steps[-1]["t_s"] * 1e3) > 1 + 0.001 * len(steps):
    bad.append(f"the steps' wall times add up to {total:.3f} ms, the run's time at the last record is {steps[-1]['t_s'] * 1e3:.3f} ms")
if not (stop_ms < steps[-1]["t_s"] * 1e3 < (t3 - t0) * 1e3):
    bad.append(f"the run's time {steps[-1]['t_s']:.3f} s is not between the stop ({stop_ms / 1e3:.3f} s) and the time seen from outside ({t3 - t0:.3f} s)")
k = max(range(len(steps)), key=lambda i: steps[i]["wall_ms"])
w = steps[k]
print(f"stop {stop_ms:.0f} ms; step {w['step']} wall {w['wall_ms']:.0f} ms (its own {w['ms']:.0f} ms); the run {total:.0f} ms")
if w["wall_ms"] < stop_ms - 200:
    bad.append(f"no step's wall time holds the stop: at most {w['wall_ms']:.0f} ms")
named = [r for r in steps[max(k - 1, 0):k + 2] if r["stopped_rank"] == 1 and r["stopped_ms_max"] > stop_ms - 200]
if len(named) != 1:
    bad.append(f"{len(named)} records near step {w['step']} name rank 1 as not running for the stop")
for r in named:
    print(f"step {r['step']}: rank {r['stopped_rank']} did not run for {r['stopped_ms_max']:.0f} ms, slowest rank {r['slowest_rank']}")
    if r["slowest_rank"] != 1:
        bad.append(f"step {r['step']}: the slowest rank is {r['slowest_rank']}, not the stopped rank 1")
    err = open(f"{d}/err").read()
    if not re.search(rf"^warning: straggler: rank 1 on .* at step {r['step']}, of which it did not run for [0-9.]+ ms\)$", err, re.M):
        bad.append(f"no straggler warning for rank 1 at step {r['step']}")
if any(r["stopped_rank"] == 0 and r["stopped_ms_max"] > 1000 for r in steps):
    bad.append("rank 0 is named as not running")
for b in bad:
    print("FAIL", b)
sys.exit(1 if bad else 0)
EOF
}

# Safe files: each output location is checked before step 1; device nodes, /dev/null and directories
# are refused and left as they were; a symlink is written through, with a note; stale temporaries of
# dead writers are removed (a live writer's are kept); a write error removes its temporary and leaves
# the old file; overflowing --batch-tokens, prepare on a directory and a bad token id at the end of a
# shard are refused in one line.
t_safe_files() {
    local d=$WORK/safe ok=0
    mkdir -p "$d"
    local S=(--layers 2 --channels 32 --heads 4 --vocab 256 --seq-len 32 --train "$DATA/train.bin" --steps 2)
    local flag
    for flag in --save-model --log --ckpt-dir --dump; do # before step 1: nothing trained, nothing printed
        local what=$d/missing/out
        $TRAIN "${S[@]}" $flag "$what" >"$d/o" 2>"$d/e" && { echo "FAIL $flag into a missing directory succeeded"; ok=1; }
        if grep -q '^step' "$d/o" || [ "$(grep -c . "$d/e")" -ne 1 ] || ! grep -q "^error: $flag $what" "$d/e"; then
            echo "FAIL $flag: $(cat "$d/e")"
            ok=1
        fi
    done
    expect_error "save-model /dev/null is a character device: refusing to replace it" "${S[@]}" --save-model /dev/null || ok=1
    [ -c /dev/null ] || { echo "FAIL /dev/null is no longer a device"; ok=1; }
    mknod "$d/node" c 1 3 2>/dev/null && {
        expect_error "save-model $d/node is a character device" "${S[@]}" --save-model "$d/node" || ok=1
        [ -c "$d/node" ] || { echo "FAIL the device node was replaced"; ok=1; }
    }
    mkdir -p "$d/dir"
    expect_error "save-model $d/dir is a directory" "${S[@]}" --save-model "$d/dir" || ok=1
    # a symlink: its target is written, the link stays
    $TRAIN "${S[@]}" --save-model "$d/direct.bin" >/dev/null || return 1
    echo old >"$d/target.bin"
    ln -sf target.bin "$d/link.bin"
    $TRAIN "${S[@]}" --save-model "$d/link.bin" >"$d/o" || return 1
    grep -q "^note: --save-model $d/link.bin is a symlink: the model goes to its target, $d/target.bin" "$d/o" || { echo "FAIL no note"; ok=1; }
    [ -L "$d/link.bin" ] && cmp "$d/direct.bin" "$d/target.bin" || { echo "FAIL the symlink was not written through"; ok=1; }
    # stale temporaries: a dead writer's go, a live one's and other names stay
    sleep 0 &
    local dead=$!
    wait $dead
    touch "$d/direct.bin.tmp.$dead" "$d/direct.bin.tmp.$$" "$d/direct.bin.tmp.x1"
    $TRAIN "${S[@]}" --save-model "$d/direct.bin" >/dev/null || return 1
    [ ! -e "$d/direct.bin.tmp.$dead" ] && [ -e "$d/direct.bin.tmp.$$" ] && [ -e "$d/direct.bin.tmp.x1" ] ||
        { echo "FAIL stale temporaries: $(ls "$d")"; ok=1; }
    rm -f "$d/direct.bin.tmp."*
    # a write error (the file size limit): one line, the temporary removed, the old file intact
    cp "$d/direct.bin" "$d/keep.bin"
    (ulimit -f 64; expect_error "cannot write $d/direct.bin: File too large" "${S[@]}" --save-model "$d/direct.bin") || ok=1
    cmp "$d/direct.bin" "$d/keep.bin" || ok=1
    [ -z "$(ls "$d" | grep tmp)" ] || { echo "FAIL temporaries left: $(ls "$d")"; ok=1; }
    local bt
    for bt in 274877907008 549755813888 137438953472; do
        expect_error "batch-tokens $bt means .* micro-batches of 1 x 32 per data-parallel rank and step, more than" \
            "${S[@]}" --micro-batch 1 --batch-tokens $((bt / 32 * 32)) || ok=1
    done
    expect_error "batch-tokens 274877907008 is not a multiple of --micro-batch x --seq-len = 4 x 32 = 128" "${S[@]}" \
        --batch-tokens 274877907008 || ok=1
    expect_error "prepare: $d/dir is a directory, not a regular file" prepare "$d/dir" "$d/out" || ok=1
    # a token id above the vocabulary in the very last position of a shard: reported when the data is opened
    $PY - "$DATA/train.bin" "$d/badtok.bin" <<'EOF' || return 1
import sys, numpy as np
b = bytearray(open(sys.argv[1], "rb").read())
n = np.frombuffer(bytes(b[:1024]), dtype=np.int32)[2]
b[1024 + 2 * (n - 1):] = np.array([300], dtype=np.uint16).tobytes()
open(sys.argv[2], "wb").write(b)
EOF
    local n
    n=$(( ($(stat -c %s "$d/badtok.bin") - 1024) / 2 ))
    expect_error "badtok.bin: token 300 at position $((n - 1)) (byte offset $((1024 + 2 * (n - 1)))) is not below the vocabulary size 256" \
        "${S[@]}" --train "$d/badtok.bin" --steps 1 || ok=1
    return $ok
}

# The lock: a run (seed 11) holding --ckpt-dir, stopped after its first checkpoint (SIGSTOP: it holds
# the lock for as long as the test needs), refuses a second run into the directory (seed 22; fresh,
# with --resume, and under --nproc 2) and a --resume PATH from it, each in one line naming the holder's
# PID and host; its checkpoints stay byte for byte; killed with SIGKILL, it leaves the lock to a new
# run (seed 33), which resumes from the newest of them and adds its own.
# Every thread of process PID is stopped (state T in /proc/PID/task/*/stat, the field after the name).
all_stopped() {
    local f
    for f in /proc/$1/task/*/stat; do
        [ "$(sed 's/^.*) //' "$f" | cut -d' ' -f1)" = T ] || return 1
    done
}

t_ckpt_lock() {
    local d=$WORK/cklock ok=0 i
    rm -rf "$d"
    mkdir -p "$d"
    local S=("${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64)
    $TRAIN "${S[@]}" --seed 11 --steps 100000 --ckpt-every 2 --ckpt-dir "$d/c" >"$d/a.out" 2>&1 &
    local a=$!
    await_true compgen -G "$d/c/ckpt_*/manifest.json" # until its first checkpoint is complete
    kill -STOP $a || return 1
    # kill returns before every thread has stopped: until then the checkpoint writer may still
    # complete one more (which the new run below would then resume from instead)
    await_true all_stopped $a || { kill -9 $a; echo "FAIL: the holder did not stop"; return 1; }
    local held=() c
    for c in "$d"/c/ckpt_*; do [ -f "$c/manifest.json" ] && held+=("$c"); done
    [ ${#held[@]} -gt 0 ] || { kill -9 $a; echo "FAIL: no checkpoint before the stop"; return 1; }
    find "${held[@]}" -type f -exec md5sum {} + >"$d/held.md5"
    local who="is in use by another run (PID $a on host $(hostname) holds $d/c/llm4d.lock)"
    expect_error "ckpt-dir $d/c $who" "${S[@]}" --seed 22 --steps 4 --ckpt-dir "$d/c" || ok=1
    expect_error "ckpt-dir $d/c $who" "${S[@]}" --seed 22 --steps 100 --ckpt-dir "$d/c" --resume || ok=1
    expect_error "resume ${held[0]}: its directory $d/c $who" "${S[@]}" --seed 22 --steps 100 --resume "${held[0]}" \
        --ckpt-dir "$d/other" || ok=1
    # reading a held checkpoint is not refused: eval and sample of it while the run holds the directory
    timeout 300 $TRAIN eval --model "${held[0]}" --val "$DATA/val.bin" --batches 1 >"$d/eval.out" 2>&1 ||
        { echo "FAIL: eval of a held checkpoint: $(tail -2 "$d/eval.out")"; ok=1; }
    grep -q "loss" "$d/eval.out" || { echo "FAIL: eval printed no loss: $(cat "$d/eval.out")"; ok=1; }
    timeout 300 $TRAIN sample --model "$d/c" --tokens 4 --seed 1 >"$d/sample.out" 2>&1 ||
        { echo "FAIL: sample of a held checkpoint directory: $(tail -2 "$d/sample.out")"; ok=1; }
    timeout 300 $TRAIN --nproc 2 "${S[@]}" --seed 22 --steps 4 --ckpt-dir "$d/c" >/dev/null 2>"$d/b.err" &&
        { echo "FAIL: a run under --nproc 2 was not refused"; ok=1; }
    [ "$(grep -c "^error: --ckpt-dir $d/c $who" "$d/b.err")" -eq 1 ] ||
        { echo "FAIL --nproc 2: $(cat "$d/b.err")"; ok=1; }
    md5sum -c --quiet "$d/held.md5" || { echo "FAIL: the holder's checkpoints changed"; ok=1; }
    kill -9 $a
    wait $a 2>/dev/null
    local newest=${held[-1]##*_}
    $TRAIN "${S[@]}" --seed 33 --steps $((10#$newest + 2)) --ckpt-dir "$d/c" --resume >"$d/c.out" 2>&1 &
    local n=$!
    wait $n || { echo "FAIL: the run after the holder's death: $(tail -3 "$d/c.out")"; return 1; }
    grep -q "^resumed from ${held[-1]}: step $((10#$newest))" "$d/c.out" || { echo "FAIL: did not resume"; ok=1; }
    grep -q "^note: --seed 33, the checkpoint's 11: the samples from here follow this run's seed" "$d/c.out" ||
        { echo "FAIL: no note on the new seed"; ok=1; }
    grep -q "^pid $n host $(hostname)$" "$d/c/llm4d.lock" || { echo "FAIL: the lock file names $(cat "$d/c/llm4d.lock")"; ok=1; }
    md5sum -c --quiet "$d/held.md5" || { echo "FAIL: the first run's checkpoints changed"; ok=1; }
    for c in "${held[@]}"; do
        grep -q '^  "seed": 11,$' "$c/manifest.json" || { echo "FAIL: $c does not hold seed 11"; ok=1; }
    done
    c=$(printf '%s/c/ckpt_%08d' "$d" $((10#$newest + 2)))
    grep -q '^  "seed": 33,$' "$c/manifest.json" || { echo "FAIL: $c does not hold the new run's seed 33"; ok=1; }
    echo "held by PID $a: ${held[*]##*/}; then PID $n resumed from step $((10#$newest))"
    return $ok
}

# Resuming with another learning-rate schedule (--steps 12 and --lr 2e-3 after --steps 6 at 1e-3, cosine,
# --warmup 2, --lr-min-frac 0.1): one note names both changes and the rate step 7 takes under this run's
# schedule and under the checkpoint's, each within float rounding of the README's cosine formula, and
# the log's step 7 has this run's rate. Resumed again with the schedule its checkpoint was written
# under (--steps 14 aside): the note names --steps alone.
t_ckpt_schedule_note() {
    local d=$WORK/cksn line
    rm -rf "$d"
    mkdir -p "$d"
    local S=("${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64 --lr-min-frac 0.1)
    $TRAIN "${S[@]}" --steps 6 --ckpt-dir "$d/c" >/dev/null || return 1
    $TRAIN "${S[@]}" --steps 12 --lr 2e-3 --ckpt-dir "$d/c" --resume --log "$d/r.jsonl" >"$d/out" 2>&1 || { tail -3 "$d/out"; return 1; }
    line=$(grep '^note: the learning-rate schedule' "$d/out")
    $PY - "$line" "$d/r.jsonl" <<'EOF2' || return 1
import json, math, re, sys
line, log = sys.argv[1], sys.argv[2]
m = re.fullmatch(r"note: the learning-rate schedule is not the checkpoint's: --lr 0\.002 \(the checkpoint's 0\.001\), "
                 r"--steps 12 \(6\); step 7 takes lr ([0-9.e-]+), ([0-9.e-]+) under the checkpoint's", line)
if not m:
    sys.exit("FAIL: the note reads: %r" % line)
def cosine(peak, warmup, steps, s, frac=0.1):  # s: the 0-based step
    if s < warmup: return peak * (s + 1) / warmup
    lo = peak * frac
    return lo + 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup))) * (peak - lo)
now, was = cosine(2e-3, 2, 12, 6), cosine(1e-3, 2, 6, 6)
for got, want, what in ((float(m.group(1)), now, "this run's"), (float(m.group(2)), was, "the checkpoint's")):
    if abs(got - want) > 1e-5 * want:
        sys.exit("FAIL: %s rate at step 7: %g, the formula gives %g" % (what, got, want))
logged = [r["lr"] for r in map(json.loads, open(log)) if r.get("step") == 7 and "lr" in r]
if len(logged) != 1 or abs(logged[0] - now) > 1e-5 * now:
    sys.exit("FAIL: the log's step 7 rate %s, this run's schedule gives %g" % (logged, now))
EOF2
    $TRAIN "${S[@]}" --steps 14 --lr 2e-3 --ckpt-dir "$d/c" --resume >"$d/out2" 2>&1 || return 1 # from step 12
    grep -qx "note: the learning-rate schedule is not the checkpoint's: --steps 14 (12); step 13 takes lr [0-9.e-]*, [0-9.e-]* under the checkpoint's" "$d/out2" ||
        { echo "FAIL: resumed with --steps alone changed: $(grep '^note' "$d/out2")"; return 1; }
    echo "$line"
}

# The data fingerprint: the manifest records, per shard, the crc32 of its header and of a fixed sample
# of its tokens (computed here from the README's definition, for a shard hashed whole and one sampled);
# resuming on another corpus of the same token count is refused in one line naming the shard and
# --allow-data-change, with which it proceeds; a checkpoint without the fingerprint (older) resumes with
# a warning.
t_ckpt_fingerprint() {
    local d=$WORK/ckfp ok=0
    rm -rf "$d"
    mkdir -p "$d/a" "$d/b"
    $PY - "$DATA/train.bin" "$d" <<'EOF2' || return 1
import sys, struct, zlib
src, d = sys.argv[1], sys.argv[2]
b = open(src, "rb").read()
tok = b[1024:]
big = tok * 5  # more than 64 x 1024 tokens: sampled
def shard(path, t):
    open(path, "wb").write(struct.pack("<3i", 20240520, 1, len(t) // 2) + bytes(1012) + t)
shard(f"{d}/a/s0.bin", tok)
shard(f"{d}/a/s1.bin", big)
shard(f"{d}/b/s0.bin", tok)
shard(f"{d}/b/s1.bin", big[2:] + big[:2])  # the same token count, another order
def fingerprint(path):
    f = open(path, "rb").read()
    n = (len(f) - 1024) // 2
    crc = zlib.crc32(f[:1024])
    if n <= 64 * 1024:
        return zlib.crc32(f[1024:], crc)
    for j in range(64):
        at = j * (n - 1024) // 63
        crc = zlib.crc32(f[1024 + 2 * at:1024 + 2 * (at + 1024)], crc)
    return crc
for x in "ab":
    open(f"{d}/{x}.fp", "w").write(" ".join("%08x" % fingerprint(f"{d}/{x}/s{i}.bin") for i in range(2)))
EOF2
    local S=("${CK[@]}" --layers 2 --batch-tokens 64)
    timeout 300 $TRAIN "${S[@]}" --train "$d/a/*.bin" --steps 2 --ckpt-dir "$d/c" >"$d/a.out" 2>&1 || { tail -3 "$d/a.out"; return 1; }
    local ck=$d/c/ckpt_00000002
    grep -q "^    \"fingerprint\": \"$(cat "$d/a.fp")\",$" "$ck/manifest.json" ||
        { echo "FAIL: the manifest's fingerprint is not '$(cat "$d/a.fp")': $(grep fingerprint "$ck/manifest.json")"; ok=1; }
    local fa fb
    fa=$(cut -d' ' -f2 "$d/a.fp")
    fb=$(cut -d' ' -f2 "$d/b.fp")
    expect_error "resume $ck: $d/b/s1.bin differs from the shard the checkpoint was trained on (content fingerprint $fb, the checkpoint's $fa): pass --allow-data-change" \
        "${S[@]}" --train "$d/b/*.bin" --steps 4 --resume "$ck" || ok=1
    timeout 300 $TRAIN "${S[@]}" --train "$d/b/*.bin" --steps 4 --resume "$ck" --allow-data-change >"$d/b.out" 2>&1 ||
        { echo "FAIL: --allow-data-change did not proceed: $(tail -2 "$d/b.out")"; ok=1; }
    grep -q "^note: --allow-data-change: $d/b/s1.bin differs" "$d/b.out" || { echo "FAIL: no note"; ok=1; }
    grep -q "^resumed from $ck: step 2" "$d/b.out" || { echo "FAIL: not resumed"; ok=1; }
    # another token count: refused as before, and accepted on purpose
    expect_error "was trained on $(( $(stat -c %s "$d/a/s0.bin") / 2 * 6 - 3072 )) tokens of --train data" \
        "${S[@]}" --train "$d/a/s1.bin" --steps 4 --resume "$ck" || ok=1
    timeout 300 $TRAIN "${S[@]}" --train "$d/a/s1.bin" --steps 4 --resume "$ck" --allow-data-change >/dev/null 2>&1 ||
        { echo "FAIL: --allow-data-change with another token count did not proceed"; ok=1; }
    # written before fingerprints: resumed, with one warning
    $PY test/ckpt_craft.py "$ck" "$d/old" -data.fingerprint || return 1
    timeout 300 $TRAIN "${S[@]}" --train "$d/a/*.bin" --steps 4 --resume "$d/old" >"$d/old.out" 2>"$d/old.err" ||
        { echo "FAIL: a checkpoint without a fingerprint was refused: $(cat "$d/old.err")"; ok=1; }
    [ "$(cat "$d/old.err")" = "warning: $d/old records no fingerprint of its training data (written before them): the data is not compared" ] ||
        { echo "FAIL: expected one warning, got: $(cat "$d/old.err")"; ok=1; }
    return $ok
}

# The manifest's fields are checked for range and type after its crc32 verifies (test/ckpt_craft.py
# recomputes it): each damage is refused in one line naming the field; a shard whose run overlaps
# another's (one element then in no run, which the count of copied elements misses) names both shards.
# crafted_refused SRC EDIT MESSAGE FLAGS...: a copy of checkpoint SRC with ckpt_craft.py's EDIT is
# refused by --resume in one line, "resume: COPY" then MESSAGE (t_ckpt_fields' $d and counter $i)
crafted_refused() {
    i=$((i + 1))
    $PY test/ckpt_craft.py "$1" "$d/x$i" "$2" || return 1
    expect_error "resume: $d/x$i$3" "${@:4}" --resume "$d/x$i"
}

t_ckpt_fields() {
    local d=$WORK/ckfld ok=0 e
    rm -rf "$d"
    mkdir -p "$d"
    local S=("${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64)
    timeout 300 $TRAIN --nproc 2 --zero 1 "${S[@]}" --steps 2 --ckpt-dir "$d/c" >"$d/a.out" 2>&1 || { tail -3 "$d/a.out"; return 1; }
    local ck=$d/c/ckpt_00000002 i=0
    for e in "layout.dp=-7|layout.dp = -7 is out of range (1 to 2)" "layout.tp=1000000|layout.tp = 1000000 is out of range (1 to 2)" \
        "layout.zero=99|layout.zero = 99 is out of range (0 to 3)" "model.layers=4294967300|missing or malformed 'layers' (not of its type, or beyond its type's range)" \
        "skip_spikes.skipped=-5|skip_spikes.skipped = -5 is out of range (0 to 2)" "adam_t=1000000000000|adam_t = 1000000000000 is out of range (0 to 2)" \
        "model.heads=4.5|missing or malformed 'heads'" 'layout.dtype="fp8"|layout.dtype = .fp8. is not fp32 or bf16' \
        "layout.ranks=3|layout: dp x tp x pp x cp = 2 x 1 x 1 x 1 is not layout.ranks = 3" \
        'data.fingerprint="xyz"|data.fingerprint is not 8 hexadecimal digits per shard' "layout.cp=4294967297|missing or malformed 'cp'" \
        "data.tokens=-1|data.tokens = -1 is negative"; do
        crafted_refused "$ck" "${e%%|*}" "/manifest.json: ${e#*|}" "${S[@]}" --steps 4 || ok=1
    done
    local where
    where=$($PY test/ckpt_craft.py "$ck" "$d/overlap" overlap) || return 1
    expect_error "resume: $d/overlap: the runs of ${where% *} overlap: element ${where#* } is in rank_0000[01].safetensors and in rank_00001.safetensors" \
        "${S[@]}" --steps 4 --resume "$d/overlap" || ok=1
    # a state no run trains from: a NaN master weight, an infinite moment, a negative second moment
    for e in "wte.master=nan|a master weight of this rank's state is nan" "wte.m=inf|a first moment of this rank's state is inf" \
        "wte.v=-1|a second moment of this rank's state is -1"; do
        crafted_refused "$ck" "value:${e%%|*}" ": ${e#*|} (element" "${S[@]}" --steps 4 || ok=1
    done
    # a Llama's fields, in the ranges their flags have (what no writer could have produced)
    local L=(--model llama3-tiny --train "$DATA/train.bin" --seq-len 32 --micro-batch 1 --batch-tokens 32)
    timeout 300 $TRAIN "${L[@]}" --steps 1 --ckpt-dir "$d/l" >"$d/l.out" 2>&1 || { tail -3 "$d/l.out"; return 1; }
    for e in "model.rope_factor=1e-300|model: rope scaling (factor 1e-300" "model.norm_eps=1e300|model: the norm epsilon (inf) must be from 1e-12 to 1" \
        "model.rope_theta=1e308|model: the norm epsilon (1e-05) must be from 1e-12 to 1 and the rope theta (1e+308) above 1"; do
        crafted_refused "$d/l/ckpt_00000001" "${e%%|*}" "/manifest.json: ${e#*|}" "${L[@]}" --steps 2 || ok=1
    done
    return $ok
}

# An unusable checkpoint found by --resume's search (its manifest.json a directory; a manifest field out
# of range) is moved aside, to ckpt_<step>.bad or, when that exists, .bad.1, with one line saying so; the
# run resumes from the one before it and writes its own checkpoint of that step; the model equals the
# uninterrupted run's. With every checkpoint unusable, --resume is refused and they all stay, under
# --max-restarts at the relaunch too.
t_ckpt_move_aside() {
    local d=$WORK/ckbadmv ok=0 case
    rm -rf "$d"
    mkdir -p "$d"
    local S=("${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64 --steps 4)
    timeout 300 $TRAIN "${S[@]}" --ckpt-dir "$d/ref" --ckpt-every 2 --save-model "$d/ref.bin" >"$d/ref.out" 2>&1 || return 1
    for case in dir field; do
        local c=$d/$case to
        cp -r "$d/ref" "$c"
        if [ $case = dir ]; then
            rm "$c/ckpt_00000004/manifest.json"
            mkdir "$c/ckpt_00000004/manifest.json" "$c/ckpt_00000004.bad" # the name taken: .bad.1
            to=$c/ckpt_00000004.bad.1
        else
            mv "$c/ckpt_00000004" "$d/field.src"
            $PY test/ckpt_craft.py "$d/field.src" "$c/ckpt_00000004" layout.zero=99 || return 1
            to=$c/ckpt_00000004.bad
        fi
        timeout 300 $TRAIN "${S[@]}" --ckpt-dir "$c" --resume --save-model "$d/$case.bin" >"$d/$case.out" 2>"$d/$case.err" ||
            { echo "FAIL $case: the run failed: $(tail -2 "$d/$case.err")"; ok=1; continue; }
        echo "$case: $(cat "$d/$case.err")"
        grep -q "^moved the unusable checkpoint $c/ckpt_00000004 aside to $to$" "$d/$case.out" || { echo "FAIL $case: no line"; ok=1; }
        grep -q "^resumed from $c/ckpt_00000002: step 2" "$d/$case.out" || { echo "FAIL $case: not resumed from step 2"; ok=1; }
        [ -f "$c/ckpt_00000004/manifest.json" ] && [ -e "$to/manifest.json" ] ||
            { echo "FAIL $case: expected the new checkpoint of step 4 and the old one aside: $(ls "$c")"; ok=1; }
        cmp "$d/ref.bin" "$d/$case.bin" || { echo "FAIL $case: the model differs"; ok=1; }
    done
    # every checkpoint unusable: refused, and they stay, so that a relaunch refuses again instead of
    # finding none and starting from step 0 (as it did when they were moved aside first)
    local c=$d/all s
    mkdir -p "$c"
    for s in 00000002 00000004; do $PY test/ckpt_craft.py "$d/ref/ckpt_$s" "$c/ckpt_$s" layout.zero=99 || return 1; done
    timeout 300 $TRAIN --nproc 1 --max-restarts 1 "${S[@]}" --ckpt-dir "$c" --resume >"$d/all.out" 2>"$d/all.err" &&
        { echo "FAIL all: the run succeeded: $(tail -2 "$d/all.out")"; ok=1; }
    [ "$(grep -c "none of the 2 checkpoint(s) in $c is usable" "$d/all.err")" = 2 ] ||
        { echo "FAIL all: expected the refusal at the launch and at its relaunch: $(cat "$d/all.err")"; ok=1; }
    grep -q "starting from step 0" "$d/all.out" && { echo "FAIL all: the relaunch started from step 0"; ok=1; }
    [ "$(ls "$c" | grep -v '^llm4d.lock$')" = "$(printf 'ckpt_00000002\nckpt_00000004')" ] ||
        { echo "FAIL all: the checkpoints moved: $(ls "$c")"; ok=1; }
    return $ok
}

# eval --model DIR on two ranks while a newer checkpoint appears in DIR between the ranks' starts (a
# training run still writing there), under TP 2 (each rank reads its half of the weights): both read the
# checkpoint rank 0 found, so the loss is that checkpoint's on one rank; each rank taking its own newest
# mixed two steps' weights. Rank 1 starts
# only once rank 0 listens on the job's port, so rank 0 has chosen before the newer one appears.
t_model_dir_agreed() {
    local d=$WORK/ckagree ok=0 port token=agree$RANDOM
    rm -rf "$d"
    mkdir -p "$d/D"
    local S=("${CK[@]}" --layers 2 --train "$DATA/train.bin" --batch-tokens 64)
    timeout 300 $TRAIN "${S[@]}" --steps 6 --ckpt-every 2 --ckpt-dir "$d/r" >"$d/r.out" 2>&1 || { tail -2 "$d/r.out"; return 1; }
    cp -r "$d/r/ckpt_00000002" "$d/r/ckpt_00000004" "$d/D/" || return 1
    local E=(eval --val "$DATA/val.bin" --batches 2 --threads 1)
    local l4 l6
    l4=$(timeout 300 $TRAIN "${E[@]}" --model "$d/r/ckpt_00000004" 2>/dev/null | grep -o 'loss [0-9.]*') || return 1
    l6=$(timeout 300 $TRAIN "${E[@]}" --model "$d/r/ckpt_00000006" 2>/dev/null | grep -o 'loss [0-9.]*') || return 1
    [ "$l4" != "$l6" ] || { echo "FAIL: steps 4 and 6 give the same loss ($l4): the test cannot tell them apart"; return 1; }
    port=$(fake_port)
    env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 NODE_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        LLM4D_JOB_TOKEN=$token timeout 300 $TRAIN "${E[@]}" --tp 2 --model "$d/D" >"$d/0.out" 2>"$d/0.err" &
    local r0=$!
    await_true bash -c "ss -ltn | grep -q ':$port '" || { kill $r0; echo "FAIL: rank 0 never listened on $port"; return 1; }
    cp -r "$d/r/ckpt_00000006" "$d/D/.new" && mv "$d/D/.new" "$d/D/ckpt_00000006" || { kill $r0; return 1; }
    env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 NODE_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        LLM4D_JOB_TOKEN=$token timeout 300 $TRAIN "${E[@]}" --tp 2 --model "$d/D" >"$d/1.out" 2>"$d/1.err"
    local s1=$?
    wait $r0 || { echo "FAIL: rank 0: $(tail -2 "$d/0.err")"; ok=1; }
    [ $s1 -eq 0 ] || { echo "FAIL: rank 1: $(tail -2 "$d/1.err")"; ok=1; }
    local got
    got=$(grep -o 'loss [0-9.]*' "$d/0.out")
    $PY -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-5 * abs(b))' "${got#loss }" "${l4#loss }" ||
        { echo "FAIL: two ranks gave $got where step 4 alone gives $l4 (step 6: $l6)"; ok=1; }
    echo "two ranks: $got; step 4 alone: $l4; step 6: $l6"
    return $ok
}
