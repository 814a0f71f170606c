#!/usr/bin/env bash
# The command line a new user meets (issue 23): every subcommand's --help; llm.c's short flags, each
# the same run as its long form (the same final model, byte for byte) and each unmapped one one line
# and a non-zero exit; the one number parser, a table of good and bad values through the trainer and
# the planner; the defaults taken from the data (the tokenizer's vocabulary) and the warnings about them.
# Usage: test/cli_ux.sh ./train WORKDIR   (exit 0: every check passed; each failure prints one line)
set -uo pipefail
TRAIN=$1 W=$2
mkdir -p "$W"
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# --- every subcommand's --help: its usage on stdout, exit 0
for cmd in "" sample eval plan prepare bench-comm hf-inspect; do
    out=$($TRAIN $cmd --help 2>&1) || bad "./train $cmd --help exited $?"
    grep -q "^usage: ./train $cmd" <<<"$out" || bad "./train $cmd --help does not print its usage: ${out:0:80}"
    $TRAIN $cmd -h >/dev/null 2>&1 || bad "./train $cmd -h exited non-zero"
done

# --- llm.c's short flags: each the same run as its long form
$TRAIN prepare /usr/share/common-licenses/GPL-3 "$W/d" >/dev/null || exit 1
D=$W/d
S=(--layers 2 --channels 32 --heads 4 --vocab 256 --max-seq-len 64 --seed 3)
base=(--train "$D/train.bin" --seq-len 32 --micro-batch 2 --steps 3 --lr 1e-3)
run_model() { # OUT ARGS...: trains, saves the model to OUT, and prints the run's step lines less their timing
    local out=$1
    shift
    $TRAIN "${S[@]}" "$@" --save-model "$out" 2>&1 | grep -E '^(step|sample|eval)' | sed -E 's/ \| [0-9.]+ ms.*//'
}
# short flag, its value, the long flag, and the flags that either needs besides the base run's
while read -r short val long extra; do
    extra=${extra//@D/$D} val=${val//@D/$D}
    # the base run with the pair put in last (a later flag wins), so that the value is the flag's own
    a=$(run_model "$W/short.bin" "${base[@]}" $extra "$short" "$val") || true
    b=$(run_model "$W/long.bin" "${base[@]}" $extra "$long" "$val") || true
    [ -s "$W/short.bin" ] || { bad "$short $val: no model written"; continue; }
    cmp -s "$W/short.bin" "$W/long.bin" || bad "$short $val and $long $val train different models"
    [ "$a" = "$b" ] || bad "$short $val and $long $val print different runs"
    rm -f "$W/short.bin" "$W/long.bin"
done <<'EOF'
-i @D/train.bin --train
-t 16 --seq-len
-b 1 --micro-batch
-d 128 --batch-tokens
-x 2 --steps
-k linear --schedule
-l 3e-3 --lr
-u 2 --warmup
-q 0.5 --lr-min-frac
-c 0.1 --weight-decay
-z 1 --zero
-v 1 --val-every --val @D/val.bin --val-steps 1
-m 2 --val-steps --val @D/val.bin --val-every 2
-j @D/val.bin --val --val-every 2
-s 3 --sample-every --sample-tokens 4
-g 5 --sample-tokens --sample-every 3
EOF
# -e dN is --model dN; -y 1 --resume; -r 0 and -r 2 the recompute modes; -n and -nk the checkpoints
# (each compared as the run it makes, with what it needs besides)
$TRAIN "${S[@]}" --steps 0 --save-model "$D/init.bin" >/dev/null 2>&1 || bad "cannot write the initial model"
for pair in "-e:$D/init.bin:--init-from" "-r:0:--recompute none" "-r:2:--recompute selective"; do
    IFS=: read -r short val long <<<"$pair"
    shape=("${S[@]}")
    [ "$short" = -e ] && shape=()
    a=$($TRAIN "${shape[@]}" "${base[@]}" "$short" "$val" --save-model "$W/s.bin" 2>&1 | grep '^step' | sed -E 's/ \| [0-9.]+ ms.*//')
    b=$($TRAIN "${shape[@]}" "${base[@]}" $long $([ "$short" = -e ] && echo "$val") --save-model "$W/l.bin" 2>&1 | grep '^step' | sed -E 's/ \| [0-9.]+ ms.*//')
    cmp -s "$W/s.bin" "$W/l.bin" || bad "$short $val and $long train different models"
    [ -n "$a" ] && [ "$a" = "$b" ] || bad "$short $val and $long print different runs"
done
small=(--layers 1 --channels 32 --heads 4 --steps 0) # d12's vocabulary and maxT, a small body
a=$($TRAIN -e d12 "${small[@]}" 2>&1 | grep '^llm4d') b=$($TRAIN --model d12 "${small[@]}" 2>&1 | grep '^llm4d')
[ -n "$a" ] && [ "$a" = "$b" ] || bad "-e d12 is not --model d12: '$a' vs '$b'"
for flags in "-n 2 -nk 1 -y 1" "--ckpt-every 2 --keep 1 --resume"; do
    rm -rf "$W/ck"
    $TRAIN "${S[@]}" "${base[@]}" --ckpt-dir "$W/ck" $flags --save-model "$W/ck.bin" >/dev/null 2>&1 || bad "$flags failed"
    ls "$W/ck" | grep '^ckpt_' >"$W/ck.list.$([ "${flags:0:2}" = -n ] && echo s || echo l)"
    mv "$W/ck.bin" "$W/ck.bin.${flags:0:2}"
done
cmp -s "$W/ck.bin.-n" "$W/ck.bin.--" || bad "-n 2 -nk 1 -y 1 and --ckpt-every 2 --keep 1 --resume train different models"
cmp -s "$W/ck.list.s" "$W/ck.list.l" || bad "-n/-nk keep other checkpoints than --ckpt-every/--keep"
# the ones without an equivalent: one line naming the flag, a non-zero exit
for f in -o -lg -nm -yd -sl -sg -a -f -w -ge -pn -pr -pg -pi -pm -pf -ps -pp "-h 1"; do
    out=$($TRAIN $f x 2>&1)
    rc=$?
    [ $rc -ne 0 ] || bad "llm.c's $f: exit 0"
    [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "^error: llm.c's ${f% *} has no llm4d equivalent: " <<<"$out" || bad "llm.c's $f: '$out'"
done
for f in "-r 1" "-x -1" "-m -1" "-y 2"; do
    out=$($TRAIN $f 2>&1) && bad "$f: exit 0"
    [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "^error: ${f% *} " <<<"$out" || bad "$f: '$out'"
done

# --- one number parser: the trainer and the planner alike. FLAG VALUE, then ok or the error's text
tiny=(--layers 1 --channels 32 --heads 4 --vocab 256 --seq-len 32 --micro-batch 4 --steps 0)
check_value() { # WHO FLAG VALUE EXPECT
    local who=$1 flag=$2 v=$3 want=$4 out rc
    if [ "$who" = train ]; then out=$($TRAIN "${tiny[@]}" "$flag" "$v" 2>&1); rc=$?
    else out=$($TRAIN plan --gpus 8 --batch-tokens 64K "$flag" "$v" 2>&1); rc=$?; fi
    if [ "$want" = ok ]; then
        [ $rc -eq 0 ] || bad "$who $flag $v refused: $(tail -n 1 <<<"$out")"
    else
        [ $rc -ne 0 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -qF -- "$want" <<<"$out" || bad "$who $flag $v: want '$want', got '$out' (exit $rc)"
    fi
}
while read -r who flag v want; do
    check_value "$who" "$flag" "$v" "$want"
done <<'EOF'
train --batch-tokens 4K ok
train --batch-tokens 128 ok
train --batch-tokens 1M ok
plan --batch-tokens 1M ok
plan --batch-tokens 4K ok
train --steps 1e1x unknown unit 'x'
train --beta1 0x10 --beta1 expects a number, got '0x10'
train --lr inf --lr expects a number, got 'inf'
train --lr nan --lr expects a number, got 'nan'
train --lr 1e --lr expects a number, got '1e'
train --micro-batch 0x4 --micro-batch: unknown unit 'x4'
train --micro-batch 2.5 --micro-batch expects a whole number, got '2.5'
train --micro-batch 4k --micro-batch: unknown unit 'k' in '4k' (units: K M G)
train --steps 3000000000 --steps must be between 0 and 2147483647, got '3000000000'
train --steps 4G --steps must be between 0 and 2147483647, got '4G'
train --steps -1 --steps must be between 0 and 2147483647, got '-1'
train --batch-tokens 2000G --batch-tokens must be between 1 and 1099511627776, got '2000G'
train --seed 9223372036854775807 ok
train --seed 9223372036854775808 --seed must be between 0 and 9223372036854775807
train --warmup 1e2 ok
plan --gpus 99999999999 --gpus must be between 1 and 16777216, got '99999999999'
plan --gpus 0x10 --gpus: unknown unit 'x10'
plan --batch-tokens 0x10 --batch-tokens: unknown unit 'x10'
plan --batch-tokens 4.5 --batch-tokens expects a whole number, got '4.5'
plan --batch-tokens 2000T --batch-tokens: unknown unit 'T' in '2000T' (units: K M G)
plan --max-tp 1K ok
plan --zero 4 --zero must be between 0 and 3, got '4'
EOF
# K, M, G are powers of two: --batch-tokens 4K is 4096 tokens, 32 micro-batches of 4 x 32
out=$($TRAIN "${tiny[@]}" --batch-tokens 4K 2>&1)
grep -q "^batch: 4096 tokens per step = 32 micro-batch(es)" <<<"$out" || bad "--batch-tokens 4K is not 4096 tokens: $(grep '^batch' <<<"$out")"

# bench-comm's sizes double from --min-bytes, each rounded to whole parts a rank; two that round alike
# are measured once (reduce-scatter over 3 ranks, fp32: 8 and 16 bytes both give 12)
out=$($TRAIN bench-comm --nproc 3 --op reduce_scatter --max-bytes 256 --iters 2 2>&1) || bad "bench-comm --nproc 3 failed: $out"
sizes=$(awk '$1 == "reduce_scatter" { printf "%s ", $2 }' <<<"$out")
[ "$sizes" = "12 24 60 120 252 " ] || bad "bench-comm reduce_scatter sizes over 3 ranks: '$sizes', expected 12 24 60 120 252"

# --- defaults from the data
out=$($TRAIN --layers 1 --channels 32 --heads 4 --seq-len 16 --micro-batch 1 --steps 1 --train "$D/train.bin" 2>&1) || bad "training without --vocab failed"
grep -q "V=256 Vp=256" <<<"$out" || bad "the vocabulary is not the tokenizer's 256: $(grep '^llm4d' <<<"$out")"
grep -q "^note: vocabulary 256 from the tokenizer beside the training data" <<<"$out" || bad "no note on the vocabulary"
out=$($TRAIN --layers 1 --channels 32 --heads 4 --seq-len 16 --micro-batch 1 --steps 1 --vocab 1000 --train "$D/train.bin" 2>&1) || bad "--vocab 1000 failed"
grep -q "^warning: the model's vocabulary is 1000 but the tokenizer's is 256: samples print" <<<"$out" || bad "no warning on the vocabularies"
# --steps 0 with --train (an initialisation to save) takes the same vocabulary, so the file it saves
# starts the run that trains on that data, and a --train that matches nothing is refused
out=$($TRAIN --layers 1 --channels 32 --heads 4 --seq-len 16 --steps 0 --train "$D/train.bin" --save-model "$W/init0.bin" 2>&1) ||
    bad "--steps 0 --train --save-model failed"
grep -q "V=256 Vp=256" <<<"$out" || bad "--steps 0: the vocabulary is not the tokenizer's 256: $(grep '^llm4d' <<<"$out")"
out=$($TRAIN --layers 1 --channels 32 --heads 4 --seq-len 16 --steps 0 --train "$W/none*.bin" 2>&1) && bad "--steps 0 took a --train that matches nothing"
grep -q "^error: --train: no file matches $W/none\*.bin" <<<"$out" || bad "--steps 0, no --train files: $out"
# without a tokenizer beside the shards: GPT-2's 50257, and no note
mkdir -p "$W/bare" && cp "$D/train.bin" "$W/bare/"
out=$($TRAIN --layers 1 --channels 32 --heads 4 --seq-len 16 --micro-batch 1 --steps 1 --train "$W/bare/train.bin" 2>&1) || bad "training on bare shards failed"
grep -q "V=50257" <<<"$out" && ! grep -q "^note: vocabulary" <<<"$out" || bad "bare shards: $(grep -E '^(llm4d|note)' <<<"$out")"
# the default model on this machine: one warning before the first step (which the fault injection ends)
out=$(LLM4D_FAULT=rank=0,step=1 $TRAIN --train "$D/train.bin" --steps 1 2>&1)
grep -q "^warning: the default model (d12, .* parameters) needs about [0-9]* s a step here" <<<"$out" || bad "no warning on the default model: $out"
grep -q '^step ' <<<"$out" && bad "the default model's warning came after a step"
grep -q "on $(nproc) core(s)" <<<"$out" || bad "the default model's warning does not count this machine's $(nproc) cores: $out"
# --threads 1 holds the step to one core: the estimate says so
if [ "$(nproc)" -gt 1 ]; then
    out=$(LLM4D_FAULT=rank=0,step=1 $TRAIN --train "$D/train.bin" --steps 1 --threads 1 2>&1)
    grep -q "needs about [0-9]* s a step here .* on 1 core(s)" <<<"$out" || bad "--threads 1: the warning counts other cores: $out"
fi
out=$($TRAIN --layers 1 --channels 32 --heads 4 --seq-len 16 --micro-batch 1 --steps 1 --train "$D/train.bin" 2>&1)
grep -q "default model" <<<"$out" && bad "a small model is warned about"
exit $fail
