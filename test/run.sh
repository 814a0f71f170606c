#!/usr/bin/env bash
# llm4d's test runner: every test is a function below, registered with its group by run_test at the
# end; each prints "ok NAME (its wall and CPU seconds)" or "FAIL NAME" (with its log), and the last line
# is "N passed, N failed" (", N skipped" when a prerequisite is missing). Run from the repository root
# after `make test-bins` (make test does).
# Usage: test/run.sh              every test
#        test/run.sh GROUP        one group, or several as an alternation: test/run.sh 'kernels|cli'
#        test/run.sh PATTERN      any other PATTERN: the tests whose function name or description it
#                                 matches (an extended regular expression, case-insensitive), e.g.
#                                 test/run.sh 't_data_parallel$'
#        test/run.sh --list       every test as "GROUP FUNCTION DESCRIPTION", one line each, running none;
#                                 --list GROUP or --list PATTERN: the tests that would run
# `make test T=...` passes T on. A PATTERN that matches a whole group name selects by group and by
# function name only (not by description), so that `comm` is not every test that mentions it.
# The groups, by what they test:
#   kernels  compute ops: unit tests, GEMM and attention index arithmetic, attention against PyTorch
#   emu      the real CUDA sources on the emulated GPU (emu/): kernels, checker, training, CUDA IPC
#   model    one rank's training against PyTorch and itself: shapes, bf16, accumulation, determinism
#   data     the tokenizers of ./train prepare (GPT-2's BPE, bpe:N) against tiktoken and HF tokenizers
#   cli      the command line and its outputs: prepare, bad input, --profile, plot.py, stragglers, safe files
#   comm     the collectives: every op on 1-8 ranks, device memory, two simulated nodes, failure modes
#   dp tp pp cp   each parallel axis (and its layouts with the others) against one rank
#   memory   bytes per rank: activations, ZeRO, TP, CP, recompute, the memory inventory
#   plan     ./train plan against its formulas, its bad input, --exact, plan comm
#   ckpt     checkpoints, restarts, SIGTERM, --skip-spikes
#   slurm    a local Slurm cluster (srun, sbatch, SIGUSR1); needs root
#   verbs    RDMA verbs: absent, and on soft-RoCE in a QEMU guest
#   build    the Makefile: a missing build package named in one line
#   layers   the include chain of DESIGN.md's layers (scripts/check_layers.py), and its self-test
set -uo pipefail
LIST=0 FILTER=
case "${1:-}" in
--list) LIST=1 FILTER=${2:-} ;;
-*) echo "test/run.sh: unknown option '$1' (usage: test/run.sh [--list] [GROUP | PATTERN])"; echo "0 passed, 1 failed"; exit 1 ;;
*) FILTER=${1:-} ;;
esac
cd "$(dirname "$0")/.."
TRAIN=./train
ASAN=./build/train-asan
PY=/usr/bin/python3
WORK=$(mktemp -d /tmp/llm4d-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
CORPUS=/usr/share/common-licenses/GPL-3 # in Debian's base-files: on every Debian machine
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
passed=0 failed=0 skipped=0 listed=0

# The groups run_test registers tests under (the table above); a FILTER that matches one of them whole
# selects by group, so `run.sh comm` does not also pick the planner's test for mentioning communication.
TEST_GROUPS="kernels emu model cli data comm dp tp pp cp memory plan ckpt slurm verbs build layers"
BY_GROUP=0
if [ -n "$FILTER" ]; then
    grep -qE -- "$FILTER" <<<"" 2>/dev/null
    if [ $? -eq 2 ]; then echo "test/run.sh: '$FILTER' is not an extended regular expression"; echo "0 passed, 1 failed"; exit 1; fi
    for g in $TEST_GROUPS; do grep -qixE -- "$FILTER" <<<"$g" && BY_GROUP=1; done
fi

selected() { # group function description
    if [ -z "$FILTER" ]; then return 0; fi
    # naming a group: that group, and the tests whose function name matches (T='layers|t_unit')
    if [ $BY_GROUP -eq 1 ]; then grep -qixE -- "$FILTER" <<<"$1" || grep -qiE -- "$FILTER" <<<"$2"; return; fi
    grep -qiE -- "$FILTER" <<<"$2" || grep -qiE -- "$FILTER" <<<"$3"
}

run_test() { # group function description
    local group=$1 fn=$2 name=$3 log="$WORK/$2.log"
    case " $TEST_GROUPS " in
    *" $group "*) ;;
    *) echo "FAIL $name: $fn's group '$group' is none of: $TEST_GROUPS"; failed=$((failed + 1)); return 0 ;;
    esac
    selected "$group" "$fn" "$name" || return 0
    if [ $LIST -eq 1 ]; then printf '%-7s %-25s %s\n' "$group" "$fn" "$name"; listed=$((listed + 1)); return 0; fi
    # wall and CPU seconds (this shell's children included) per test: where the suite's time goes
    local TIMEFORMAT='%R %U %S' took rc
    { time "$fn" >"$log" 2>&1; } 2>"$log.time" && rc=0 || rc=$?
    took=$(awk '{ printf "%.0f s, cpu %.0f s", $1, $2 + $3 }' "$log.time" 2>/dev/null)
    if [ $rc -eq 0 ]; then
        echo "ok $name ($took)"
        passed=$((passed + 1))
    elif [ $rc -eq 77 ]; then
        echo "skipped $name: $(tail -n 1 "$log")"
        skipped=$((skipped + 1))
    else
        echo "FAIL $name"
        sed 's/^/    /' "$log" | tail -n 40
        echo "    (alone: bash test/run.sh '^$fn\$' after make test-bins, or make test T='^$fn\$')"
        failed=$((failed + 1))
    fi
}

# Runs CMD every 0.1 s until it succeeds (CMD looks for the event itself: a log line, a file), for at
# most 60 s, a bound for a run that never gets there; its output goes nowhere. Status 0 once it has.
await_true() {
    local i
    for i in $(seq 1 600); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}

have_torch() { $PY -c 'import torch, numpy' 2>/dev/null || { echo "python3-torch is not installed (scripts/deps.sh as root installs it)"; return 77; }; }

# a tiny model shape used by the command-line tests
TINY=(--layers 2 --channels 32 --heads 4 --vocab 256 --seq-len 32)
DATA=$WORK/data

prepare() { $TRAIN prepare "$CORPUS" "$DATA" >/dev/null; }

# ---------------------------------------------------------------------------------------------

t_unit() { ./build/test_unit; }
t_gemm_host() { ./build/test_gemm; }
t_attention_host() { ./build/test_attention; }
t_emu_sm90() {
    [ -x ./build/test_emu_sm90 ] || { echo "no C++ compiler: build/test_emu_sm90 not built"; return 77; }
    ./build/test_emu_sm90
}

t_prepare_roundtrip() {
    have_torch || return $?
    $PY - "$CORPUS" "$DATA" <<'EOF'
import sys, numpy as np
text = open(sys.argv[1], "rb").read()
def shard(p):
    b = open(p, "rb").read()
    h = np.frombuffer(b[:1024], dtype=np.int32)
    assert h[0] == 20240520 and h[1] == 1, h[:3]
    t = np.frombuffer(b[1024:], dtype=np.uint16)
    assert len(t) == h[2]
    return t
nval = len(text) // 10
tr, va = shard(sys.argv[2] + "/train.bin"), shard(sys.argv[2] + "/val.bin")
assert bytes(tr.astype(np.uint8)) == text[:len(text) - nval], "train.bin differs from the first 90% of the bytes"
assert bytes(va.astype(np.uint8)) == text[len(text) - nval:], "val.bin differs from the last 10% of the bytes"
tok = open(sys.argv[2] + "/tokenizer.bin", "rb").read()
h = np.frombuffer(tok[:1024], dtype=np.int32)
assert h[0] == 20240328 and h[2] == 256
body = tok[1024:]
assert all(body[2 * i] == 1 and body[2 * i + 1] == i for i in range(256)), "tokenizer is not byte-level"
print("prepare round trip ok")
EOF
    # into a directory whose parents do not exist yet (the README's data/mine in a fresh checkout): the same files
    $TRAIN prepare "$CORPUS" "$WORK/fresh/data/mine" >/dev/null || { echo "prepare into new parent directories failed"; return 1; }
    local f
    for f in train.bin val.bin tokenizer.bin; do
        cmp "$DATA/$f" "$WORK/fresh/data/mine/$f" || { echo "prepare into new parent directories: $f differs"; return 1; }
    done
}

# ---- tokenizers (prepare.c, tokenizer.c): ids against tiktoken and HF tokenizers (test/tokenizer_ref.py)
# ../shared/data next to the repository (../../shared/data from a worktree in a folder of worktrees):
# GPT-2's encoder.json and vocab.bpe and tinyshakespeare, reference data for the tests only
SHARED=../shared/data
[ -d "$SHARED" ] || [ ! -d ../../shared/data ] || SHARED=../../shared/data
GPT2=$SHARED/gpt2
SHAKES=$SHARED/tinyshakespeare.txt
TOKREF=test/tokenizer_ref.py
have_gpt2() {
    [ -f "$GPT2/encoder.json" ] && [ -f "$GPT2/vocab.bpe" ] && [ -f "$SHAKES" ] ||
        { echo "$SHARED (GPT-2's files, tinyshakespeare) is not there"; return 77; }
    $PY -c 'import numpy, regex' 2>/dev/null || { echo "python3-numpy or regex is not installed (scripts/deps.sh)"; return 77; }
    $PY -c 'import tiktoken' 2>/dev/null || $PY -c 'import tokenizers' 2>/dev/null ||
        { echo "neither tiktoken nor tokenizers is installed for $PY (scripts/deps.sh installs them from PyPI)"; return 77; }
}
G2=(--tokenizer gpt2 --bpe-encoder "$GPT2/encoder.json" --bpe-merges "$GPT2/vocab.bpe")

# GPT-2's ids on tinyshakespeare, every license text and the stress text (CJK, emoji, combining marks,
# RTL, digits of many scripts, runs of spaces, tabs and newlines, capital contractions, NUL bytes,
# invalid UTF-8), one document each, against both references
t_token_gpt2_ids() {
    have_gpt2 || return $?
    local d=$WORK/tok
    mkdir -p "$d"
    $PY $TOKREF stress "$d/stress.txt" || return 1
    local inputs=("$SHAKES" /usr/share/common-licenses/* "$d/stress.txt.valid" "$d/stress.txt")
    $TRAIN prepare "${G2[@]}" --shard-tokens 100000 --threads 2 "${inputs[@]}" "$d/out" || return 1
    $PY $TOKREF gpt2 "$GPT2/encoder.json" "$GPT2/vocab.bpe" "$d/out" "${inputs[@]}" || return 1
    $PY $TOKREF roundtrip "$d/out" "${inputs[@]}" || return 1
    # --tokenizer FILE: the merges recovered from the tokenizer file alone (what --prompt encodes with) give
    # the same shards and the same tokenizer file, under ASan; a 6000-byte piece takes the long-piece merge path
    head -c 6000 /dev/zero | tr '\0' 'a' >"$d/long.txt"
    $TRAIN prepare "${G2[@]}" --shard-tokens 100000 "${inputs[@]}" "$d/long.txt" "$d/out2" >/dev/null || return 1
    $ASAN prepare --tokenizer "$d/out/tokenizer.bin" --shard-tokens 100000 "${inputs[@]}" "$d/long.txt" "$d/file" >/dev/null || return 1
    local f
    for f in "$d/out2"/*; do cmp "$f" "$d/file/${f##*/}" || { echo "--tokenizer FILE and gpt2's two files differ in ${f##*/}"; return 1; }; done
}

# --threads 1 and 2 give the same bytes, on one document of many chunks (tinyshakespeare x 5, 5.6 MB) and
# on a single 2 MB line (cut at spaces only), and both equal tiktoken (the cuts between chunks are the pattern's)
t_token_threads() {
    have_gpt2 || return $?
    local d=$WORK/tokth th
    mkdir -p "$d"
    for _ in 1 2 3 4 5; do cat "$SHAKES"; done >"$d/big.txt"
    for _ in 1 2; do tr '\n' ' ' <"$SHAKES"; done >"$d/line.txt"
    for th in 1 2; do
        $TRAIN prepare "${G2[@]}" --threads $th --shard-tokens 1000000 "$d/big.txt" "$d/line.txt" "$d/o$th" >/dev/null || return 1
    done
    local f n=0
    for f in "$d/o1"/*; do cmp "$f" "$d/o2/${f##*/}" || { echo "--threads 1 and 2 differ in ${f##*/}"; return 1; }; n=$((n + 1)); done
    [ "$n" -ge 4 ] || { echo "expected several shards, got $n files"; return 1; }
    $PY $TOKREF gpt2 "$GPT2/encoder.json" "$GPT2/vocab.bpe" "$d/o2" "$d/big.txt" "$d/line.txt"
}

# the inputs users have: JSON Lines (--text-field, escapes, \u0000), standard input, a directory, a glob;
# --val-tokens (the first N) and llm.c's shard names; --skip-bad-lines
t_token_inputs() {
    have_gpt2 || return $?
    local d=$WORK/tokin
    mkdir -p "$d/dir/sub"
    $PY - "$d" <<'PY' || return 1
import json, sys
d = sys.argv[1]
docs = ["First document.\nIt's short.", "Zweites Dokument: äöü ß \u4e2d\u6587 😀", "with\u0000nul and \"quotes\" \\ and \t tab", "", " lead space"]
with open(d + "/a.jsonl", "w") as f:
    for i, t in enumerate(docs):
        f.write(json.dumps({"id": i, "text": t, "other": "x"}) + "\n")
        if i == 1:
            f.write("\n")  # a blank line is no document
for i, t in enumerate(docs):
    open(f"{d}/j{i}.txt", "wb").write(t.encode())
for i, t in enumerate(docs):
    open(f"{d}/doc{i}.txt", "wb").write((t or "x").encode())
with open(d + "/bad.jsonl", "w") as f:
    f.write(json.dumps({"text": "good one " * 10}) + "\n[1, 2]\n{\"txt\": \"no field\"}\n{\"text\": 5}\n{broken\n" + json.dumps({"text": "good two " * 10}) + "\n")
open(d + "/good.jsonl", "w").write(json.dumps({"text": "good one " * 10}) + "\n" + json.dumps({"text": "good two " * 10}) + "\n")
PY
    # JSON Lines: the decoded strings are the documents
    $TRAIN prepare "${G2[@]}" --text-field text --val-tokens 3 --shard-tokens 7 --name tiny "$d/a.jsonl" "$d/j" >/dev/null || return 1
    $PY - "$d" <<'PY' || return 1
import sys, os
d = sys.argv[1]
names = sorted(os.listdir(d + "/j"))
assert names[0] == "tiny_train_000001.bin" and "tiny_val_000000.bin" in names and "tokenizer.bin" in names, names
import numpy as np
v = np.frombuffer(open(d + "/j/tiny_val_000000.bin", "rb").read()[:1024], dtype=np.int32)[:3]
assert v[2] == 3, v
PY
    $PY $TOKREF gpt2 "$GPT2/encoder.json" "$GPT2/vocab.bpe" "$d/j" "$d"/j{0,1,2,3,4}.txt || return 1
    # standard input, a directory (recursive, name order), a glob
    cp "$d/doc1.txt" "$d/dir/b.txt"; cp "$d/doc2.txt" "$d/dir/a.txt"; cp "$d/doc4.txt" "$d/dir/sub/c.txt"; cp "$d/doc0.txt" "$d/dir/.hidden"
    $TRAIN prepare "${G2[@]}" --shard-tokens 1000 - "$d/dir" "$d/doc[34].txt" "$d/s" <"$d/doc0.txt" >/dev/null || return 1
    $PY $TOKREF gpt2 "$GPT2/encoder.json" "$GPT2/vocab.bpe" "$d/s" "$d"/doc0.txt "$d"/dir/a.txt "$d"/dir/b.txt "$d"/dir/sub/c.txt "$d"/doc3.txt "$d"/doc4.txt || return 1
    # --skip-bad-lines: the good lines, a warning for each bad one
    local err
    err=$($TRAIN prepare "${G2[@]}" --text-field text --skip-bad-lines --val-tokens 2 --shard-tokens 1000 "$d/bad.jsonl" "$d/k" 2>&1 >/dev/null) || return 1
    [ "$(grep -c 'skipped$' <<<"$err")" -eq 4 ] || { echo "want 4 skipped-line warnings, got: $err"; return 1; }
    grep -q 'bad.jsonl:2: not a JSON object: skipped' <<<"$err" || { echo "no warning naming bad.jsonl:2: $err"; return 1; }
    $TRAIN prepare "${G2[@]}" --text-field text --val-tokens 2 --shard-tokens 1000 "$d/good.jsonl" "$d/kk" >/dev/null || return 1
    for f in "$d/kk"/*; do cmp "$f" "$d/k/${f##*/}" || { echo "--skip-bad-lines output differs from the good lines' in ${f##*/}"; return 1; }; done
}

# bpe:N: the learned merges equal HF BpeTrainer's and a plain reference trainer's (test/tokenizer_ref.py,
# the tie rule of tokenizer.h); decode(encode(x)) == x on everything; HF reads the two files it writes
# and gives the same ids; --threads 1 and 2 learn and write the same bytes
t_bpe_train() {
    have_gpt2 || return $?
    local d=$WORK/bpe
    mkdir -p "$d"
    $TRAIN prepare --tokenizer bpe:400 --threads 2 /usr/share/common-licenses/GPL-3 "$d/gpl" >/dev/null || return 1
    $PY $TOKREF merges "$d/gpl" /usr/share/common-licenses/GPL-3 400 || return 1
    $PY $TOKREF stress "$d/stress.txt" || return 1
    local inputs=("$SHAKES" /usr/share/common-licenses/* "$d/stress.txt")
    for th in 1 2; do
        $TRAIN prepare --tokenizer bpe:2000 --threads $th --shard-tokens 300000 "${inputs[@]}" "$d/o$th" >/dev/null || return 1
    done
    for f in "$d/o1"/*; do cmp "$f" "$d/o2/${f##*/}" || { echo "bpe:2000 --threads 1 and 2 differ in ${f##*/}"; return 1; }; done
    $PY $TOKREF roundtrip "$d/o2" "${inputs[@]}" || return 1
    $TRAIN prepare --tokenizer bpe:1000 "$SHAKES" "$d/sh" >/dev/null || return 1
    $PY $TOKREF merges "$d/sh" "$SHAKES" 1000 || return 1
    $TRAIN prepare --tokenizer "$d/sh/tokenizer.bin" "$SHAKES" "$d/again" >/dev/null || return 1
    for f in train.bin val.bin tokenizer.bin; do
        cmp "$d/sh/$f" "$d/again/$f" || { echo "bpe:1000's tokenizer file as --tokenizer FILE gives another $f"; return 1; }
    done
    # and the byte tokenizer's file: the bytes, without an end-of-text token before each document
    $TRAIN prepare "$SHAKES" "$d/by" >/dev/null && $TRAIN prepare --tokenizer "$d/by/tokenizer.bin" "$SHAKES" "$d/by2" >/dev/null || return 1
    for f in train.bin val.bin tokenizer.bin; do
        cmp "$d/by/$f" "$d/by2/$f" || { echo "the byte tokenizer's file as --tokenizer FILE gives another $f"; return 1; }
    done
    $PY $TOKREF hfload "$d/sh" "$SHAKES"
}

# Bad input: one line naming the file (and line), a non-zero exit, and nothing left behind
t_token_bad_input() {
    have_gpt2 || return $?
    local d=$WORK/tokbad ok=0
    mkdir -p "$d/emptydir" "$d/out_existing"
    : >"$d/empty.txt"
    echo "some text to prepare, long enough for a split" >"$d/t.txt"
    head -c 100000 "$GPT2/encoder.json" >"$d/trunc.json"
    { cat "$GPT2/vocab.bpe"; printf 'Ġthe Ġcat\n'; } >"$d/disagree.bpe"
    printf 'Ġthe\n' >"$d/onefield.bpe"
    $PY -c 'import json,sys; print(json.dumps({"text": "fine"})); print("[1]")' >"$d/notobj.jsonl"
    $PY -c 'import json,sys; print(json.dumps({"text": "fine"})); print(json.dumps({"body": "x"}))' >"$d/nofield.jsonl"
    $PY - "$d/late.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(60000):  # ~ 6 MB of good lines, batches written, then a bad one
        f.write(json.dumps({"text": f"line {i} of a long file with words in it, enough for many chunks. " * 2}) + "\n")
    f.write("not json\n")
PY
    echo "a file" >"$d/afile"
    local o=$d/o
    expect_error "prepare: --bpe-merges $d/disagree.bpe: line 50002 merges \"Ġthe\" and \"Ġcat\" into \"ĠtheĠcat\", which --bpe-encoder .* does not have (the two files disagree)" \
        prepare --tokenizer gpt2 --bpe-encoder "$GPT2/encoder.json" --bpe-merges "$d/disagree.bpe" "$d/t.txt" "$o" || ok=1
    expect_error "prepare: --bpe-merges $d/onefield.bpe: line 1 is not two tokens" \
        prepare --tokenizer gpt2 --bpe-encoder "$GPT2/encoder.json" --bpe-merges "$d/onefield.bpe" "$d/t.txt" "$o" || ok=1
    expect_error "prepare: --bpe-encoder $d/trunc.json: line 1, column [0-9]*: " \
        prepare --tokenizer gpt2 --bpe-encoder "$d/trunc.json" --bpe-merges "$GPT2/vocab.bpe" "$d/t.txt" "$o" || ok=1
    expect_error "prepare: $d/notobj.jsonl:2: not a JSON object (--skip-bad-lines goes on without it)" \
        prepare "${G2[@]}" --text-field text "$d/notobj.jsonl" "$o" || ok=1
    expect_error "prepare: $d/nofield.jsonl:2: no field \"text\"" prepare "${G2[@]}" --text-field text "$d/nofield.jsonl" "$o" || ok=1
    expect_error "prepare: $d/late.jsonl:60001: not JSON (column" prepare "${G2[@]}" --text-field text --threads 2 "$d/late.jsonl" "$o" || ok=1
    expect_error "prepare: the output directory $d/afile is a file" prepare "${G2[@]}" "$d/t.txt" "$d/afile" || ok=1
    expect_error "prepare: $d/empty.txt is empty" prepare "${G2[@]}" "$d/empty.txt" "$o" || ok=1
    expect_error "prepare: $d/emptydir is a directory, not a regular file, and has no files in it" prepare "$d/emptydir" "$o" || ok=1
    expect_error "prepare: no file matches $d/nothing\*.txt" prepare "$d/nothing*.txt" "$o" || ok=1
    expect_error "prepare: cannot open $d/missing.txt: No such file or directory" prepare "$d/missing.txt" "$o" || ok=1
    expect_error "prepare: --tokenizer bpe:65536: at most 65535 tokens" prepare --tokenizer bpe:65536 "$d/t.txt" "$o" || ok=1
    expect_error "prepare: --tokenizer bpe:256: at least 257 tokens" prepare --tokenizer bpe:256 "$d/t.txt" "$o" || ok=1
    expect_error "prepare: --tokenizer gpt2 needs --bpe-encoder encoder.json and --bpe-merges vocab.bpe" prepare --tokenizer gpt2 "$d/t.txt" "$o" || ok=1
    expect_error "prepare: --tokenizer bpe:N reads the input twice" prepare --tokenizer bpe:300 - "$o" || ok=1
    expect_error "prepare: unknown option --vocab" prepare --vocab 5 "$d/t.txt" "$o" || ok=1
    expect_error "prepare: --val-frac 1.5: expected a fraction between 0 and 1" prepare --val-frac 1.5 "$d/t.txt" "$o" || ok=1
    expect_error "prepare: the input gives 12 tokens, too few" prepare "${G2[@]}" "$d/t.txt" "$o" || ok=1
    [ ! -e "$o" ] || { echo "FAIL a failed prepare left $o: $(ls -a "$o")"; ok=1; }
    # into an existing directory: nothing new in it either
    expect_error "prepare: $d/late.jsonl:60001: not JSON" prepare "${G2[@]}" --text-field text "$d/late.jsonl" "$d/out_existing" || ok=1
    [ -z "$(ls -A "$d/out_existing")" ] || { echo "FAIL a failed prepare left files: $(ls -A "$d/out_existing")"; ok=1; }
    # an output that is also an input: prepare DIR DIR again, or DIR/train.bin into DIR; DIR stays as it was
    mkdir -p "$d/self" && cp "$CORPUS" "$d/self/corpus.txt" && $TRAIN prepare "$d/self" "$d/self" >/dev/null || { echo "FAIL prepare self"; ok=1; }
    local before
    before=$(cd "$d/self" && md5sum *)
    expect_error "prepare: the input $d/self/tokenizer.bin is $d/self/tokenizer.bin, an output of this run: writing it would destroy that input" \
        prepare "$d/self" "$d/self" || ok=1
    expect_error "prepare: the input $d/self/train.bin is $d/self/train.bin, an output of this run" prepare "$d/self/train.bin" "$d/self" || ok=1
    [ "$(cd "$d/self" && md5sum *)" = "$before" ] || { echo "FAIL: a refused prepare changed its inputs"; ok=1; }
    # GPT-2's files with two merged tokens' ids swapped: consistent with each other, but not in merge order
    $PY -c 'import json,sys; e=json.load(open(sys.argv[1])); inv={v:k for k,v in e.items()}; e[inv[256]],e[inv[300]]=300,256; json.dump(e,open(sys.argv[2],"w"))' \
        "$GPT2/encoder.json" "$d/swap.json" || ok=1
    expect_error "prepare: --bpe-merges $GPT2/vocab.bpe: line 3 makes .*, id 257 in --bpe-encoder $d/swap.json, not above the id 300 the merge before it makes: the ids must follow the merge order" \
        prepare --tokenizer gpt2 --bpe-encoder "$d/swap.json" --bpe-merges "$GPT2/vocab.bpe" "$d/t.txt" "$o" || ok=1
    # a tokenizer file whose end-of-text id is no token of it (each document would start with another)
    $PY -c 'import struct,sys; b=bytearray(open(sys.argv[1],"rb").read()); b[12:16]=struct.pack("<i",65536+65); open(sys.argv[2],"wb").write(b)' \
        "$d/self/tokenizer.bin" "$d/eot.bin" || ok=1
    expect_error "$d/eot.bin: the end-of-text id 65601 is not a token of its vocabulary of 256" prepare --tokenizer "$d/eot.bin" "$d/t.txt" "$o" || ok=1
    $TRAIN prepare --help | grep -q -- '--tokenizer byte|gpt2|bpe:N' || { echo "FAIL prepare --help"; ok=1; }
    return $ok
}

# A model with GPT-2's vocabulary (V = 50257) on GPT-2 tokens of tinyshakespeare: the loss falls and the
# samples decode to text through DIR/tokenizer.bin (2 layers here; README has the d12 run)
t_token_gpt2_train() {
    have_gpt2 || return $?
    local d=$WORK/tokgpt2
    $TRAIN prepare "${G2[@]}" "$SHAKES" "$d" >/dev/null || return 1
    $TRAIN --layers 2 --channels 64 --heads 4 --vocab 50257 --seq-len 32 --micro-batch 4 --train "$d/train.bin" --val "$d/val.bin" \
        --lr 1e-2 --steps 20 --warmup 2 --val-every 20 --sample-every 20 --sample-tokens 24 --top-k 10 --log "$d/log.jsonl" >"$d/out" || return 1
    local first last
    first=$(grep '"step":1,' "$d/log.jsonl" | grep -o '"loss":[0-9.e+-]*' | cut -d: -f2)
    last=$(grep '"val_loss"' "$d/log.jsonl" | tail -n 1 | grep -o '"val_loss":[0-9.e+-]*' | cut -d: -f2)
    echo "first loss $first, final val loss $last"
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 10 && b < a - 2.5) }' || { echo "the loss did not fall from ln 50257"; return 1; }
    # the sample: English words, no escaped bytes (tinyshakespeare is ASCII)
    local s
    s=$(sed -n '/^sample at step 20:/,/^---$/p' "$d/out" | sed '1d;$d')
    echo "sample: $s"
    [ "$(grep -oE '[A-Za-z]{2,}' <<<"$s" | wc -l)" -ge 3 ] && ! grep -q '\\x' <<<"$s" || { echo "the sample does not decode to text"; return 1; }
}

torch_ref() { have_torch || return $?; $PY test/torch_ref.py --train "$DATA/train.bin" --workdir "$WORK/$1" "${@:2}"; }
t_torch_c36() { torch_ref c36 --shape "--layers 2 --channels 36 --heads 3 --vocab 256 --seq-len 32" --seq-len 32 --micro-batch 2 --accum 2; }
t_torch_short_t() { torch_ref shortT --shape "--layers 2 --channels 32 --heads 4 --vocab 256 --max-seq-len 64" --seq-len 24 --micro-batch 3; }
t_torch_v200() { torch_ref v200 --shape "--layers 1 --channels 48 --heads 2 --vocab 200 --seq-len 16" --seq-len 16 --micro-batch 2 --accum 3; }
# at 1e-5 (gradients unchanged by the flash attention and the fused kernels): odd T below maxT with many
# heads of 4 channels; one head of 20 channels with T past a 32-row attention tile
t_torch_heads() {
    torch_ref heads --shape "--layers 2 --channels 32 --heads 8 --vocab 256 --max-seq-len 40" --seq-len 27 --micro-batch 2 \
        --tol-logits 1e-5 --tol-grads 1e-5
}
t_torch_one_head() {
    torch_ref onehead --shape "--layers 1 --channels 20 --heads 1 --vocab 256 --seq-len 45" --seq-len 45 --micro-batch 2 \
        --tol-logits 1e-5 --tol-grads 1e-5
}
BF16_SHAPE="--layers 2 --channels 36 --heads 3 --vocab 256 --seq-len 32"
t_torch_bf16() {
    torch_ref bf16 --shape "$BF16_SHAPE" --seq-len 32 --micro-batch 2 \
        --accum 2 --dtype bf16 --tol-logits 2e-2 --tol-grads 5e-2 --tol-loss 2e-3
}
# the fallback bf16 matmul path (bf16 widened to fp32), forced as users would force it
t_torch_bf16_generic() {
    have_torch || return $?
    LLM4D_CPU_ISA=generic $TRAIN $BF16_SHAPE --dtype bf16 --steps 0 | grep "bf16 matmuls: generic" || return 1
    LLM4D_CPU_ISA=generic torch_ref bf16g --shape "$BF16_SHAPE" --seq-len 32 --micro-batch 2 \
        --accum 2 --dtype bf16 --tol-logits 2e-2 --tol-grads 5e-2 --tol-loss 2e-3
}
# attention alone against PyTorch: the whole sequence, and the block ops on a zigzag split
t_attention_torch() { have_torch || return $?; $PY test/attention_ref.py ./build/attention_check; }
# the Llama family's CPU ops (RMSNorm, RoPE, SwiGLU, grouped-query attention with RoPE fused) against PyTorch
# token shards of both llm.c headers (uint16 GPT-2, uint32 Llama 3) written with numpy, read by ./train (--dump)
t_cli_ux() { bash test/cli_ux.sh $TRAIN "$WORK/ux"; }
t_sample_eval() { have_torch || return $?; $PY test/sample_eval.py $TRAIN "$WORK/se"; }

# sample without --seq-len on a Hugging Face Llama whose config allows 131072 positions (Llama 3.x's):
# the window is 1024, not 131072 (a forward over every position for each token, and gigabytes of
# activations); --seq-len still sets it
t_sample_long_context() {
    local d=$WORK/longctx out
    $TRAIN --model llama3-tiny --steps 0 --save-hf "$d" >/dev/null || return 1
    sed -i 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 131072/' "$d/config.json"
    grep -q '"max_position_embeddings": 131072' "$d/config.json" || { echo "could not set max_position_embeddings"; return 1; }
    out=$(timeout 120 $TRAIN sample --model "$d" --tokens 3 --threads 1 2>&1) || { echo "sample failed: $(tail -n 3 <<<"$out")"; return 1; }
    grep -q '1 micro-batch(es) of 4 x 1024 on each' <<<"$out" || { echo "default window: want 4 x 1024, got: $(grep batch: <<<"$out")"; return 1; }
    out=$(timeout 120 $TRAIN sample --model "$d" --tokens 3 --threads 1 --seq-len 96 2>&1) || { echo "sample --seq-len 96 failed"; return 1; }
    grep -q '1 micro-batch(es) of 4 x 96 on each' <<<"$out" || { echo "--seq-len 96: got: $(grep batch: <<<"$out")"; return 1; }
}
# sample from a checkpoint kept away from its data finds the tokenizer beside the training data the
# manifest records: the same text as with that --tokenizer named (and not the ids printed without one)
t_sample_recorded_tokenizer() {
    local d=$WORK/rectk a b
    mkdir -p "$d/data"
    cp "$DATA/train.bin" "$DATA/tokenizer.bin" "$d/data/"
    $TRAIN --train "$d/data/train.bin" --layers 1 --channels 32 --heads 2 --seq-len 32 --micro-batch 2 --batch-tokens 64 --steps 1 \
        --ckpt-dir "$d/ck" --ckpt-every 1 >/dev/null || return 1
    a=$($TRAIN sample --model "$d/ck/ckpt_00000001" --tokens 8 --seed 3 2>&1 | tail -n 1)
    b=$($TRAIN sample --model "$d/ck/ckpt_00000001" --tokens 8 --seed 3 --tokenizer "$d/data/tokenizer.bin" 2>&1 | tail -n 1)
    [ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAIL: without --tokenizer '$a', with it '$b'"; return 1; }
    mv "$d/data/tokenizer.bin" "$d/tk"
    b=$($TRAIN sample --model "$d/ck/ckpt_00000001" --tokens 8 --seed 3 2>&1 | tail -n 1)
    [ "$a" != "$b" ] || { echo "FAIL: the same output without any tokenizer: '$b'"; return 1; }
}
# eval (and validation) reads batches of distinct windows only: --batches beyond what --val holds is
# capped, with a note, to W / B batches (W = (tokens - 1) / T, from the shard's header), the same loss
t_eval_batches_cap() {
    local d=$WORK/evcap a b n w cap
    mkdir -p "$d"
    head -c $((1024 + 2 * 2001)) "$DATA/val.bin" >"$d/val.bin" # 2001 tokens: the header's count must say so
    $PY -c 'import sys, numpy as np
b = bytearray(open(sys.argv[1], "rb").read()); h = np.frombuffer(b[:1024], dtype=np.int32).copy(); h[2] = 2001
b[:1024] = h.tobytes(); open(sys.argv[1], "wb").write(b)' "$d/val.bin" || return 1
    $TRAIN --train "$DATA/train.bin" --layers 1 --channels 32 --heads 2 --seq-len 32 --micro-batch 4 --batch-tokens 128 --steps 1 \
        --save-model "$d/m.bin" >/dev/null || return 1
    w=$(( (2001 - 1) / 32 )) cap=$(( w / 4 )) # 62 windows, 15 batches of 4
    a=$($TRAIN eval --model "$d/m.bin" --val "$d/val.bin" --batches $((cap + 40)) 2>&1) || { echo "eval failed: $a"; return 1; }
    b=$($TRAIN eval --model "$d/m.bin" --val "$d/val.bin" --batches $cap 2>&1) || return 1
    grep -q "^note: --val holds $w window(s) of 32 tokens: $cap batch(es) of 4, not the $((cap + 40)) --batches asks for" <<<"$a" ||
        { echo "FAIL: no note of the cap: $(grep -E 'note|eval' <<<"$a")"; return 1; }
    [ "$(grep '^eval' <<<"$a")" = "$(grep '^eval' <<<"$b")" ] || { echo "FAIL: capped '$(grep '^eval' <<<"$a")' vs '$(grep '^eval' <<<"$b")'"; return 1; }
    grep -q "| $cap batch(es) of 4 x 32" <<<"$a" || { echo "FAIL: $(grep '^eval' <<<"$a")"; return 1; }
}
# A stop signal ends sample and eval where they are (between tokens, between batches), on every rank
# alike, with one line saying how far they got and exit 128 + the signal; SIGUSR1 (nothing to
# checkpoint) leaves them running. 1000 tokens of a 4-layer C 256 model (each a forward over the
# context so far) take about a minute: a run that ignored the signal would print them all and exit 0.
t_sample_stop() {
    local d=$WORK/sstop ok=0 pid st
    mkdir -p "$d"
    $TRAIN --layers 4 --channels 256 --heads 4 --vocab 256 --max-seq-len 1024 --steps 0 --save-model "$d/m.bin" >/dev/null || return 1
    stop_after_start() { # SIGNALS OUT CMD...: starts CMD, sends SIGNALS (a,b: in turn) once its header is out, waits; st = its status
        local sigs=$1 out=$2 sig
        shift 2
        "$@" >"$out" 2>"$out.err" &
        pid=$!
        await_true grep -q 'micro-batch(es) of' "$out" "$out.err" # until it has reported its shape
        for sig in ${sigs//,/ }; do kill -"$sig" $pid; done
        wait $pid
        st=$?
    }
    stop_after_start TERM "$d/s1" $TRAIN sample --model "$d/m.bin" --tokens 1000 --threads 1
    [ $st -eq 143 ] || { echo "FAIL: sample after SIGTERM: exit status $st (expected 143)"; ok=1; }
    grep -Eq '^received SIGTERM: the sample stopped after [0-9]+ of 1000 tokens$' "$d/s1.err" ||
        { echo "FAIL: sample: no stop line: $(tail -n 2 "$d/s1.err")"; ok=1; }
    # (eval reads distinct windows only: a shard of 400,000 tokens holds 97 batches of 4 x 1024)
    $PY -c 'import sys, numpy as np
b = open(sys.argv[1], "rb").read(); h = np.frombuffer(b[:1024], dtype=np.int32).copy()
t = np.resize(np.frombuffer(b[1024:], dtype=np.uint16), 400000); h[2] = len(t)
open(sys.argv[2], "wb").write(h.tobytes() + t.tobytes())' "$DATA/val.bin" "$d/val.bin" || return 1
    stop_after_start INT "$d/e1" $TRAIN eval --model "$d/m.bin" --val "$d/val.bin" --batches 1000 --threads 1
    [ $st -eq 130 ] || { echo "FAIL: eval after SIGINT: exit status $st (expected 130)"; ok=1; }
    grep -Eq '^received SIGINT: eval stopped after [0-9]+ of 97 batches' "$d/e1.err" ||
        { echo "FAIL: eval: no stop line: $(tail -n 2 "$d/e1.err")"; ok=1; }
    grep -q '^eval ' "$d/e1" && { echo "FAIL: eval printed a loss line for the batches it did not run"; ok=1; }
    # two pipeline stages: the launcher passes SIGUSR1 and SIGTERM on, the ranks ignore the first and
    # stop at the same token on the second (a rank that went on alone would wait for the other's
    # activations until --comm-timeout; one that stopped on SIGUSR1 would say so and exit 138). Not
    # under timeout(1): it signals its child and its process group, and a second signal ends a rank.
    stop_after_start USR1,TERM "$d/s2" $TRAIN sample --model "$d/m.bin" --tokens 1000 --threads 1 --nproc 2 --pp 2 --comm-timeout 100
    [ $st -eq 143 ] || { echo "FAIL: sample --pp 2 after SIGTERM: exit status $st (expected 143)"; ok=1; }
    [ "$(grep -Ec '^received SIGTERM: the sample stopped after [0-9]+ of 1000 tokens$' "$d/s2.err")" = 1 ] ||
        { echo "FAIL: sample --pp 2: want one stop line: $(tail -n 3 "$d/s2.err")"; ok=1; }
    grep -q 'timed out\|rank . failed' "$d/s2.err" && { echo "FAIL: sample --pp 2: $(grep -m1 'timed out\|failed' "$d/s2.err")"; ok=1; }
    return $ok
}
t_shards_u32() { $PY -c 'import numpy' 2>/dev/null || { echo "python3-numpy is not installed"; return 77; }; $PY test/shards_u32.py $TRAIN "$WORK/u32"; }
t_llama_kernels() { have_torch || return $?; $PY test/llama_ref.py ./build/llama_check; }
# the Llama family end to end against a PyTorch Llama written from the published architecture (test/llama_model_ref.py)
llama_ref() { have_torch || return $?; $PY test/llama_model_ref.py --train "$DATA/train.bin" --workdir "$WORK/$1" "${@:2}"; }
t_llama_torch() { llama_ref tiny --seq-len 32 --micro-batch 2 --accum 2; } # GQA 4 heads / 2 kv heads, untied head
# llama3.2-1b shrunk: its tied head and Llama 3.1's RoPE frequency scaling (factor 32), at T = 64
t_llama_torch_scaled() {
    llama_ref scaled --shape "--model llama3.2-1b --layers 2 --channels 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 256 --max-seq-len 64" \
        --seq-len 64 --micro-batch 1
}
t_llama_torch_tied_mqa() { # one kv head, the tied head, odd T past a 32-row attention tile, F not a multiple of 8
    llama_ref mqa --shape "--arch llama --layers 2 --channels 48 --heads 6 --kv-heads 1 --ffn 100 --vocab 200 --tie-embeddings 1 --rope-theta 10000 --norm-eps 1e-6" \
        --seq-len 37 --micro-batch 2
}
t_llama_torch_recompute() {
    llama_ref rcs --seq-len 32 --micro-batch 2 --accum 2 --extra "--recompute selective" || return 1
    llama_ref rcf --seq-len 32 --micro-batch 2 --accum 2 --extra "--recompute full"
}
# The layouts against one rank for llama3-tiny (GQA, untied head): models from the checkpoints (ckpt_model.py,
# a Llama has no --save-model); DP 2 x ZeRO 0-3 (stages bitwise), PP 2 under 1f1b and zb-h1 (with full recompute),
# interleaved PP 2 x V 2 on 4 layers, and the tied head across PP stages
LFLAGS=(--seq-len 32 --micro-batch 2 --batch-tokens 256 --steps 4 --lr 1e-3 --warmup 1 --weight-decay 0.1 --clip 1.0
        --bucket-mb 0.02 --comm-timeout 60)
lrun() { # name flags...: a run checkpointed at its last step, its model in $WORK/llama/name.bin
    local d=$WORK/llama n=$1; shift
    mkdir -p "$d"; rm -rf "$d/$n.ck"
    timeout 300 $TRAIN "${LFLAGS[@]}" --train "$DATA/train.bin" --log "$d/$n.jsonl" --ckpt-dir "$d/$n.ck" --ckpt-every 4 "$@" \
        >"$d/$n.out" 2>&1 || { echo "$n failed"; tail -3 "$d/$n.out"; return 1; }
    $PY test/ckpt_model.py "$d/$n.ck/ckpt_00000004" "$d/$n.bin"
}
# --rope-scaling: written as HF's rope_type llama3 into --save-hf's config.json (which t_hf_transformers
# checks transformers reads the same way), active (the trained weights differ from plain RoPE's), "none"
# turns a preset's off; one line on bad values and for GPT-2
t_llama_rope_scaling() {
    local d=$WORK/ropesc
    mkdir -p "$d"
    local base=(--arch llama --layers 2 --channels 32 --heads 4 --kv-heads 2 --vocab 256 --seq-len 64 --micro-batch 2 --steps 1
        --train "$DATA/train.bin")
    $TRAIN "${base[@]}" --save-hf "$d/plain" >/dev/null || return 1
    $TRAIN "${base[@]}" --rope-scaling 8,1,4,16 --save-hf "$d/sc" >/dev/null || return 1
    $TRAIN --model llama3.2-1b --layers 1 --channels 64 --heads 2 --kv-heads 1 --ffn 64 --vocab 256 --seq-len 16 --micro-batch 1 \
        --steps 0 --rope-scaling none --save-hf "$d/off" >/dev/null || return 1
    $PY - "$d" <<'PY' || return 1
import json, sys
d = sys.argv[1]
r = json.load(open(d + "/sc/config.json")).get("rope_scaling")
want = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
assert r is not None and all(r.get(k) == v for k, v in want.items()), f"rope_scaling {r}, want {want}"
for n in ("plain", "off"):
    assert json.load(open(f"{d}/{n}/config.json")).get("rope_scaling") is None, n
PY
    cmp -s "$d/plain/model.safetensors" "$d/sc/model.safetensors" && { echo "FAIL --rope-scaling changed nothing"; return 1; }
    local bad out
    for bad in 0.5 8,4,1 x 8,1,4,16,3; do
        out=$($TRAIN "${base[@]}" --rope-scaling "$bad" 2>&1) && { echo "FAIL --rope-scaling $bad accepted"; return 1; }
        [ "$(wc -l <<<"$out")" = 1 ] && grep -q -- "--rope-scaling" <<<"$out" || { echo "FAIL --rope-scaling $bad: $out"; return 1; }
    done
    out=$($TRAIN --layers 2 --channels 32 --heads 4 --vocab 256 --rope-scaling 8 --steps 0 2>&1) && { echo "FAIL GPT-2 took it"; return 1; }
    grep -q "Llama family" <<<"$out" || { echo "FAIL GPT-2: $out"; return 1; }
    # the ends of --norm-eps's range are taken (1e-12 is a float just below the double 1e-12)
    $TRAIN "${base[@]}" --norm-eps 1e-12 >/dev/null 2>&1 && $TRAIN "${base[@]}" --norm-eps 1 >/dev/null 2>&1 ||
        { echo "FAIL: --norm-eps 1e-12 or 1 refused: $($TRAIN "${base[@]}" --norm-eps 1e-12 2>&1 | tail -1)"; return 1; }
    # a checkpoint of another scaling: refused, naming both scalings
    $TRAIN "${base[@]}" --rope-scaling 8,1,4,16 --ckpt-dir "$d/ck" >/dev/null || return 1
    out=$($TRAIN "${base[@]}" --steps 2 --ckpt-dir "$d/ck" --resume 2>&1) && { echo "FAIL: resumed without the scaling"; return 1; }
    grep -q "rope scaling 8,1,4,16; this run: .*, none)" <<<"$out" || { echo "FAIL: the refusal does not name the scalings: $out"; return 1; }
    # a second --init-from-hf run into that run's --ckpt-dir: told the flags that resume it, which do
    local hf=(--train "$DATA/train.bin" --micro-batch 2 --seq-len 64)
    $TRAIN --init-from-hf "$d/sc" "${hf[@]}" --steps 1 --ckpt-dir "$d/ck2" >/dev/null || return 1
    out=$($TRAIN --init-from-hf "$d/sc" "${hf[@]}" --steps 2 --ckpt-dir "$d/ck2" 2>&1) && { echo "FAIL: a fresh start over checkpoints"; return 1; }
    local flags
    flags=$(sed -n 's/.*pass --resume in place of --init-from-hf, with its shape as flags (\(.*\)), to continue.*/\1/p' <<<"$out")
    [ -n "$flags" ] || { echo "FAIL: no shape flags in: $out"; return 1; }
    read -ra flags <<<"$flags"
    out=$($TRAIN "${flags[@]}" "${hf[@]}" --steps 2 --ckpt-dir "$d/ck2" --resume 2>&1) || { echo "FAIL: resuming with ${flags[*]}: $out"; return 1; }
    grep -q "^resumed from $d/ck2/ckpt_00000001: step 1" <<<"$out" || { echo "FAIL: did not resume: $out"; return 1; }
}
t_llama_layouts() {
    have_torch || return $?
    local d=$WORK/llama ok=0 z
    lrun ref --model llama3-tiny || return 1
    for z in 0 1 2 3; do lrun dp2z$z --model llama3-tiny --nproc 2 --zero $z || return 1; done
    $PY test/compare_runs.py 1e-5 "$d/ref" "$d/dp2z0" "$d/dp2z3" || ok=1
    for z in 1 2 3; do cmp -s "$d/dp2z0.bin" "$d/dp2z$z.bin" || { echo "FAIL ZeRO-$z is not bitwise ZeRO-0"; ok=1; }; done
    lrun pp2 --model llama3-tiny --nproc 2 --pp 2 --micro-batch 1 || return 1
    lrun pp2zb --model llama3-tiny --nproc 2 --pp 2 --micro-batch 1 --pp-schedule zb-h1 --recompute full || return 1
    $PY test/compare_runs.py 1e-5 "$d/ref" "$d/pp2" "$d/pp2zb" || ok=1
    cmp -s "$d/pp2.bin" "$d/pp2zb.bin" || { echo "FAIL zb-h1 with full recompute is not bitwise 1f1b"; ok=1; }
    lrun ref4 --model llama3-tiny --layers 4 || return 1
    lrun pp2v2 --model llama3-tiny --layers 4 --nproc 2 --pp 2 --pp-virtual 2 --micro-batch 1 || return 1
    lrun ref_tied --model llama3-tiny --tie-embeddings 1 || return 1
    lrun pp2_tied --model llama3-tiny --tie-embeddings 1 --nproc 2 --pp 2 --micro-batch 1 --zero 1 || return 1
    $PY test/compare_runs.py 1e-5 "$d/ref4" "$d/pp2v2" || ok=1
    $PY test/compare_runs.py 1e-5 "$d/ref_tied" "$d/pp2_tied" || ok=1
    # zb-v (the head on rank 0, two chunks a rank in a V) bitwise 1f1b: untied, and tied under DP 2 x ZeRO 1
    # with one gradient bucket (a bucket spanning a stage's empty units)
    local s
    for s in 1f1b zb-v; do
        lrun "v_$s" --model llama3-tiny --layers 4 --nproc 2 --pp 2 --micro-batch 1 --pp-schedule $s || return 1
        lrun "vt_$s" --model llama3-tiny --layers 4 --tie-embeddings 1 --nproc 4 --pp 2 --zero 1 --bucket-mb 100 --micro-batch 1 \
            --pp-schedule $s || return 1
    done
    $PY test/compare_runs.py 1e-5 "$d/ref4" "$d/v_zb-v" || ok=1
    cmp -s "$d/v_1f1b.bin" "$d/v_zb-v.bin" || { echo "FAIL zb-v is not bitwise 1f1b"; ok=1; }
    cmp -s "$d/vt_1f1b.bin" "$d/vt_zb-v.bin" || { echo "FAIL zb-v (tied, DP 2 x ZeRO 1, one bucket) is not bitwise 1f1b"; ok=1; }
    return $ok
}
# TP for llama3-tiny (4 heads, 2 kv heads): TP 2 (one kv head a rank) with SP, TP 4 (each kv head on two ranks,
# its gradient summed over them; SwiGLU split by 4), TP 2 x PP 2 under zb-h1, and the tied head's vocab split
t_llama_tp() {
    have_torch || return $?
    local d=$WORK/llama ok=0
    lrun ref --model llama3-tiny || return 1
    lrun tp2sp --model llama3-tiny --nproc 2 --tp 2 --sp || return 1
    lrun tp4 --model llama3-tiny --nproc 4 --tp 4 || return 1
    lrun tp2pp2 --model llama3-tiny --nproc 4 --tp 2 --pp 2 --micro-batch 1 --pp-schedule zb-h1 --zero 1 || return 1
    $PY test/compare_runs.py 1e-5 "$d/ref" "$d/tp2sp" "$d/tp4" "$d/tp2pp2" || ok=1
    # all three at once (TP 2 x PP 2 x DP 2, 8 ranks), and bf16 across ranks (TP 2 x DP 2 x ZeRO 3 against bf16 on
    # one rank, at GPT-2's bf16 layout tolerance)
    lrun tp2pp2dp2 --model llama3-tiny --nproc 8 --tp 2 --sp --pp 2 --micro-batch 1 --zero 1 || return 1
    $PY test/compare_runs.py 1e-5 "$d/ref" "$d/tp2pp2dp2" || ok=1
    lrun refbf16 --model llama3-tiny --dtype bf16 || return 1
    lrun tp2dp2bf16 --model llama3-tiny --dtype bf16 --nproc 4 --tp 2 --dp 2 --zero 3 || return 1 # (--dp: as implied)
    $PY test/compare_runs.py 1e-2 "$d/refbf16" "$d/tp2dp2bf16" || ok=1
    lrun ref_tied --model llama3-tiny --tie-embeddings 1 || return 1
    lrun tp4_tied --model llama3-tiny --tie-embeddings 1 --nproc 4 --tp 4 --sp --recompute selective || return 1
    $PY test/compare_runs.py 1e-5 "$d/ref_tied" "$d/tp4_tied" || ok=1
    # neither of 3 kv heads and TP 2 divides the other; TP 2 does not divide --ffn 161: one line each
    local out
    out=$($TRAIN --model llama3-tiny --channels 48 --heads 6 --kv-heads 3 --tp 2 --nproc 2 --steps 0 2>&1)
    grep -q "^error: --tp 2 and the model's 3 kv heads" <<<"$out" || { echo "FAIL 3 kv heads on TP 2 accepted: $out"; ok=1; }
    out=$($TRAIN --model llama3-tiny --ffn 161 --tp 2 --nproc 2 --steps 0 2>&1)
    grep -q "^error: --tp 2 does not divide the model's SwiGLU size 161" <<<"$out" || { echo "FAIL --ffn 161 on TP 2 accepted: $out"; ok=1; }
    return $ok
}
# CP for llama3-tiny: the ring passes the 2 kv heads' K and V, RoPE at each zigzag chunk's global positions;
# CP 2 and 4, CP 2 x TP 2 (one kv head a rank), CP 2 x DP 2 under ZeRO-3 with selective recompute
t_llama_cp() {
    have_torch || return $?
    local d=$WORK/llama ok=0
    lrun ref --model llama3-tiny || return 1
    lrun cp2 --model llama3-tiny --nproc 2 --cp 2 || return 1
    lrun cp4 --model llama3-tiny --nproc 4 --cp 4 || return 1
    lrun cp2tp2 --model llama3-tiny --nproc 4 --cp 2 --tp 2 || return 1
    lrun cp2dp2 --model llama3-tiny --nproc 4 --cp 2 --zero 3 --recompute selective || return 1
    $PY test/compare_runs.py 1e-5 "$d/ref" "$d/cp2" "$d/cp4" "$d/cp2tp2" "$d/cp2dp2" || ok=1
    # the ring's measured bytes (cp_sent_bytes): 4 heads on 4, 2 and 1 kv heads send 4:2:1, and 4 on 4 what
    # GPT-2's multi-head attention of the same shape sends (the ring passes only the kv heads' K and V)
    local kv
    local cpshape=(--layers 2 --channels 64 --heads 4 --vocab 256 --seq-len 64 --micro-batch 2 --steps 2 --nproc 2 --cp 2
        --train "$DATA/train.bin")
    for kv in 4 2 1; do
        $TRAIN "${cpshape[@]}" --arch llama --kv-heads $kv --log "$d/cpb$kv.jsonl" >/dev/null || return 1
    done
    $TRAIN "${cpshape[@]}" --log "$d/cpbgpt2.jsonl" >/dev/null || return 1
    local -A by
    for kv in 4 2 1 gpt2; do by[$kv]=$(grep '"loss"' "$d/cpb$kv.jsonl" | tail -n 1 | grep -o '"cp_sent_bytes":[0-9]*' | cut -d: -f2); done
    echo "cp_sent_bytes per step: kv 4 ${by[4]}, kv 2 ${by[2]}, kv 1 ${by[1]}, GPT-2 ${by[gpt2]}"
    [ -n "${by[4]}" ] && [ "${by[4]}" -gt 0 ] && [ "${by[4]}" = "${by[gpt2]}" ] && [ $((2 * ${by[2]})) = "${by[4]}" ] &&
        [ $((4 * ${by[1]})) = "${by[4]}" ] || { echo "FAIL the ring's bytes do not fall with the kv heads"; ok=1; }
    return $ok
}
# Llama checkpoints: 4 steps on TP 2 checkpointed at 2, resumed at 2 on PP 2 (re-sharded), equal the uninterrupted
# single rank; a resume with another kv-head count is refused naming the model
t_llama_ckpt() {
    have_torch || return $?
    local d=$WORK/llama ok=0
    lrun ref --model llama3-tiny || return 1
    rm -rf "$d/half.ck"
    $TRAIN "${LFLAGS[@]}" --model llama3-tiny --train "$DATA/train.bin" --nproc 2 --tp 2 --ckpt-dir "$d/half.ck" --ckpt-every 2 \
        >/dev/null 2>&1 || { echo "the TP 2 run failed"; return 1; }
    lrun resumed --model llama3-tiny --nproc 2 --pp 2 --micro-batch 1 --resume "$d/half.ck/ckpt_00000002" || return 1
    $PY - "$d/ref.bin" "$d/resumed.bin" <<'PYEOF' || ok=1
import sys, numpy as np
a, b = (np.fromfile(p, dtype=np.float32)[256:].astype(np.float64) for p in sys.argv[1:])
err = float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
print(f"{'ok' if err <= 1e-5 else 'FAIL'} resumed on PP 2 from TP 2's step 2: parameters {err:.2e}")
sys.exit(err > 1e-5)
PYEOF
    local out
    out=$($TRAIN "${LFLAGS[@]}" --model llama3-tiny --kv-heads 4 --train "$DATA/train.bin" --resume "$d/half.ck/ckpt_00000002" \
        --ckpt-dir "$d/other.ck" 2>&1)
    grep -q "^error: .*holds another model (llama, kv heads 2" <<<"$out" || { echo "FAIL a kv-head mismatch resumed: $out"; ok=1; }
    return $ok
}
t_llama_torch_bf16() { llama_ref bf16 --seq-len 32 --micro-batch 2 --dtype bf16 --tol 3e-2; }
# Hugging Face checkpoints (hf.c through ./train hf-inspect, the ASan build): files of the safetensors package
# (scripts/deps.sh installs it from PyPI) and of a numpy writer read back equal; hf.c's files read by the package
# equal; sharded index; every bad input one line and a non-zero exit
t_hf_checkpoints() { $PY -c 'import numpy' 2>/dev/null || { echo "python3-numpy is not installed"; return 77; }; $PY test/hf_check.py $ASAN; }
# transformers' LlamaForCausalLM (scripts/deps.sh installs 4.49.0 into $LLM4D_CACHE) as the reference: save_pretrained
# -> --init-from-hf: step 0's logits, loss and gradients; 5 steps -> --save-hf -> from_pretrained: eval's loss
t_hf_transformers() { have_torch || return $?; $PY test/hf_transformers.py $TRAIN; }

# M micro-batches of B equal one batch of M·B: same losses, same trained model.
t_grad_accum() {
    have_torch || return $?
    $TRAIN "${TINY[@]}" --train "$DATA/train.bin" --micro-batch 4 --steps 6 --log "$WORK/a1.jsonl" --save-model "$WORK/a1.bin" >/dev/null || return 1
    $TRAIN "${TINY[@]}" --train "$DATA/train.bin" --micro-batch 1 --batch-tokens 128 --steps 6 --log "$WORK/a4.jsonl" --save-model "$WORK/a4.bin" >/dev/null || return 1
    $PY - "$WORK" <<'EOF'
import json, sys, numpy as np
w = sys.argv[1]
l1 = [json.loads(l)["loss"] for l in open(w + "/a1.jsonl") if '"loss"' in l]
l4 = [json.loads(l)["loss"] for l in open(w + "/a4.jsonl") if '"loss"' in l]
err = max(abs(a - b) / abs(b) for a, b in zip(l1, l4))
print("max relative loss difference", err)
assert len(l1) == len(l4) == 6 and err <= 1e-6
p1 = np.fromfile(w + "/a1.bin", dtype=np.float32)[256:]
p4 = np.fromfile(w + "/a4.bin", dtype=np.float32)[256:]
perr = np.max(np.abs(p1 - p4)) / np.max(np.abs(p4))
print("max relative parameter difference", perr)
assert perr <= 1e-5
EOF
}

# Reruns are bitwise identical, and so are runs with a different thread count.
t_determinism() {
    local args=("${TINY[@]}" --train "$DATA/train.bin" --micro-batch 2 --batch-tokens 128 --steps 4 --shuffle)
    $TRAIN "${args[@]}" --threads 2 --log "$WORK/d1.jsonl" --save-model "$WORK/d1.bin" >/dev/null || return 1
    $TRAIN "${args[@]}" --threads 2 --log "$WORK/d2.jsonl" --save-model "$WORK/d2.bin" >/dev/null || return 1
    $TRAIN "${args[@]}" --threads 1 --log "$WORK/d3.jsonl" --save-model "$WORK/d3.bin" >/dev/null || return 1
    cmp "$WORK/d1.bin" "$WORK/d2.bin" && cmp "$WORK/d1.bin" "$WORK/d3.bin" || return 1
    for f in d1 d2 d3; do grep -o '"loss":[^,]*' "$WORK/$f.jsonl" >"$WORK/$f.loss"; done
    cmp "$WORK/d1.loss" "$WORK/d2.loss" && cmp "$WORK/d1.loss" "$WORK/d3.loss" || return 1
    # bf16 (the AVX512-BF16 matmuls where the CPU has them) across thread counts
    $TRAIN "${args[@]}" --dtype bf16 --threads 2 --save-model "$WORK/d4.bin" >/dev/null || return 1
    $TRAIN "${args[@]}" --dtype bf16 --threads 1 --save-model "$WORK/d5.bin" >/dev/null || return 1
    cmp "$WORK/d4.bin" "$WORK/d5.bin"
}

# --profile: every step line and JSON record carry the split of the step between matmuls, attention and
# the rest; the timed parts are inside the step.
t_profile() {
    $TRAIN "${TINY[@]}" --train "$DATA/train.bin" --steps 3 --profile --log "$WORK/prof.jsonl" >"$WORK/prof.out" || return 1
    [ "$(grep -c 'matmul [0-9.]* ms ([0-9]*%), attention [0-9.]* ms ([0-9]*%), other' "$WORK/prof.out")" = 3 ] || return 1
    $PY - "$WORK/prof.jsonl" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert len(recs) == 3
for r in recs:
    assert 0 < r["matmul_ms"] and 0 < r["attention_ms"] and r["matmul_ms"] + r["attention_ms"] < r["ms"], r
print("matmul and attention shares:", [(round(r["matmul_ms"] / r["ms"], 2), round(r["attention_ms"] / r["ms"], 2)) for r in recs])
EOF
}

# Activation memory is linear in T: no T x T attention buffers (doubling T doubles it exactly).
t_activation_memory() {
    local a b
    a=$($TRAIN --layers 2 --channels 64 --heads 4 --vocab 256 --seq-len 256 --micro-batch 2 --steps 0 |
        grep -o 'activations [0-9.]* MiB' | head -n 1 | cut -d' ' -f2)
    b=$($TRAIN --layers 2 --channels 64 --heads 4 --vocab 256 --seq-len 512 --micro-batch 2 --steps 0 |
        grep -o 'activations [0-9.]* MiB' | head -n 1 | cut -d' ' -f2)
    echo "activations at T=256: $a MiB, at T=512: $b MiB"
    awk -v a="$a" -v b="$b" 'BEGIN { exit !(a > 0 && b / a > 1.995 && b / a < 2.005) }'
}

# init -> save -> load -> save is bitwise; a bf16 (version 5) file loads as its bf16 values.
t_model_roundtrip() {
    have_torch || return $?
    $TRAIN "${TINY[@]}" --steps 0 --save-model "$WORK/m1.bin" >/dev/null || return 1
    $TRAIN --init-from "$WORK/m1.bin" --steps 0 --save-model "$WORK/m2.bin" >/dev/null || return 1
    cmp "$WORK/m1.bin" "$WORK/m2.bin" || return 1
    $PY - "$WORK" <<'EOF' || return 1
import sys, numpy as np, torch
w = sys.argv[1]
b = np.fromfile(w + "/m1.bin", dtype=np.int32)
h = b[:256].copy(); h[1] = 5
p = torch.tensor(b[256:].view(np.float32)).to(torch.bfloat16)
with open(w + "/m5.bin", "wb") as f:
    f.write(h.tobytes()); f.write(p.view(torch.int16).numpy().tobytes())
np.save(w + "/m5_expect.npy", p.float().numpy())
EOF
    $TRAIN --init-from "$WORK/m5.bin" --steps 0 --save-model "$WORK/m6.bin" >/dev/null || return 1
    $PY - "$WORK" <<'EOF'
import sys, numpy as np
w = sys.argv[1]
got = np.fromfile(w + "/m6.bin", dtype=np.float32)[256:]
assert np.array_equal(got, np.load(w + "/m5_expect.npy")), "bf16 model file did not load exactly"
h = np.fromfile(w + "/m6.bin", dtype=np.int32)[:8]
assert h[0] == 20240326 and h[1] == 3, h
print("bf16 file loaded exactly, saved as version 3")
EOF
}

# With updates below bf16 resolution the fp32 master weights still move, and the bf16 working
# weights would not have.
t_bf16_master() {
    have_torch || return $?
    $TRAIN "${TINY[@]}" --steps 0 --save-model "$WORK/b0.bin" >/dev/null || return 1
    # start from weights that bf16 represents exactly, so "unchanged in bf16" is exact
    $PY - "$WORK" <<'EOF' || return 1
import sys, numpy as np, torch
w = sys.argv[1]
b = np.fromfile(w + "/b0.bin", dtype=np.int32)
p = torch.tensor(b[256:].view(np.float32)).to(torch.bfloat16).float().numpy()
with open(w + "/b0r.bin", "wb") as f:
    f.write(b[:256].tobytes()); f.write(p.tobytes())
EOF
    $TRAIN --init-from "$WORK/b0r.bin" --train "$DATA/train.bin" --seq-len 32 --dtype bf16 --lr 1e-6 --clip 0 \
        --steps 3 --save-model "$WORK/b1.bin" >/dev/null || return 1
    $PY - "$WORK" <<'EOF'
import sys, numpy as np, torch
w = sys.argv[1]
p0 = np.fromfile(w + "/b0r.bin", dtype=np.float32)[256:]
p1 = np.fromfile(w + "/b1.bin", dtype=np.float32)[256:]
# weights of magnitude > 1e-3: their half bf16 ulp exceeds 3 Adam steps of at most lr = 1e-6 each
live = np.abs(p0) > 1e-3
moved = np.mean(p0[live] != p1[live])
same_bf16 = float((torch.tensor(p1[live]).to(torch.bfloat16).float().numpy() == p0[live]).mean())
print(f"master moved for {moved:.3f} of the weights; bf16 value unchanged for {same_bf16:.4f}")
assert moved > 0.9, "fp32 master weights did not move"
assert same_bf16 == 1.0, "updates were not below bf16 resolution, so this test proves nothing"
EOF
}

# Layout errors before the launcher forks: each bad layout or combination is refused with one error
# line and nothing else, so no rank ever started (a rank 0 would print the "collectives:" line, and a
# layout error found by the ranks comes after it); --nproc 256 and 255 included. The timeout only bounds
# a failure.
t_prefork_checks() {
    local d=$WORK/prefork ok=0
    mkdir -p "$d"
    $TRAIN "${TINY[@]}" --steps 0 --save-model "$d/m.bin" >/dev/null || return 1
    refused() { # pattern args...
        local pattern=$1 out rc
        shift
        out=$(timeout 60 $TRAIN "$@" 2>&1)
        rc=$?
        if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "FAIL: exit status $rc: $*"; ok=1; return; fi
        if [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] || [ "${out#error: }" = "$out" ]; then
            echo "FAIL: not one error line (a rank started?): $*"; printf '%s\n' "$out" | head -5; ok=1; return
        fi
        grep -qF -- "$pattern" <<<"$out" || { echo "FAIL: missing '$pattern' in: $out"; ok=1; return; }
        echo "ok: $out"
    }
    local S=("${TINY[@]}" --train "$DATA/train.bin" --steps 2)
    refused "--tp 3 does not divide the model's 4 heads" --nproc 3 --tp 3 "${S[@]}"
    refused "--tp 3 does not divide the model's 4 heads" --nproc 255 --tp 3 "${S[@]}"
    refused "--tp 3 x --pp 1 = 3 does not divide the 256 ranks" --nproc 256 --tp 3 "${S[@]}"
    refused "--dp 4: the 4 ranks over --tp 2 x --cp 1 x --pp 1 give data parallel 2" --nproc 4 --tp 2 --dp 4 "${S[@]}"
    refused "--tp 3 does not divide the model's 4 heads" --nproc 3 --tp 3 --init-from "$d/m.bin" --seq-len 32 \
        --train "$DATA/train.bin" --steps 2 # the heads from the file's header
    refused "--sp needs tensor parallelism (--tp 2 or more)" --nproc 2 --sp "${S[@]}"
    refused "--pp 4: more pipeline stages than the model's 2 blocks" --nproc 4 --pp 4 "${S[@]}"
    refused "--pp-layers '1,2' adds up to 3 blocks, but the model has 2" --nproc 2 --pp 2 --pp-layers 1,2 "${S[@]}"
    refused "--pp-virtual 2: the 3 micro-batch(es) per step must be a multiple of --pp 2" --nproc 2 --pp 2 --pp-virtual 2 \
        "${TINY[@]}" --layers 4 --micro-batch 1 --batch-tokens 96 --train "$DATA/train.bin" --steps 2
    refused "--cp 2 cuts each sequence into 4 chunks: --seq-len 30 must be divisible by 4" --nproc 2 --cp 2 "${S[@]}" --seq-len 30
    refused "--batch-tokens 100 is not a multiple of data-parallel ranks x --micro-batch x --seq-len = 2 x 4 x 32 = 256" \
        --nproc 2 "${S[@]}" --batch-tokens 100
    refused "--pp-virtual 16 interleaves pipeline stages: it needs --pp 2 or more" --nproc 2 --pp-virtual 16 "${S[@]}"
    refused "--pp-virtual 16 interleaves pipeline stages: it needs --pp 2 or more" --pp-virtual 16 "${S[@]}"
    refused "--pp-schedule zb-v orders pipeline stages: it needs --pp 2 or more" --pp-schedule zb-v "${S[@]}"
    LLM4D_FAULT="rank=9,step=1" refused "LLM4D_FAULT: rank=9 is not a rank of this 2-rank job" --nproc 2 "${S[@]}"
    LLM4D_FAULT="rank=1,step=1" refused "LLM4D_FAULT: rank=1 is not a rank of this 1-rank job" "${S[@]}"
    refused "--init-from and --resume both give the starting weights" --nproc 2 --init-from "$d/m.bin" --seq-len 32 \
        --train "$DATA/train.bin" --steps 2 --ckpt-dir "$d/c" --resume
    [ ! -e "$d/c" ] || { echo "FAIL: --ckpt-dir was created"; ok=1; }
    return $ok
}

# Bad input: one line on stderr naming the problem, non-zero exit, no crash, also under ASan/UBSan.
expect_error() { # pattern args...
    local pattern=$1
    shift
    local err
    err=$("$ASAN" "$@" 2>&1 >/dev/null)
    local rc=$?
    if [ $rc -eq 0 ]; then echo "expected failure, got success: $*"; return 1; fi
    if [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ]; then echo "expected one line, got: $err"; return 1; fi
    case "$err" in
    "error: "*) ;;
    *) echo "not an error line: $err"; return 1 ;;
    esac
    if ! grep -q -- "$pattern" <<<"$err"; then echo "missing '$pattern' in: $err"; return 1; fi
    echo "ok: $err"
}

t_bad_input() {
    local d=$WORK/bad ok=0
    mkdir -p "$d"
    head -c 3000 "$DATA/train.bin" >"$d/trunc.bin"
    { printf 'XXXX'; tail -c +5 "$DATA/train.bin"; } >"$d/magic.bin"
    $TRAIN "${TINY[@]}" --steps 0 --save-model "$d/m.bin" >/dev/null || return 1
    # C changed from 32 to 48: the file is too short for that shape
    { head -c 24 "$d/m.bin"; printf '\x30\x00\x00\x00'; tail -c +29 "$d/m.bin"; } >"$d/hdr.bin"
    # heads changed to 5: 32 channels do not divide
    { head -c 20 "$d/m.bin"; printf '\x05\x00\x00\x00'; tail -c +25 "$d/m.bin"; } >"$d/heads.bin"
    local base=("${TINY[@]}" --steps 2)
    expect_error "trunc.bin is truncated" "${base[@]}" --train "$d/trunc.bin" || ok=1
    expect_error "magic.bin: bad magic" "${base[@]}" --train "$d/magic.bin" || ok=1
    expect_error "not below the vocabulary size 100" --layers 2 --channels 32 --heads 4 --vocab 100 --seq-len 32 --steps 2 --train "$DATA/train.bin" || ok=1
    expect_error "hdr.bin: inconsistent model header" --init-from "$d/hdr.bin" --steps 0 || ok=1
    expect_error "heads.bin: inconsistent model header" --init-from "$d/heads.bin" --steps 0 || ok=1
    expect_error "unknown flag --bogus (see --help)" "${base[@]}" --bogus 3 || ok=1
    # a near miss names the flag of --help it is nearest (two edits at most; a swap counts one)
    expect_error "unknown flag --step: did you mean --steps? (see --help)" "${base[@]}" --step 3 || ok=1
    expect_error "unknown flag --ckpt-evry: did you mean --ckpt-every?" "${base[@]}" --ckpt-evry 3 || ok=1
    expect_error "unknown flag --tp2: did you mean --tp?" "${base[@]}" --tp2 3 || ok=1
    expect_error "--temperature 0: the sampler divides by it; --top-k 1 samples greedily" sample --model "$d/m.bin" --temperature 0 || ok=1
    # a flag that refines another is refused alone (it would do nothing)
    expect_error "--top-k shapes the samples --sample-every N prints: it needs --sample-every" "${base[@]}" --top-k 3 || ok=1
    expect_error "--sample-tokens shapes the samples" "${base[@]}" -g 16 || ok=1
    expect_error "--val-steps sets each validation's micro-batches: it needs --val PATTERN and --val-every N" "${base[@]}" --val-steps 2 || ok=1
    expect_error "--save-hf-dtype sets --save-hf's element type: it needs --save-hf DIR" "${base[@]}" --save-hf-dtype bf16 || ok=1
    expect_error "--recompute must be none, selective or full, got 'some'" "${base[@]}" --recompute some || ok=1
    expect_error "steps expects an integer, got 'ten'" "${TINY[@]}" --steps ten || ok=1
    expect_error "lr expects a number" "${base[@]}" --lr 1e-3x || ok=1
    expect_error "seq-len 64 is above the model's maximum sequence length 32" --init-from "$d/m.bin" --seq-len 64 --steps 0 || ok=1
    expect_error "batch-tokens 100 is not a multiple" "${base[@]}" --train "$DATA/train.bin" --batch-tokens 100 || ok=1
    expect_error "--train: no file matches $d/missing" "${base[@]}" --train "$d/missing*.bin" || ok=1
    expect_error "cannot open $d/nofile.bin" --init-from "$d/nofile.bin" --steps 0 || ok=1
    mkfifo "$d/fifo.bin" # (its open blocked until a writer came, past any timeout a user would wait)
    expect_error "$d/fifo.bin is not a regular file: a token shard is read at offsets" "${base[@]}" --train "$d/fifo.bin" || ok=1
    # a model file holding an infinity (the first float after the 256-int header: wte's first)
    $PY -c 'import struct,sys; b=bytearray(open(sys.argv[1],"rb").read()); b[1024:1028]=struct.pack("<f",float("inf")); open(sys.argv[2],"wb").write(b)' \
        "$d/m.bin" "$d/inf.bin" || ok=1
    expect_error "$d/inf.bin: wte element 0 of [0-9]* is inf: not a model to start from" --init-from "$d/inf.bin" --steps 0 || ok=1
    expect_error "--model needs a value" --model || ok=1
    expect_error "--model must be d12" --model d13 --steps 0 || ok=1
    expect_error "channels (30) must be divisible by heads (4)" --layers 1 --channels 30 --heads 4 --steps 0 || ok=1
    expect_error "no training data" "${base[@]}" || ok=1
    LLM4D_CPU_ISA=avx2 expect_error "LLM4D_CPU_ISA must be generic or avx512bf16, got 'avx2'" "${base[@]}" || ok=1
    # half a torchrun-style launch is refused, not run as one rank; a local rank outside its node too
    RANK=1 expect_error "launch environment: RANK is set but WORLD_SIZE is not" "${base[@]}" --train "$DATA/train.bin" || ok=1
    WORLD_SIZE=2 expect_error "launch environment: WORLD_SIZE is set but RANK is not" "${base[@]}" --train "$DATA/train.bin" || ok=1
    RANK=0 WORLD_SIZE=1 MASTER_ADDR= expect_error "launch environment: MASTER_ADDR is empty" "${base[@]}" --train "$DATA/train.bin" || ok=1
    RANK=0 WORLD_SIZE=2 LOCAL_RANK=5 LOCAL_WORLD_SIZE=2 expect_error "launch environment: local rank 5 is not inside a node of 2" \
        "${base[@]}" --train "$DATA/train.bin" || ok=1
    # a failing run leaves an existing output file untouched
    cp "$d/m.bin" "$d/keep.bin"
    expect_error "not below the vocabulary size 100" --layers 2 --channels 32 --heads 4 --vocab 100 --seq-len 32 --steps 2 --train "$DATA/train.bin" --save-model "$d/keep.bin" || ok=1
    cmp "$d/m.bin" "$d/keep.bin" || ok=1
    # an output that is an input (the log is opened before the data is read) or inside a checkpoint is
    # refused before anything is written: the shard, the model and the checkpoint stay as they were
    cp "$DATA/train.bin" "$d/shard.bin"
    expect_error "--log $d/shard.bin is a file of --train $d/shard.bin: writing it would destroy that input" \
        "${base[@]}" --train "$d/shard.bin" --log "$d/shard.bin" || ok=1
    expect_error "--save-model $d/./shard.bin is a file of --train $d/sh\*.bin" "${base[@]}" --train "$d/sh*.bin" --save-model "$d/./shard.bin" || ok=1
    expect_error "--pp-schedule-dump $d/shard.bin is a file of --val" "${base[@]}" --train "$DATA/train.bin" --val "$d/shard.bin" \
        --val-every 1 --pp-schedule-dump "$d/shard.bin" || ok=1
    expect_error "--log: the path is empty" "${base[@]}" --train "$DATA/train.bin" --log "" || ok=1
    expect_error "--val-every 2 needs --val PATTERN" "${base[@]}" --train "$DATA/train.bin" --val-every 2 || ok=1
    expect_error "--val $DATA/val.bin is read only with --val-every N" "${base[@]}" --train "$DATA/train.bin" --val "$DATA/val.bin" || ok=1
    cmp "$DATA/train.bin" "$d/shard.bin" || { echo "a refused run changed the --train shard"; ok=1; }
    # the tokenizer a run reads beside its data without --tokenizer is an input too; two outputs on one file are refused
    mkdir -p "$d/withtk"
    cp "$DATA/train.bin" "$d/withtk/train.bin"
    printf 'not a real tokenizer, but one this run would read' >"$d/withtk/tokenizer.bin"
    cp "$d/withtk/tokenizer.bin" "$d/tk.keep"
    expect_error "--log $d/withtk/tokenizer.bin is the tokenizer beside --train ($d/withtk/tokenizer.bin), which this run reads" \
        "${base[@]}" --vocab 256 --train "$d/withtk/train.bin" --log "$d/withtk/tokenizer.bin" || ok=1
    expect_error "--save-model $d/withtk/tokenizer.bin is the tokenizer beside --val" "${base[@]}" --train "$DATA/train.bin" \
        --val "$d/withtk/train.bin" --val-every 1 --save-model "$d/withtk/tokenizer.bin" || ok=1
    cmp "$d/tk.keep" "$d/withtk/tokenizer.bin" || { echo "a refused run changed the tokenizer beside the data"; ok=1; }
    expect_error "--log $d/both and --save-model $d/./both are the same file" "${base[@]}" --train "$DATA/train.bin" \
        --log "$d/both" --save-model "$d/./both" || ok=1
    [ ! -e "$d/both" ] || { echo "a refused run wrote $d/both"; ok=1; }
    expect_error "--log $d/keep.bin is a file of --init-from $d/keep.bin" --init-from "$d/keep.bin" --steps 0 --log "$d/keep.bin" || ok=1
    cmp "$d/m.bin" "$d/keep.bin" || { echo "a refused run changed the --init-from model"; ok=1; }
    $ASAN "${base[@]}" --train "$DATA/train.bin" --ckpt-dir "$d/ck" --ckpt-every 2 >/dev/null || ok=1
    cp "$d/ck/ckpt_00000002/manifest.json" "$d/manifest.keep"
    expect_error "--log $d/ck/ckpt_00000002/manifest.json is inside the checkpoint $d/ck/ckpt_00000002" "${base[@]}" \
        --train "$DATA/train.bin" --ckpt-dir "$d/ck" --resume --log "$d/ck/ckpt_00000002/manifest.json" || ok=1
    cmp "$d/manifest.keep" "$d/ck/ckpt_00000002/manifest.json" || { echo "a refused run changed the checkpoint's manifest"; ok=1; }
    expect_error "--ckpt-dir $d/ck/ckpt_00000002 is a checkpoint (it holds manifest.json)" "${base[@]}" --train "$DATA/train.bin" \
        --ckpt-dir "$d/ck/ckpt_00000002" || ok=1
    expect_error "--ckpt-dir $d/m.bin is a file, not a directory" "${base[@]}" --train "$DATA/train.bin" --ckpt-dir "$d/m.bin" || ok=1
    expect_error "--resume $d/none: does not exist" "${base[@]}" --train "$DATA/train.bin" --resume "$d/none" || ok=1
    expect_error "--resume $d/m.bin: is not a directory" "${base[@]}" --train "$DATA/train.bin" --resume "$d/m.bin" || ok=1
    # a --resume that cannot be read is refused before --ckpt-dir (or anything else) is made or locked
    mkdir -p "$d/notckpt"
    expect_error "--resume $d/notckpt: $d/notckpt/manifest.json: missing (an incomplete checkpoint)" "${base[@]}" --train "$DATA/train.bin" \
        --resume "$d/notckpt" --ckpt-dir "$d/fresh" --save-hf "$d/fresh-hf" || ok=1
    [ ! -e "$d/fresh" ] && [ ! -e "$d/fresh-hf" ] || { echo "a refused --resume left $(ls -d "$d"/fresh*)"; ok=1; }
    expect_error "--resume $d/ck: is a directory of 1 checkpoint(s), not one: name one ($d/ck/ckpt_00000002 is the newest), or pass --ckpt-dir $d/ck --resume" \
        "${base[@]}" --train "$DATA/train.bin" --resume "$d/ck" || ok=1
    # sample and eval refuse what only training reads, eval what only sampling reads
    expect_error "./train sample: --lr is a training flag" sample --model "$d/m.bin" --lr 1e-3 || ok=1
    expect_error "./train eval: --shuffle is a training flag" eval --model "$d/m.bin" --val "$DATA/val.bin" --shuffle || ok=1
    expect_error "./train eval: --top-k is a sampling flag" eval --model "$d/m.bin" --val "$DATA/val.bin" --top-k 5 || ok=1
    # sample and eval name the flag that gave them the checkpoint
    cp -r "$d/ck/ckpt_00000002" "$d/cut"
    truncate -s 100 "$d/cut/rank_00000.safetensors"
    expect_error "--model: $d/cut/rank_00000.safetensors: truncated" sample --model "$d/cut" --tokens 2 || ok=1
    return $ok
}

# The demo's configuration learns: the loss falls well below its start on real text.
t_learns() {
    $TRAIN --layers 2 --channels 64 --heads 4 --vocab 256 --seq-len 64 --train "$DATA/train.bin" --val "$DATA/val.bin" \
        --lr 3e-3 --steps 60 --warmup 5 --val-every 60 --sample-every 60 --sample-tokens 20 --log "$WORK/learn.jsonl" >"$WORK/learn.out" || return 1
    grep -q "sample at step 60" "$WORK/learn.out" || return 1
    local first last
    first=$(grep '"step":1,' "$WORK/learn.jsonl" | grep -o '"loss":[0-9.e+-]*' | cut -d: -f2)
    last=$(grep '"val_loss"' "$WORK/learn.jsonl" | tail -n 1 | grep -o '"val_loss":[0-9.e+-]*' | cut -d: -f2)
    echo "first loss $first, final val loss $last"
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.5) }'
}

# Every collective against a serial reference (test/test_comm.c), on 1, 2, 3, 4, 5 and 8 ranks.
t_collectives() {
    for n in 1 2 3 4 5 8; do
        timeout 600 ./build/test_comm --nproc $n --comm-timeout 60 || { echo "collectives failed on $n ranks"; return 1; }
    done
    local left
    left=$(ls /dev/shm | grep '^llm4d-' || true)
    [ -z "$left" ] || { echo "left behind in /dev/shm: $left"; return 1; }
}

# The same on device memory of the CPU stand-in (devmem.h: pointers the host cannot dereference, marks
# that pass late): the CUDA IPC protocol over shared memory (handles, reads ordered before the step
# flag) on 2 and 3 ranks, and TCP's pinned staging on 3.
t_collectives_device() {
    timeout 600 ./build/test_comm --nproc 2 --comm-timeout 60 --device cpu || { echo "device collectives failed on 2 ranks"; return 1; }
    timeout 600 ./build/test_comm --nproc 3 --comm-timeout 60 --device cpu --quick || { echo "device collectives failed on 3 ranks"; return 1; }
    timeout 600 ./build/test_comm --nproc 3 --comm-timeout 60 --device cpu --transport tcp --quick ||
        { echo "device collectives over TCP failed on 3 ranks"; return 1; }
}

# A port for test/fake_nodes.sh below the ephemeral range (other jobs on the machine use their own).
fake_port() { echo $((20000 + RANDOM % 12000)); }
# NODES... -- COMMAND: test/fake_nodes.sh on a port of its own.
fake_nodes() { FAKE_NODES_PORT=$(fake_port) timeout 600 sh test/fake_nodes.sh "$@"; }
# "n0 n0 ... n1 ..." : NODES names of PER ranks each.
node_names() { local m l; for ((m = 0; m < $1; m++)); do for ((l = 0; l < $2; l++)); do printf 'n%d ' $m; done; done; }

# The collective suite under each --algo (test/test_comm.c's reference adds in the order the algorithm
# promises: rank order for the fan-in and the ring, node by node for the hierarchy; bitwise), on one
# node (shared memory) and on simulated nodes (shared memory inside, TCP across; test/fake_nodes.sh),
# with each rank's connections counted (two for a ring).
t_collectives_algos() {
    local out
    for a in ring hier; do # (the fan-in: t_collectives)
        timeout 600 ./build/test_comm --nproc 4 --comm-timeout 60 --algo $a || { echo "--algo $a failed on 4 ranks"; return 1; }
    done
    timeout 600 ./build/test_comm --nproc 3 --comm-timeout 60 --algo ring --small || { echo "--algo ring failed on 3 ranks"; return 1; }
    for spec in "hier:2 2" "ring:2 2" "auto:3 2" "hier:3 1"; do
        local a=${spec%%:*} shape=${spec#*:}
        out=$(fake_nodes $(node_names $shape) -- ./build/test_comm --comm-timeout 60 --algo $a --small 2>&1) ||
            { echo "$out" | grep -E "FAIL|rror" | head; echo "--algo $a failed on nodes x ranks $shape"; return 1; }
        echo "$out" | grep -E '^\[0\] (world:|collectives on)'
    done
    # auto across nodes with unequal numbers of ranks: the ring
    out=$(fake_nodes n0 n0 n0 n1 -- ./build/test_comm --comm-timeout 60 --small 2>&1) || { echo "auto on 3+1 ranks failed"; return 1; }
    grep -q '^\[0\] world: 4 rank(s) on 2 node(s), algorithm ring' <<<"$out" || { echo "auto on 3+1 ranks did not take the ring"; return 1; }
    out=$(fake_nodes n0 n0 n0 n1 -- ./build/test_comm --comm-timeout 60 --algo hier 2>&1) && { echo "--algo hier on 3+1 ranks ran"; return 1; }
    grep -q 'communicator world: --algo hier needs as many members of the communicator on each node' <<<"$out" ||
        { echo "--algo hier on 3+1 ranks: no clear error"; echo "$out" | tail -3; return 1; }
}

# Scale: 32 and 64 ranks, the small suite of every collective (bitwise against the serial reference)
# and each rank's connections counted: the ring on one node (shared memory) and across 4 simulated
# nodes, the hierarchy on 8 nodes of 4 and of 8.
t_comm_scale() {
    local out
    for spec in "ring:1 32" "hier:8 4" "ring:4 16" "hier:8 8"; do
        local a=${spec%%:*} shape=${spec#*:}
        out=$(fake_nodes $(node_names $shape) -- ./build/test_comm --comm-timeout 120 --algo $a --quick 2>&1) ||
            { echo "$out" | grep -E "FAIL|rror" | head; echo "--algo $a failed on nodes x ranks $shape"; return 1; }
        echo "$out" | grep -E '^\[0\] (world:|collectives on)'
    done
}

# The bootstrap store answers a rank that waits for a key when the key is set: no rank polls it. While
# 64 ranks form, each rank but 0 sets its mark and waits for rank 0's all-clear, and rank 0 waits for
# each mark, so at least 3 x 63 + 1 requests; a wait not answered within a second is asked again, so
# at most 64 x (3 + 2 x the run's seconds, rounded up). Ranks that polled every 2 ms, as they did
# before, made about 500 requests a second of waiting each.
t_store_waits() {
    local s e out n bound
    s=$(date +%s.%N)
    out=$(LLM4D_STORE_STATS=1 ./train bench-comm --nproc 64 --algo ring --min-bytes 8 --max-bytes 8 --iters 1 --warmup 0 2>&1) ||
        { echo "$out" | tail -3; return 1; }
    e=$(date +%s.%N)
    n=$(sed -n 's/^bootstrap store: \([0-9]*\) requests until the job had formed, [0-9]* in all, from 64 ranks$/\1/p' <<<"$out")
    [ -n "$n" ] || { echo "no store statistics line"; echo "$out" | tail -3; return 1; }
    bound=$(awk -v s="$s" -v e="$e" 'BEGIN { t = e - s; printf "%d", 64 * (3 + 2 * (int(t) + 1)) }')
    echo "64 ranks formed with $n store requests (at least 190; at most $bound for this run's length)"
    [ "$n" -ge 190 ] && [ "$n" -le "$bound" ]
}

# Two nodes simulated with network namespaces (shared memory inside a node, TCP across), and the
# collectives' failure modes: a rank that never joins, a rank killed mid-collective, a wrong token,
# random bytes at the bootstrap port, SIGTERM to the launcher.
t_two_nodes() { bash test/two_nodes.sh; }
# A real two-node Slurm cluster (test/slurm_cluster.sh): collectives and training under srun and sbatch.
t_slurm() { timeout 900 bash test/slurm_tests.sh; }
t_comm_failures() { bash test/comm_failures.sh; }

# Slurm's warning signal (--signal=USR1@N): every rank stops at the same step, exits 0, saves the model.
t_usr1() {
    local d=$WORK/usr1
    mkdir -p "$d"
    $TRAIN --nproc 2 "${TINY[@]}" --train "$DATA/train.bin" --steps 100000 --log "$d/log.jsonl" --save-model "$d/m.bin" \
        >"$d/out" 2>&1 &
    local launcher=$! i
    await_true grep -q '"step":2,' "$d/log.jsonl" # until the run is training
    pkill -USR1 -P "$launcher" || { kill $launcher; return 1; }
    local rc=0
    timeout 60 tail --pid=$launcher -f /dev/null || rc=1
    wait $launcher || rc=1
    grep -q "received SIGUSR1 .*: stopping cleanly after [0-9]* of 100000 steps and the model saved" "$d/out" || rc=1
    grep -q "^saved $d/m.bin" "$d/out" || rc=1
    cat "$d/out" | grep -v "^step" | tail -3
    return $rc
}

# Data parallelism: every DP size, ZeRO stage and micro-batch count takes the single-rank step
# (losses and final parameters within 1e-5), the four stages and three bucket sizes agree bitwise, and
# a rerun is bitwise.
DPFLAGS=(--layers 2 --channels 32 --heads 4 --vocab 256 --seq-len 32 --micro-batch 2 --steps 10 --lr 1e-3
    --warmup 2 --weight-decay 0.1 --clip 1.0 --bucket-mb 0.02)
t_data_parallel() {
    have_torch || return $?
    local d=$WORK/dp ok=0
    mkdir -p "$d"
    for dp in 2 3 4; do
        for m in 1 3; do
            local tokens=$((dp * m * 2 * 32)) runs=()
            $TRAIN "${DPFLAGS[@]}" --train "$DATA/train.bin" --batch-tokens $tokens --log "$d/ref_${dp}_$m.jsonl" \
                --save-model "$d/ref_${dp}_$m.bin" >/dev/null || return 1
            for z in 0 1 2 3; do
                timeout 300 $TRAIN --nproc $dp "${DPFLAGS[@]}" --train "$DATA/train.bin" --batch-tokens $tokens --zero $z \
                    --comm-timeout 60 --log "$d/dp${dp}_m${m}_z$z.jsonl" --save-model "$d/dp${dp}_m${m}_z$z.bin" >/dev/null || { echo "DP $dp M $m ZeRO-$z failed"; return 1; }
                runs+=("$d/dp${dp}_m${m}_z$z")
            done
            $PY test/compare_runs.py 1e-5 "$d/ref_${dp}_$m" "${runs[@]}" || ok=1
            for z in 1 2 3; do
                cmp "$d/dp${dp}_m${m}_z0.bin" "$d/dp${dp}_m${m}_z$z.bin" || { echo "DP $dp M $m: ZeRO-$z differs from ZeRO-0"; ok=1; }
            done
        done
        # bucket boundaries do not change the sums: one bucket (0) and the default (25 MiB) give the
        # same bits as 0.02 MiB buckets, at every stage (M 1: ZeRO-2/3 stream through bucket buffers)
        for b in 0 25; do
            for z in 0 1 2 3; do
                timeout 300 $TRAIN --nproc $dp "${DPFLAGS[@]}" --train "$DATA/train.bin" --batch-tokens $((dp * 64)) --zero $z \
                    --bucket-mb $b --comm-timeout 60 --save-model "$d/dp${dp}_b${b}_z$z.bin" >/dev/null || { echo "DP $dp ZeRO-$z bucket $b failed"; return 1; }
                cmp "$d/dp${dp}_m1_z0.bin" "$d/dp${dp}_b${b}_z$z.bin" || { echo "DP $dp: ZeRO-$z with --bucket-mb $b differs from ZeRO-0 with 0.02"; ok=1; }
            done
        done
    done
    # a rerun is bitwise identical
    timeout 300 $TRAIN --nproc 3 "${DPFLAGS[@]}" --train "$DATA/train.bin" --batch-tokens 576 --zero 3 \
        --log "$d/rerun.jsonl" --save-model "$d/rerun.bin" >/dev/null || return 1
    cmp "$d/rerun.bin" "$d/dp3_m3_z3.bin" || { echo "rerun differs"; ok=1; }
    return $ok
}

# Data parallelism under --algo ring (one node) and --algo hier (simulated nodes: DP 2 on 2 x 1, 3 on
# 3 x 1, 4 on 2 x 2): ZeRO 0-3 and bucket sizes 0.02 and 0 bitwise equal per algorithm, equal to one
# rank within 1e-5; the ring also bitwise equal to the fan-in (the same order of addition). Every rank
# of the simulated nodes counts on this machine's cores (rank 0's line of collectives says how many).
t_data_parallel_algos() {
    have_torch || return $?
    local d=$WORK/dp_algos ok=0
    mkdir -p "$d"
    local -A shape=([2]="2 1" [3]="3 1" [4]="2 2")
    for dp in 2 3 4; do
        local tokens=$((dp * 64))
        $TRAIN "${DPFLAGS[@]}" --train "$DATA/train.bin" --batch-tokens $tokens --log "$d/ref_$dp.jsonl" --save-model "$d/ref_$dp.bin" >/dev/null || return 1
        timeout 300 $TRAIN --nproc $dp "${DPFLAGS[@]}" --train "$DATA/train.bin" --batch-tokens $tokens --algo fanin \
            --comm-timeout 60 --save-model "$d/fanin_$dp.bin" >/dev/null || { echo "DP $dp fanin failed"; return 1; }
        for a in ring hier; do
            local runs=()
            for z in 0 1 2 3; do
                for b in 0.02 0; do
                    local name="$d/${a}_${dp}_z${z}_b$b"
                    local flags=("${DPFLAGS[@]}" --train "$DATA/train.bin" --batch-tokens $tokens --zero $z --bucket-mb $b --algo $a
                        --comm-timeout 60 --log "$name.jsonl" --save-model "$name.bin")
                    if [ $a = ring ]; then timeout 300 $TRAIN --nproc $dp "${flags[@]}" >/dev/null
                    else fake_nodes $(node_names ${shape[$dp]}) -- $TRAIN "${flags[@]}" >"$name.out"; fi || { echo "DP $dp --algo $a ZeRO-$z bucket $b failed"; return 1; }
                    [ $b = 0.02 ] && runs+=("$name")
                    cmp "$d/${a}_${dp}_z0_b0.02.bin" "$name.bin" || { echo "DP $dp --algo $a: ZeRO-$z bucket $b differs from ZeRO-0 bucket 0.02"; ok=1; }
                done
            done
            $PY test/compare_runs.py 1e-5 "$d/ref_$dp" "${runs[@]}" || ok=1
        done
        cmp "$d/fanin_$dp.bin" "$d/ring_${dp}_z0_b0.02.bin" || { echo "DP $dp: the ring differs from the fan-in"; ok=1; }
        # the simulated nodes share this machine's cores: all dp ranks count, oversubscribed past nproc
        local cores want
        cores=$(getconf _NPROCESSORS_ONLN)
        want="rank 0's machine: $dp rank(s) on $cores core(s)"
        [ "$dp" -gt "$cores" ] && want="$want, oversubscribed: a waiting rank yields its core"
        grep -q "^\[0\] collectives: .* | $want\$" "$d/hier_${dp}_z0_b0.out" ||
            { echo "DP $dp on nodes x ranks ${shape[$dp]}: not '$want'"; grep '^\[0\] collectives' "$d/hier_${dp}_z0_b0.out"; ok=1; }
    done
    return $ok
}

# Memory per rank at DP 4 follows the ZeRO formula, per parameter (fp32 gradients; W = 4 bytes of
# fp32 or 2 of bf16 working weights): ZeRO-0 W + 4 + 12 (fp32 weights are their own master: 4+4+8),
# ZeRO-1 W + 4 + 12/DP, ZeRO-2 W + (4 + 12)/DP, ZeRO-3 (W + 4 + 12)/DP; gradient buckets and gathered
# units are counted apart, as comm buffers.
t_zero_memory() {
    have_torch || return $?
    local d=$WORK/mem
    mkdir -p "$d"
    for dt in fp32 bf16; do
        for z in 0 1 2 3; do
            timeout 120 $TRAIN --nproc 4 --layers 4 --channels 128 --heads 4 --vocab 256 --seq-len 32 --micro-batch 1 \
                --steps 0 --zero $z --dtype $dt --bucket-mb 0.1 >"$d/$dt-$z.out" || return 1
        done
    done
    $PY - "$d" <<'EOF'
import re, sys
d = sys.argv[1]
bad = 0
for dt, w in (("fp32", 4), ("bf16", 2)):
    for z in range(4):
        out = open(f"{d}/{dt}-{z}.out").read()
        n = int(re.search(r"\| (\d+) parameters", out).group(1))
        master = 0 if (z == 0 and dt == "fp32") else 4
        want = {0: (w, 4, 8 + master), 1: (w, 4, (8 + master) / 4), 2: (w, 4 / 4, (8 + master) / 4),
                3: (w / 4, 4 / 4, (8 + master) / 4)}[z]
        for line in re.findall(r"memory of rank \d+ .*", out):
            got = [float(x) * 1048576 for x in re.findall(r"(?:weights|gradients|optimizer) ([0-9.]+) MiB", line)]
            for name, g, e in zip(("weights", "gradients", "optimizer"), got, want):
                err = abs(g - e * n) / (e * n)
                if err > 0.05:
                    print(f"FAIL {dt} ZeRO-{z} {name}: {g:.0f} bytes, formula {e * n:.0f} ({err:.1%})")
                    bad += 1
        print(f"{dt} ZeRO-{z}: {line}")
sys.exit(1 if bad else 0)
EOF
}

# ZeRO's gradients against the micro-batches a step accumulates (M), at DP 4 and at DP 2 x CP 2 (N = 4
# ranks holding the same weights either way), per parameter: ZeRO-0/1 4 whatever M; ZeRO-2/3 4/N with
# M = 1 (streamed through bucket buffers), 4 + 4/N with M = 3 (the full accumulation buffer besides the
# shard), the memory line naming the two parts. With DP x CP = 1 (--tp 2 --pp 2 on 4 ranks) --zero 1 has
# nothing to shard: a note says so and the layout line says ZeRO-0; DP 1 x CP 2 x TP 2 does shard.
t_zero_memory_accum() {
    local d=$WORK/memacc lay z m
    mkdir -p "$d"
    local S=(--layers 4 --channels 128 --heads 4 --vocab 256 --seq-len 32 --micro-batch 1 --steps 0 --bucket-mb 0.1)
    for lay in "dp4|4|--nproc 4" "dp2cp2|2|--nproc 4 --cp 2"; do
        local name=${lay%%|*} rest=${lay#*|}
        local dp=${rest%%|*} args
        read -ra args <<<"${rest#*|}"
        for z in 0 1 2 3; do
            for m in 1 3; do
                timeout 120 $TRAIN "${args[@]}" "${S[@]}" --zero $z --batch-tokens $((m * 32 * dp)) >"$d/$name-$z-$m.out" || return 1
            done
        done
    done
    timeout 120 $TRAIN --nproc 4 --tp 2 --pp 2 "${S[@]}" --zero 1 >"$d/none.out" || return 1
    timeout 120 $TRAIN --nproc 4 --tp 2 --cp 2 "${S[@]}" --zero 1 >"$d/cp.out" || return 1
    $PY - "$d" <<'EOF'
import re, sys
d = sys.argv[1]
bad = 0
def fail(msg):
    global bad
    print("FAIL", msg)
    bad += 1
MiB = 1048576
for lay in ("dp4", "dp2cp2"):
    for z in range(4):
        for m in (1, 3):
            out = open(f"{d}/{lay}-{z}-{m}.out").read()
            n = int(re.search(r"\| (\d+) parameters", out).group(1))
            if not re.search(rf"^batch: \d+ tokens per step = {m} micro-batch\(es\)", out, re.M):
                fail(f"{lay} ZeRO-{z} M={m}: not {m} micro-batches")
            N = 4
            want = 4 if z < 2 else (4 / N if m == 1 else 4 + 4 / N)
            lines = re.findall(r"memory of rank \d+ .*", out)
            if len(lines) < 4:  # every rank at the start
                fail(f"{lay} ZeRO-{z} M={m}: {len(lines)} memory lines")
            for line in lines:
                g = re.search(r"\| gradients ([0-9.]+) MiB( \(([0-9.]+) full accumulation buffer for (\d+) micro-batches \+ ([0-9.]+) reduced shard\))? \|", line)
                got = float(g.group(1)) * MiB
                if abs(got - want * n) > 0.01 * want * n + 0.006 * MiB:
                    fail(f"{lay} ZeRO-{z} M={m}: gradients {got:.0f} bytes, formula {want} x {n} = {want * n:.0f}: {line}")
                split = z >= 2 and m > 1
                if bool(g.group(2)) != split:
                    fail(f"{lay} ZeRO-{z} M={m}: the accumulation buffer {'not ' if split else ''}named: {line}")
                if split and (abs(float(g.group(3)) * MiB - 4 * n) > 0.006 * MiB or int(g.group(4)) != m
                              or abs(float(g.group(5)) * MiB - 4 / N * n) > 0.01 * n + 0.006 * MiB):
                    fail(f"{lay} ZeRO-{z} M={m}: the parts are not 4 x n and 4/N x n: {line}")
            print(f"{lay} ZeRO-{z} M={m}: {lines[0][:140]}")
none, cp = open(f"{d}/none.out").read(), open(f"{d}/cp.out").read()
note = ("note: --zero 1 has nothing to shard: ZeRO shards over the ranks holding the same weights, data parallel 1 x "
        "context parallel 1 = 1 here, so the run is ZeRO-0")
if note not in none.splitlines() or not re.search(r"^layout: .* \| ZeRO-0 \|", none, re.M):
    fail("DP x CP = 1: no note, or the layout line does not say ZeRO-0:\n" + none[:600])
if "nothing to shard" in cp or not re.search(r"^layout: .* \| ZeRO-1 \|", cp, re.M):
    fail("DP 1 x CP 2: ZeRO-1 is not kept:\n" + cp[:600])
sys.exit(1 if bad else 0)
EOF
}

# Tensor parallelism alone and with data parallelism (every ZeRO stage) equals one rank; reruns bitwise.
t_tensor_parallel() {
    have_torch || return $?
    local d=$WORK/tp ok=0
    mkdir -p "$d"
    # shape A (4 heads) for TP 2 and 4; shape S (6 heads, V=200, T=48) for TP 3, where T divides by 3
    local A=(--layers 2 --channels 32 --heads 4 --vocab 256 --seq-len 32 --batch-tokens 256)
    local S=(--layers 2 --channels 48 --heads 6 --vocab 200 --seq-len 48 --batch-tokens 384)
    local common=(--micro-batch 2 --steps 10 --lr 1e-3 --warmup 2 --weight-decay 0.1 --clip 1.0 --bucket-mb 0.02
        --train "$DATA/train.bin")
    $TRAIN "${A[@]}" "${common[@]}" --log "$d/refA.jsonl" --save-model "$d/refA.bin" >/dev/null || return 1
    $TRAIN "${S[@]}" "${common[@]}" --log "$d/refS.jsonl" --save-model "$d/refS.bin" >/dev/null || return 1
    local runsA=() runsS=()
    tprun() { # shape nproc tp zero [--sp]
        local name="$1-n$2-tp$3-z$4${5:+-sp}" shape
        if [ "$1" = A ]; then shape=("${A[@]}"); else shape=("${S[@]}"); fi
        timeout 300 $TRAIN --nproc "$2" --tp "$3" --zero "$4" ${5:-} "${shape[@]}" "${common[@]}" --comm-timeout 60 \
            --log "$d/$name.jsonl" --save-model "$d/$name.bin" >/dev/null || { echo "$name failed"; return 1; }
        if [ "$1" = A ]; then runsA+=("$d/$name"); else runsS+=("$d/$name"); fi
    }
    for sp in "" --sp; do
        tprun A 2 2 0 $sp && tprun A 4 4 0 $sp && tprun A 4 2 0 $sp && tprun A 4 2 1 $sp && tprun A 4 2 3 $sp || return 1
        tprun S 3 3 0 $sp && tprun S 6 3 0 $sp && tprun S 6 3 1 $sp && tprun S 6 3 3 $sp || return 1
    done
    tprun A 8 4 1 --sp || return 1
    $PY test/compare_runs.py 1e-5 "$d/refA" "${runsA[@]}" || ok=1
    $PY test/compare_runs.py 1e-5 "$d/refS" "${runsS[@]}" || ok=1
    timeout 300 $TRAIN --nproc 6 --tp 3 --zero 3 --sp "${S[@]}" "${common[@]}" --save-model "$d/rerun.bin" >/dev/null || return 1
    cmp "$d/rerun.bin" "$d/S-n6-tp3-z3-sp.bin" || { echo "rerun differs"; ok=1; }
    # heads that the tensor-parallel size does not divide: a clear error
    local err
    err=$($TRAIN --nproc 3 --tp 3 --layers 2 --channels 32 --heads 4 --vocab 256 --seq-len 32 --steps 0 2>&1 >/dev/null)
    grep -q "error: --tp 3 does not divide the model's 4 heads" <<<"$err" || { echo "bad error: $err"; ok=1; }
    return $ok
}

# Context parallelism: CP 2 and 4 alone and CP 2 with TP 2 (and --sp), PP 2 and DP 2 x ZeRO 1 and 3 take the
# single-rank step (losses and final parameters within 1e-5; bf16 within its rounding); reruns are
# bitwise; every rank computes the same attention FLOPs (within one chunk pair) and together exactly the
# single rank's.
CPFLAGS=(--layers 2 --channels 32 --heads 4 --vocab 256 --seq-len 32 --micro-batch 2 --batch-tokens 256 --steps 8 --lr 1e-3
    --warmup 2 --weight-decay 0.1 --clip 1.0 --bucket-mb 0.02)
t_context_parallel() {
    have_torch || return $?
    local d=$WORK/cp ok=0 runs=() cfg
    mkdir -p "$d"
    $TRAIN "${CPFLAGS[@]}" --train "$DATA/train.bin" --log "$d/ref.jsonl" --save-model "$d/ref.bin" >/dev/null || return 1
    $TRAIN "${CPFLAGS[@]}" --train "$DATA/train.bin" --dtype bf16 --log "$d/refb.jsonl" --save-model "$d/refb.bin" >/dev/null || return 1
    for cfg in "2 --cp 2" "4 --cp 4" "4 --cp 2 --tp 2" "4 --cp 2 --tp 2 --sp" "4 --cp 2 --pp 2" "4 --cp 2 --zero 1" \
        "4 --cp 2 --zero 3" "2 --cp 2 --dtype bf16"; do
        local n=${cfg%% *} name
        name=cp-$(echo "${cfg#* }" | tr -d ' -')
        timeout 300 $TRAIN --nproc "$n" ${cfg#* } "${CPFLAGS[@]}" --train "$DATA/train.bin" --comm-timeout 60 \
            --log "$d/$name.jsonl" --save-model "$d/$name.bin" >"$d/$name.out" 2>&1 || { echo "$cfg failed"; tail -5 "$d/$name.out"; return 1; }
        grep -q "^step    1/8 .* | cp comm [0-9.]* ms, exposed [0-9.]* ms" "$d/$name.out" || { echo "$cfg: no cp comm on the step line"; ok=1; }
        [ "$name" = cp-cp2dtypebf16 ] || runs+=("$d/$name")
    done
    $PY test/compare_runs.py 1e-5 "$d/ref" "${runs[@]}" || ok=1
    $PY test/compare_runs.py 1e-2 "$d/refb" "$d/cp-cp2dtypebf16" || ok=1
    for cfg in "4 --cp 4|cp-cp4" "4 --cp 2 --zero 3|cp-cp2zero3"; do
        local c=${cfg%|*}
        timeout 300 $TRAIN --nproc ${c%% *} ${c#* } "${CPFLAGS[@]}" --train "$DATA/train.bin" --comm-timeout 60 \
            --save-model "$d/rerun.bin" >/dev/null || return 1
        cmp "$d/rerun.bin" "$d/${cfg#*|}.bin" || { echo "rerun of $c differs"; ok=1; }
    done
    $PY - "$d" "${runs[@]}" <<'EOF' || ok=1
import json, sys
def recs(prefix):
    return [json.loads(l) for l in open(prefix + ".jsonl") if '"loss"' in l]
ref = recs(sys.argv[1] + "/ref")
# per step: 8 sequences x 4 heads x 2 layers of T(T+1)/2 causal pairs, 4 + 10 FLOPs per pair and head channel
T, hs = 32, 8
want = 8 * 4 * 2 * (T * (T + 1) // 2) * 14 * hs
assert all(r["attn_flops_total"] == want and r["cp_comm_ms"] == 0 for r in ref), (ref[0], want)
bad = 0
for prefix in sys.argv[2:]:
    name = prefix.rsplit("/", 1)[1]
    cp = int(name.split("cp")[2][0])
    c = T // (2 * cp)
    pair = 8 * 4 * 2 * c * c * 14 * hs  # one chunk pair, for every sequence, head and layer of the step
    for r in recs(prefix):
        spread = r["attn_flops_max"] - r["attn_flops_min"]
        # a step's ring can take under the 1 us the log rounds to: each step's time is >= 0, the run's > 0
        if r["attn_flops_total"] != want or spread > pair or r["cp_comm_ms"] < 0 or r["cp_exposed_ms"] < 0:
            print(f"FAIL {name} step {r['step']}: attention FLOPs total {r['attn_flops_total']} (want {want}), "
                  f"max - min {spread} (at most {pair}), cp_comm_ms {r['cp_comm_ms']}")
            bad += 1
    if not sum(r["cp_comm_ms"] for r in recs(prefix)) > 0:
        print(f"FAIL {name}: no time in the ring's transfers over the whole run")
        bad += 1
    r = recs(prefix)[0]
    print(f"{name}: attention FLOPs per rank {r['attn_flops_min']:.0f}..{r['attn_flops_max']:.0f}, total {want} as on one rank")
sys.exit(1 if bad else 0)
EOF
    return $ok
}

# Activation memory per rank under context parallelism: the position-wise buffers fall to 1/CP (every
# activation buffer is per position); the ring adds fp32 accumulators of 3·C per position (out or dq, and
# this rank's dK/dV share) to the activations, and its blocks in flight to the comm buffers.
t_context_parallel_memory() {
    local d=$WORK/cpm cp
    mkdir -p "$d"
    for cp in 1 2 4; do
        timeout 120 $TRAIN --nproc $cp --cp $cp --layers 2 --channels 64 --heads 4 --vocab 256 --seq-len 256 --micro-batch 2 \
            --steps 0 >"$d/$cp.out" || return 1
    done
    $PY - "$d" <<'EOF'
import re, sys
B, T, C = 2, 256, 64
def acts(cp):
    out = open(f"{sys.argv[1]}/{cp}.out").read()
    return [float(x) * 1048576 for x in re.findall(r"activations ([0-9.]+) MiB", out)]
one = acts(1)[0]
bad = 0
for cp in (2, 4):
    scratch = 4 * B * (T // cp) * 3 * C
    for got in acts(cp):
        share = (got - scratch) / one
        print(f"CP {cp}: activations {got:.0f} bytes = {share:.4f} of one rank's {one:.0f}, + {scratch} of ring accumulators")
        if abs(share - 1 / cp) > 0.005:
            print(f"FAIL CP {cp}: the position-wise activations are {share:.4f} of one rank's, not 1/{cp}")
            bad += 1
sys.exit(1 if bad else 0)
EOF
}

# What context parallelism cannot serve: one line each, before any rank starts where the flags decide it.
t_context_parallel_errors() {
    local ok=0 s=(--layers 2 --channels 32 --heads 4 --vocab 256 --steps 0)
    expect_error "--cp 2 cuts each sequence into 4 chunks: --seq-len 30 must be divisible by 4" --nproc 2 --cp 2 "${s[@]}" --seq-len 30 || ok=1
    expect_error "--cp 2 cuts each sequence into 4 chunks: --seq-len 30 must be divisible by 4" --nproc 2 --cp 2 "${s[@]}" --max-seq-len 30 || ok=1
    expect_error "--tp 1 x --cp 3 x --pp 1 = 3 does not divide the 4 ranks" --nproc 4 --cp 3 "${s[@]}" --seq-len 36 || ok=1
    expect_error "--sp splits each rank's 6 positions (--seq-len 12 / --cp 2) over the --tp 4 ranks" --nproc 8 --cp 2 --tp 4 --sp "${s[@]}" --seq-len 12 || ok=1
    expect_error "--cp must be between 1 and 4096, got '0'" "${s[@]}" --cp 0 || ok=1
    return $ok
}

# Per-rank memory under tensor parallelism: weights, gradients and optimizer state fall to 1/TP of
# the split tensors (replicated LayerNorms, biases and position embedding aside), and the largest
# logits buffer is B x T x ceil(Vp/TP).
t_tensor_parallel_memory() {
    have_torch || return $?
    local d=$WORK/tpm
    mkdir -p "$d"
    for tp in 1 2 4; do
        for sp in "" --sp; do
            [ $tp = 1 ] && [ -n "$sp" ] && continue
            timeout 120 $TRAIN --nproc $tp --tp $tp $sp --layers 4 --channels 128 --heads 4 --vocab 256 --seq-len 32 \
                --micro-batch 2 --steps 0 >"$d/$tp$sp.out" || return 1
        done
    done
    $PY - "$d" <<'EOF'
import math, re, sys
d = sys.argv[1]
L, C, V, Vp, T, B, maxT = 4, 128, 256, 256, 32, 2, 32
BT = B * T
replicated = maxT * C + L * 6 * C + 2 * C            # wpe, 2 LayerNorms + 2 row-parallel biases per block, lnf
def rows_bytes(R):  # residual-stream buffers: ln1, residual2, ln2, residual3 and 2 LayerNorm statistics per block,
    return 4 * (L * (4 * R * C + 4 * R) + 3 * R * C + 2 * R)  # encoded, lnf, dresidual and lnf's statistics
bad = 0
def mem(path):
    out = open(path).read()
    lines = re.findall(r"memory of rank \d+ .*", out)
    return out, [dict((k, float(v) * 1048576) for k, v in re.findall(r"(\w+(?: buffers)?) ([0-9.]+) MiB", l)) for l in lines], lines
for tp in (1, 2, 4):
    out, mems, lines = mem(f"{d}/{tp}.out")
    n_full = int(re.search(r"\| (\d+) parameters", out).group(1))
    vp_tp = math.ceil(Vp / tp)
    local = (n_full - replicated - Vp * C) / tp + replicated + vp_tp * C
    for got, line in zip(mems, lines):
        for name, per in (("weights", 4), ("gradients", 4), ("optimizer", 8)):
            err = abs(got[name] - per * local) / (per * local)
            if err > 0.10:
                print(f"FAIL TP {tp} {name}: {got[name]:.0f} bytes, expected {per * local:.0f}")
                bad += 1
        logits = int(re.search(r"largest logits buffer (\d+) bytes", line).group(1))
        if logits != B * T * vp_tp * 4:
            print(f"FAIL TP {tp}: largest logits buffer {logits} bytes, expected B*T*Vp/TP*4 = {B * T * vp_tp * 4}")
            bad += 1
    print(f"TP {tp}: {lines[-1]}")
    if tp == 1:
        continue
    # sequence parallelism: the residual-stream buffers fall to 1/TP (plus a gathered buffer and a shard)
    _, sp_mems, sp_lines = mem(f"{d}/{tp}--sp.out")
    want = mems[0]["activations"] - rows_bytes(BT) + rows_bytes(BT // tp) + 4 * (BT * C + BT // tp * C + 2 * C)
    got = sp_mems[0]["activations"]
    print(f"TP {tp} --sp: {sp_lines[0]}")
    if abs(got - want) / want > 0.01 or got >= mems[0]["activations"]:
        print(f"FAIL TP {tp} --sp activations {got:.0f} bytes, expected {want:.0f} (without --sp {mems[0]['activations']:.0f})")
        bad += 1
sys.exit(1 if bad else 0)
EOF
}

# Pipeline parallelism: PP 2, 3, 4 x M in {1, PP, 2PP+1}, alone and in 3D layouts up to 8 ranks, equals
# one rank; the schedule every stage ran is 1F1B as simulated independently, holding at most PP
# micro-batches; reruns are bitwise; bad layouts are refused clearly.
t_pipeline() {
    have_torch || return $?
    local d=$WORK/pp ok=0
    mkdir -p "$d"
    local shape=(--layers 4 --channels 32 --heads 4 --vocab 256 --seq-len 32 --micro-batch 2 --steps 10 --lr 1e-3
        --warmup 2 --weight-decay 0.1 --clip 1.0 --bucket-mb 0.02 --train "$DATA/train.bin")
    for pp in 2 3 4; do
        for m in 1 $pp $((2 * pp + 1)); do
            local tokens=$((m * 64)) runs=()
            $TRAIN "${shape[@]}" --batch-tokens $tokens --log "$d/ref$m.jsonl" --save-model "$d/ref$m.bin" >/dev/null || return 1
            rm -rf "$d/trace-$pp-$m"
            timeout 300 $TRAIN --nproc $pp --pp $pp "${shape[@]}" --batch-tokens $tokens --comm-timeout 60 \
                --pp-trace "$d/trace-$pp-$m" --log "$d/pp$pp-m$m.jsonl" --save-model "$d/pp$pp-m$m.bin" >/dev/null || { echo "PP $pp M $m failed"; return 1; }
            $PY test/compare_runs.py 1e-5 "$d/ref$m" "$d/pp$pp-m$m" || ok=1
            $PY test/pp_schedule.py "$d/trace-$pp-$m" $pp $m || ok=1
        done
    done
    # interleaved 1F1B: V = 2 chunks per stage (8 blocks), M a multiple of PP
    local ishape=("${shape[@]}" --layers 8)
    for pp in 2 3 4; do
        for m in $pp $((2 * pp)); do
            $TRAIN "${ishape[@]}" --batch-tokens $((m * 64)) --log "$d/iref$m.jsonl" --save-model "$d/iref$m.bin" >/dev/null || return 1
            rm -rf "$d/itrace-$pp-$m"
            timeout 300 $TRAIN --nproc $pp --pp $pp --pp-virtual 2 "${ishape[@]}" --batch-tokens $((m * 64)) --comm-timeout 60 \
                --pp-trace "$d/itrace-$pp-$m" --log "$d/ipp$pp-m$m.jsonl" --save-model "$d/ipp$pp-m$m.bin" >/dev/null || { echo "interleaved PP $pp M $m failed"; return 1; }
            $PY test/compare_runs.py 1e-5 "$d/iref$m" "$d/ipp$pp-m$m" || ok=1
            $PY test/pp_schedule.py "$d/itrace-$pp-$m" $pp $m 2 || ok=1
        done
    done
    timeout 300 $TRAIN --nproc 8 --tp 2 --pp 2 --pp-virtual 2 --zero 1 "${ishape[@]}" --batch-tokens 256 --comm-timeout 60 \
        --log "$d/i3d.jsonl" --save-model "$d/i3d.bin" >/dev/null || { echo "interleaved 3D failed"; return 1; }
    $PY test/compare_runs.py 1e-5 "$d/iref4" "$d/i3d" || ok=1
    # interleaved with the tied embedding in one bucket with other units (the default 25 MiB: every
    # unit), data or context parallel: the last stage's head chunk runs first, so another unit
    # completes the embedding's bucket, whose reduction must still wait for the end stages' sum
    for cfg in "--zero 1" "--cp 2"; do
        local name=ib25$(echo "$cfg" | tr -d ' -')
        timeout 300 $TRAIN --nproc 4 --pp 2 --pp-virtual 2 $cfg "${ishape[@]}" --bucket-mb 25 --batch-tokens 256 --comm-timeout 60 \
            --log "$d/$name.jsonl" --save-model "$d/$name.bin" >/dev/null || { echo "interleaved $cfg, one bucket, failed"; return 1; }
        $PY test/compare_runs.py 1e-5 "$d/iref4" "$d/$name" || { echo "interleaved $cfg, one bucket: not the single rank's"; ok=1; }
    done
    # 3D layouts (M = 5 micro-batches per data-parallel rank) and an uneven split
    $TRAIN "${shape[@]}" --batch-tokens 640 --log "$d/ref3d.jsonl" --save-model "$d/ref3d.bin" >/dev/null || return 1
    local runs=()
    for cfg in "8 --tp 2 --pp 2 --zero 0" "8 --tp 2 --pp 2 --zero 1 --sp" "8 --tp 2 --pp 2 --zero 3" "4 --pp 2 --zero 2" \
        "6 --pp 3 --zero 1" "4 --tp 2 --pp 2 --pp-layers 3,1"; do
        local n=${cfg%% *} name
        name=l3d-$(echo "${cfg#* }" | tr -d ' ,-')
        timeout 300 $TRAIN --nproc $n ${cfg#* } "${shape[@]}" --batch-tokens 640 --comm-timeout 60 --log "$d/$name.jsonl" \
            --save-model "$d/$name.bin" >/dev/null || { echo "$cfg failed"; return 1; }
        runs+=("$d/$name")
    done
    $PY test/compare_runs.py 1e-5 "$d/ref3d" "${runs[@]}" || ok=1
    # one micro-batch per step: ZeRO-2/3 stream gradients through bucket buffers on every stage
    runs=()
    $TRAIN "${shape[@]}" --batch-tokens 128 --log "$d/ref1.jsonl" --save-model "$d/ref1.bin" >/dev/null || return 1
    for z in 2 3; do
        timeout 300 $TRAIN --nproc 4 --pp 2 --zero $z "${shape[@]}" --batch-tokens 128 --comm-timeout 60 \
            --log "$d/s1z$z.jsonl" --save-model "$d/s1z$z.bin" >/dev/null || { echo "PP 2 x DP 2 ZeRO-$z M 1 failed"; return 1; }
        runs+=("$d/s1z$z")
    done
    $PY test/compare_runs.py 1e-5 "$d/ref1" "${runs[@]}" || ok=1
    timeout 300 $TRAIN --nproc 8 --tp 2 --pp 2 --zero 3 "${shape[@]}" --batch-tokens 640 --save-model "$d/rerun.bin" >/dev/null || return 1
    cmp "$d/rerun.bin" "$d/l3d-tp2pp2zero3.bin" || { echo "rerun differs"; ok=1; }
    local err
    err=$($TRAIN --nproc 4 --pp 4 --layers 2 --channels 32 --heads 4 --vocab 256 --seq-len 32 --steps 0 2>&1 >/dev/null)
    grep -q "error: --pp 4: more pipeline stages than the model's 2 blocks" <<<"$err" || { echo "bad error: $err"; ok=1; }
    err=$($TRAIN --nproc 2 --pp 2 --pp-layers 3,2 "${shape[@]}" --steps 0 2>&1 >/dev/null)
    grep -q "error: --pp-layers '3,2' adds up to 5 blocks, but the model has 4" <<<"$err" || { echo "bad error: $err"; ok=1; }
    err=$($TRAIN --nproc 2 --pp 2 --pp-virtual 2 "${shape[@]}" --batch-tokens 192 --steps 1 2>&1 >/dev/null)
    grep -q "error: --pp-virtual 2: the 3 micro-batch(es) per step must be a multiple of --pp 2" <<<"$err" || { echo "bad error: $err"; ok=1; }
    return $ok
}

# The pipeline schedules' action lists (build/test_schedule: every schedule, p <= 8, m <= 64, against
# their definitions, and broken ones caught), and ./train schedule: 1f1b's and interleaved's F/B order is
# pp_schedule.py's (what pipeline.c runs), the timelines' lengths are the formulas', the README's
# pictures its --ascii output, bad flags one line.
t_pp_schedules() {
    ./build/test_schedule || return 1
    local ok=0 p m out
    for p in 1 2 3 4; do
        for m in 1 $p $((2 * p + 1)) 8; do
            for v in 1 2; do
                [ $v = 2 ] && [ $((m % p)) != 0 ] && continue
                local name=1f1b
                [ $v = 2 ] && name=interleaved
                $TRAIN schedule --pp $p --micro-batches $m --pp-virtual $v --pp-schedule $name >"$WORK/schedule.txt" || return 1
                $PY - $p $m $v "$WORK/schedule.txt" <<'PYEOF' || ok=1
import ast, re, sys
src = open("test/pp_schedule.py").read()
defs = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)]
exec(compile(ast.Module(body=defs, type_ignores=[]), "pp_schedule.py", "exec"))
P, M, V = map(int, sys.argv[1:4])
ranks = [l for l in open(sys.argv[4]).read().splitlines() if re.match(r"rank \d+ \(", l)]
assert len(ranks) == P, ranks
for s, line in enumerate(ranks):
    ops = [t for t in line.split(": ", 1)[1].split() if t[0] in "FB"]
    if V > 1:
        ops = [t[:-1] + "c" + str(ord(t[-1]) - ord("a")) for t in ops]
    want = one_f_one_b(P, M, s) if V == 1 else interleaved(P, M, V, s)
    if ops != want:
        sys.exit(f"rank {s}: {ops} != {want}")
PYEOF
            done
        done
    done
    # timeline lengths (F = B = W = 1): 1f1b 3(m+p-1), interleaved 3(vm+p-1), zb-h1 3m+p-1, zb-v 6m+p-1
    for spec in "1f1b 4 8 1 33" "interleaved 4 8 2 57" "zb-h1 4 8 1 27" "zb-v 4 8 2 51" "zb-h1 8 64 1 199"; do
        set -- $spec
        out=$($TRAIN schedule --pp-schedule $1 --pp $2 --micro-batches $3 --pp-virtual $4) || return 1
        grep -q "), $5 units:" <<<"$out" || { echo "$1 p $2 m $3: not $5 units: $(grep units <<<"$out")"; ok=1; }
    done
    # the README's pictures are ./train schedule --ascii's output, verbatim
    for spec in "1f1b 1" "interleaved 2" "zb-h1 1" "zb-v 2"; do
        set -- $spec
        $TRAIN schedule --pp 4 --micro-batches 8 --pp-schedule $1 --pp-virtual $2 --ascii >"$WORK/ascii.txt" || return 1
        $PY -c 'import sys; sys.exit(0 if "```\n" + open(sys.argv[1]).read() + "```\n" in open("README.md").read() else 1)' "$WORK/ascii.txt" ||
            { echo "README.md lacks ./train schedule --pp-schedule $1 --ascii's timeline (p 4, m 8)"; ok=1; }
    done
    local err
    for bad in "--pp 4 --micro-batches 6 --pp-virtual 2 --pp-schedule interleaved|--micro-batches 6 must be a multiple of --pp 4" \
        "--pp 4 --micro-batches 8 --pp-schedule zb-h2|--pp-schedule 'zb-h2': expected 1f1b, interleaved, zb-h1 or zb-v" \
        "--pp 4 --micro-batches 8 --pp-schedule zb-v --pp-virtual 1|zb-v runs two chunks per rank" \
        "--pp 4 --micro-batches 8 --pp-schedule interleaved|--pp-schedule interleaved needs --pp-virtual V of 2 or more" \
        "--pp 0 --micro-batches 8|--pp must be between 1 and 64, got '0'" "--pp 2|needs --pp P and --micro-batches M" \
        "--pp 2 --micro-batches 8 --bogus 1|unknown flag '--bogus' for ./train schedule" \
        "--pp 2 --micro-batches 8 --ascii extra|unexpected argument 'extra' for ./train schedule"; do
        err=$($ASAN schedule ${bad%%|*} 2>&1 >/dev/null) && { echo "accepted: ${bad%%|*}"; ok=1; }
        [ "$(wc -l <<<"$err")" = 1 ] && grep -qF -- "${bad#*|}" <<<"$err" || { echo "bad error for ${bad%%|*}: $err"; ok=1; }
    done
    # the schedule training would run: interleaved where --pp-virtual is above 1; counts take K (1024)
    $TRAIN schedule --pp 4 --micro-batches 8 --pp-virtual 2 >"$WORK/schedule_v2.txt" &&
        head -1 "$WORK/schedule_v2.txt" | grep -q '^schedule interleaved: 4 ranks, 8 micro-batches, 2 chunks' ||
        { echo "./train schedule --pp-virtual 2 without --pp-schedule is not interleaved"; ok=1; }
    $TRAIN schedule --pp 2 --micro-batches 1K >"$WORK/schedule1k.txt" && head -1 "$WORK/schedule1k.txt" | grep -q '^schedule 1f1b: 2 ranks, 1024 micro-batches' ||
        { echo "./train schedule --micro-batches 1K is not 1024"; ok=1; }
    return $ok
}

# Every schedule pipeline.c executes against 1F1B on the same layout: the final model bitwise (cmp of
# --save-model) for PP 2 and 4, TP 2, DP 2 x ZeRO 1 and 3 (and ZeRO-2/3 at one micro-batch, where 1f1b
# streams the gradients and the split schedules hold them all: 4 blocks a stage outgrew the stream's pool),
# CP 2, recompute selective and full, and resumes across schedules (zb-h1 and zb-v from a 1f1b
# checkpoint, 1f1b from a zb-v one), zb-h1 with as many ZeRO-3 gathers (none in W, which reads no
# weights); zb-h1's trace against 1F1B computed by pp_schedule.py with each W after its B, in
# micro-batch order; zb-v's trace against the action lists ./train schedule prints (the V placement:
# the first stage runs the embedding and the head), each chunk's Ws once and in micro-batch order,
# at most 2P chunk activations held; the refusals, one line each.
t_pp_zero_bubble() {
    local d=$WORK/zb ok=0 ZBV_TIMES=1,0.85,0.44
    mkdir -p "$d"
    local shape=(--layers 4 --channels 32 --heads 4 --vocab 256 --seq-len 32 --micro-batch 1 --steps 3 --lr 1e-3
        --warmup 2 --weight-decay 0.1 --clip 1.0 --bucket-mb 0.02 --train "$DATA/train.bin" --comm-timeout 60)
    local cfg i=0
    for cfg in "2 --pp 2|256" "4 --pp 4 --layers 8|256" "4 --pp 2 --tp 2|256" "4 --pp 2 --zero 1|256" "4 --pp 2 --zero 1 --bucket-mb 100|256" "4 --pp 2 --zero 3|256" \
        "4 --pp 2 --zero 3|64" "4 --pp 2 --zero 3 --layers 8|64" "4 --pp 2 --zero 2 --layers 8|64" "4 --pp 2 --cp 2|256" \
        "2 --pp 2 --recompute selective|256" "2 --pp 2 --recompute full|256"; do
        i=$((i + 1))
        local spec=${cfg%|*} tokens=${cfg#*|} args sch
        read -ra args <<<"--nproc $spec"
        # zb-v: the paper's unit-time lists (--pp-times unit); zb-vt: lists built for pass times where W
        # is half of F (--pp-times, schedule.h); zb-va: zb-v's default, lists for the times its first step
        # measures (--pp-times auto)
        for sch in 1f1b zb-h1 zb-v zb-vt zb-va; do
            rm -rf "$d/trace$i-$sch"
            local flags=(--pp-schedule $sch)
            [ $sch = zb-v ] && flags=(--pp-schedule zb-v --pp-times unit)
            [ $sch = zb-vt ] && flags=(--pp-schedule zb-v --pp-times "$ZBV_TIMES")
            [ $sch = zb-va ] && flags=(--pp-schedule zb-v)
            timeout 300 $TRAIN "${shape[@]}" "${args[@]}" --batch-tokens $tokens "${flags[@]}" --pp-trace "$d/trace$i-$sch" \
                --log "$d/m$i-$sch.jsonl" --save-model "$d/m$i-$sch.bin" >"$d/m$i-$sch.out" 2>&1 || { echo "'$spec' $sch failed"; tail -3 "$d/m$i-$sch.out"; return 1; }
        done
        for sch in zb-h1 zb-v zb-vt zb-va; do
            if cmp -s "$d/m$i-1f1b.bin" "$d/m$i-$sch.bin"; then echo "ok '$spec' batch $tokens tokens: $sch bitwise 1f1b"
            else echo "FAIL '$spec': $sch's model differs from 1f1b's"; ok=1; fi
        done
        # W reads no weights: ZeRO-3 gathers no more than under 1f1b
        [ "$(grep -o '"zero3_gathers":[0-9]*' "$d/m$i-1f1b.jsonl")" = "$(grep -o '"zero3_gathers":[0-9]*' "$d/m$i-zb-h1.jsonl")" ] ||
            { echo "FAIL '$spec': zb-h1's ZeRO-3 gathers differ from 1f1b's"; ok=1; }
        $PY - "$d/trace$i-zb-h1" <<'PYEOF' || { echo "FAIL '$spec': zb-h1 trace"; ok=1; }
import ast, glob, re, sys
src = open("test/pp_schedule.py").read()
defs = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)]
exec(compile(ast.Module(body=defs, type_ignores=[]), "pp_schedule.py", "exec"))
files = sorted(glob.glob(sys.argv[1] + "/stage*.txt"), key=lambda f: int(re.findall(r"\d+", f.split("/")[-1])[0]))
P = len(files)
for s, f in enumerate(files):
    for line in open(f).read().splitlines():
        m = re.match(r"step \d+ peak (\d+): (.*)", line)
        ops = m.group(2).split()
        M = sum(o[0] == "F" for o in ops)
        fb = [o for o in ops if o[0] in "FB"]
        assert fb == one_f_one_b(P, M, s), (s, fb)
        ws = [int(o[1:]) for o in ops if o[0] == "W"]
        assert ws == list(range(M)), (s, ws)  # each W once, in micro-batch order
        for k in range(M):
            assert ops.index(f"B{k}") < ops.index(f"W{k}"), (s, k)
        assert int(m.group(1)) <= min(P, M), (s, m.group(1))  # zb-h1's bound: 1f1b's first-rank peak
PYEOF
        local P M
        P=$(grep -o -- '--pp [0-9]*' <<<"$spec" | cut -d' ' -f2)
        M=$(sed -n 's/^batch: .* = \([0-9]*\) micro-batch(es).*/\1/p' "$d/m$i-zb-v.out")
        # each runs the lists ./train schedule prints: zb-va the unit lists in step 1, then those for the
        # times it printed if it said it built them
        $TRAIN schedule --pp-schedule zb-v --pp $P --micro-batches $M --pp-times unit >"$d/sched$i.txt" || { echo "FAIL: ./train schedule zb-v"; ok=1; }
        $TRAIN schedule --pp-schedule zb-v --pp $P --micro-batches $M | cmp -s - "$d/sched$i.txt" ||
            { echo "FAIL: ./train schedule zb-v's default lists are not --pp-times unit's"; ok=1; }
        $TRAIN schedule --pp-schedule zb-v --pp $P --micro-batches $M --pp-times "$ZBV_TIMES" >"$d/schedt$i.txt" || { echo "FAIL: ./train schedule zb-v --pp-times"; ok=1; }
        local auto
        auto=$(sed -n 's/^zb-v: the first step measured .* (--pp-times \([0-9.e,+-]*\)); \(.*\)$/\1 \2/p' "$d/m$i-zb-va.out")
        [ -n "$auto" ] || { echo "FAIL '$spec': zb-v (default --pp-times auto) printed no measured times"; ok=1; auto="1,1,1 -"; }
        ! grep -q '^zb-v: the first step measured' "$d/m$i-zb-v.out" || { echo "FAIL '$spec': zb-v --pp-times unit measured its passes"; ok=1; }
        $TRAIN schedule --pp-schedule zb-v --pp $P --micro-batches $M --pp-times "auto:${auto%% *}" >"$d/scheda$i.txt" 2>/dev/null ||
            cp "$d/sched$i.txt" "$d/scheda$i.txt" # (1,1,1: the unit lists)
        [[ "$auto" == *"lists built for them from the next step" ]] || cp "$d/sched$i.txt" "$d/scheda$i.txt"
        for sch in zb-v zb-vt zb-va; do
        local first=$d/sched$i.txt rest=$d/sched$i.txt
        [ $sch = zb-vt ] && first=$d/schedt$i.txt rest=$d/schedt$i.txt
        [ $sch = zb-va ] && rest=$d/scheda$i.txt
        $PY - "$d/trace$i-$sch" "$first" "$rest" <<'PYEOF' || { echo "FAIL '$spec': $sch trace"; ok=1; }
import glob, re, sys
files = sorted(glob.glob(sys.argv[1] + "/stage*.txt"), key=lambda f: int(re.findall(r"\d+", f.split("/")[-1])[0]))
def read_lists(path):
    lists = {}
    for line in open(path):
        m = re.match(r"rank (\d+) \(bound", line)
        if m:  # the compute actions of rank r, F0a -> F0c0
            lists[int(m.group(1))] = [t[:-1] + "c" + str("ab".index(t[-1])) for t in line.split(":", 1)[1].split() if re.fullmatch(r"[FBW]\d+[ab]", t)]
    return lists
first, rest = read_lists(sys.argv[2]), read_lists(sys.argv[3])
P = len(files)
assert sorted(first) == list(range(P)) and sorted(rest) == list(range(P)), first.keys()
for s, f in enumerate(files):
    for line in open(f).read().splitlines():
        m = re.match(r"step (\d+) peak (\d+): (.*)", line)
        ops = m.group(3).split()
        lists = first if int(m.group(1)) == 1 else rest
        assert ops == lists[s], (s, m.group(1), ops, lists[s])
        M = sum(o[0] == "F" for o in ops) // 2
        for c in (0, 1):
            ws = [int(o[1:-2]) for o in ops if o[0] == "W" and o.endswith(f"c{c}")]
            assert ws == list(range(M)), (s, c, ws)  # each W once, in micro-batch order
            for k in range(M):
                assert ops.index(f"F{k}c{c}") < ops.index(f"B{k}c{c}") < ops.index(f"W{k}c{c}"), (s, k, c)
        assert int(m.group(2)) <= 2 * P, (s, m.group(2))  # zb-v's bound: 2P chunk activations
PYEOF
        done
    done
    # interleaved through the executor by name is the default with --pp-virtual 2
    local ishape=("${shape[@]}" --layers 8 --batch-tokens 256)
    for sch in "" "--pp-schedule interleaved"; do
        timeout 300 $TRAIN --nproc 2 --pp 2 --pp-virtual 2 $sch "${ishape[@]}" --save-model "$d/iv${sch:+n}.bin" >/dev/null || return 1
    done
    cmp "$d/iv.bin" "$d/ivn.bin" || { echo "FAIL: --pp-schedule interleaved differs from --pp-virtual 2"; ok=1; }
    # a checkpoint written under 1f1b resumed under zb-h1 ends where 1f1b ends
    local rs=(--nproc 4 --pp 2 --zero 1 "${shape[@]}" --batch-tokens 256 --steps 4)
    timeout 300 $TRAIN "${rs[@]}" --ckpt-dir "$d/c1" --ckpt-every 2 --save-model "$d/r-a.bin" >"$d/r.out" 2>&1 || { echo "resume: first run failed"; return 1; }
    timeout 300 $TRAIN "${rs[@]}" --pp-schedule zb-h1 --resume "$d/c1/ckpt_00000002" --ckpt-dir "$d/c2" --save-model "$d/r-b.bin" >>"$d/r.out" 2>&1 ||
        { echo "resume: zb-h1 run failed"; tail -3 "$d/r.out"; return 1; }
    grep -q "^resumed from $d/c1/ckpt_00000002: step 2" "$d/r.out" || { echo "FAIL: did not resume"; ok=1; }
    cmp "$d/r-a.bin" "$d/r-b.bin" || { echo "FAIL: zb-h1 resumed from 1f1b's checkpoint differs"; ok=1; }
    # zb-v places the blocks otherwise (the first stage holds the first and the last chunk): its
    # checkpoints re-shard to 1f1b's placement and back
    timeout 300 $TRAIN "${rs[@]}" --pp-schedule zb-v --resume "$d/c1/ckpt_00000002" --ckpt-dir "$d/c3" --save-model "$d/r-v.bin" >>"$d/r.out" 2>&1 ||
        { echo "resume: zb-v run failed"; tail -3 "$d/r.out"; return 1; }
    cmp "$d/r-a.bin" "$d/r-v.bin" || { echo "FAIL: zb-v resumed from 1f1b's checkpoint differs"; ok=1; }
    timeout 300 $TRAIN "${rs[@]}" --pp-schedule zb-v --ckpt-dir "$d/c4" --ckpt-every 2 --steps 2 >>"$d/r.out" 2>&1 || { echo "resume: zb-v first run failed"; return 1; }
    timeout 300 $TRAIN "${rs[@]}" --resume "$d/c4/ckpt_00000002" --ckpt-dir "$d/c5" --save-model "$d/r-w.bin" >>"$d/r.out" 2>&1 ||
        { echo "resume: 1f1b from zb-v failed"; tail -3 "$d/r.out"; return 1; }
    grep -q "^resumed from $d/c4/ckpt_00000002: step 2" "$d/r.out" || { echo "FAIL: did not resume from zb-v's checkpoint"; ok=1; }
    cmp "$d/r-a.bin" "$d/r-w.bin" || { echo "FAIL: 1f1b resumed from zb-v's checkpoint differs"; ok=1; }
    # the planner's bubble column follows --pp-schedule: the closed forms, computed here
    for sch in 1f1b interleaved zb-h1 zb-v; do # bubbles 3/11, 3/19, 3/27, 3/51
        set -- $sch
        local got want
        got=$($TRAIN plan --model d12 --gpus 8 --pp 4 --tp 2 --micro-batches 8 --batch-tokens 64K --pp-schedule $1 --json 2>/dev/null |
            $PY -c 'import json, sys; print(round(100 * [y for y in json.load(sys.stdin)["layouts"] if y["pp"] == 4 and y["tp"] == 2][0]["bubble"], 3))') ||
            { echo "FAIL: plan --pp-schedule $1"; ok=1; continue; }
        want=$($PY -c "print(round(100 * 3 / (3 + 8 * {'1f1b': 1, 'interleaved': 2, 'zb-h1': 3, 'zb-v': 6}['$1']), 3))")
        [ "$got" = "$want" ] || { echo "FAIL: plan --pp-schedule $1 bubble $got% != $want%"; ok=1; }
    done
    local bad err
    for bad in "--pp-schedule zb-v --pp-virtual 3|--pp-schedule zb-v runs two chunks per stage (a V): --pp-virtual 3" \
        "--pp-schedule zb-v --pp-virtual 1|--pp-schedule zb-v runs two chunks per stage (a V): --pp-virtual 1" \
        "--pp-schedule interleaved|--pp-schedule interleaved needs --pp-virtual V of 2 or more chunks per stage (default 1)" \
        "--pp-schedule interleaved --pp-virtual 1|--pp-schedule interleaved needs --pp-virtual V of 2 or more" \
        "--pp-schedule zb-v --layers 3|--pp-schedule zb-v places two chunks per stage: --pp 2 needs 4 blocks, the model has 3" \
        "--pp-schedule zb-v --pp-layers 2,2|--pp-layers cannot be combined with --pp-schedule zb-v" "--pp-schedule zb-h2|--pp-schedule must be 1f1b, interleaved, zb-h1 or zb-v, got 'zb-h2'" \
        "--pp-schedule 1f1b --pp-virtual 2|--pp-schedule 1f1b runs one chunk per stage: --pp-virtual 2" \
        "--pp-schedule zb-h1 --pp-virtual 2|--pp-schedule zb-h1 runs one chunk per stage" \
        "--pp-schedule zb-h1 --pp-times 1,1,0.5|--pp-times 1,1,0.5: only zb-v's action lists are built for pass times" \
        "--pp-schedule zb-v --pp-times 1,0.5|--pp-times '1,0.5': expected F,B,W, three positive numbers" \
        "--pp-schedule zb-v --pp-times 1,0,1|--pp-times (B) must be between 1e-06 and 1e+06, got '0'" \
        "--pp-schedule zb-v --pp-times 1,1,1,|--pp-times '1,1,1,': expected F,B,W"; do
        err=$($TRAIN --nproc 2 --pp 2 "${shape[@]}" ${bad%%|*} --batch-tokens 256 --steps 1 2>&1 >/dev/null) && { echo "accepted: ${bad%%|*}"; ok=1; }
        [ "$(wc -l <<<"$err")" = 1 ] && grep -qF -- "${bad#*|}" <<<"$err" || { echo "bad error for ${bad%%|*}: $err"; ok=1; }
    done
    return $ok
}

# --pp-schedule-dump: a training run's table (1f1b, zb-h1, interleaved on PP 2) holds the action lists
# ./train schedule writes for the same p, m, v, each as test/schedule_dump_check.py computes them, with
# measured times in order on each rank and every receive after its send; the dump changes no bit of the
# model; a bad path is one line before any step.
t_pp_schedule_dump() {
    local d=$WORK/ppdump ok=0 spec sch v args
    mkdir -p "$d"
    local shape=(--layers 4 --channels 32 --heads 4 --vocab 256 --seq-len 32 --micro-batch 1 --steps 2 --lr 1e-3
        --batch-tokens 256 --train "$DATA/train.bin" --comm-timeout 60)
    for spec in "1f1b 1" "zb-h1 1" "interleaved 2"; do
        set -- $spec
        sch=$1 v=$2
        timeout 300 $TRAIN --nproc 2 --pp 2 --pp-virtual $v --pp-schedule $sch "${shape[@]}" --pp-schedule-dump "$d/$sch.tsv" \
            --save-model "$d/$sch-dump.bin" >"$d/$sch.out" 2>&1 || { echo "$sch run failed"; tail -3 "$d/$sch.out"; return 1; }
        $TRAIN schedule --pp 2 --micro-batches 8 --pp-virtual $v --pp-schedule $sch --pp-schedule-dump "$d/$sch-unit.tsv" >/dev/null || return 1
        $PY test/schedule_dump_check.py "$d/$sch.tsv" "$d/$sch-unit.tsv" || { echo "FAIL: $sch's dump"; ok=1; }
    done
    timeout 300 $TRAIN --nproc 2 --pp 2 --pp-schedule zb-h1 "${shape[@]}" --save-model "$d/zb-h1-plain.bin" >/dev/null 2>&1 || return 1
    cmp "$d/zb-h1-plain.bin" "$d/zb-h1-dump.bin" || { echo "FAIL: --pp-schedule-dump changed the model"; ok=1; }
    expect_error "--pp-schedule-dump" --nproc 2 --pp 2 "${shape[@]}" --pp-schedule-dump "$d/no/such/dir/x.tsv" || ok=1
    return $ok
}

# The pipeline's hand-offs, counted (load-independent: no clock). On shared memory each hand-off is one
# copy, made by the receiver straight from the sender's buffer, and wakes no progress thread (net_shm.c,
# collectives.c): test_comm's ping-pong at 4 KiB to 1 MiB, then each schedule's training run at PP 2, whose
# step records must say so against the closed forms here: hand-offs per step 2(PV - 1)M (an activation
# and a gradient across each of the PV - 1 boundaries between virtual stages, less zb-v's two local
# turns), one copy and B·T·C·4 bytes each, no wake-up.
t_pp_handoffs() {
    local d=$WORK/pphand ok=0 spec sch v want rec
    mkdir -p "$d"
    timeout 300 ./build/test_comm --nproc 2 --comm-timeout 60 --handoffs || { echo "hand-off counts failed"; return 1; }
    local shape=(--layers 4 --heads 4 --vocab 256 --seq-len 32 --micro-batch 1 --steps 2 --batch-tokens 256 --threads 1
        --train "$DATA/train.bin" --comm-timeout 60)
    for spec in "1f1b 1 32 2" "interleaved 2 32 6" "zb-h1 1 128 2" "zb-v 2 128 4"; do # schedule, V, C, hand-offs per M
        set -- $spec
        sch=$1 v=$2 c=$3 want=$(($4 * 8)) # M = 256 / 32 = 8 micro-batches
        timeout 300 $TRAIN --nproc 2 --pp 2 --pp-virtual $v --pp-schedule $sch --channels $c "${shape[@]}" --log "$d/$sch.jsonl" \
            >"$d/$sch.out" 2>&1 || { echo "$sch run failed"; tail -3 "$d/$sch.out"; return 1; }
        rec=$(grep '"step":2,' "$d/$sch.jsonl")
        $PY - "$sch" "$want" "$((32 * c * 4))" "$rec" <<'PYEOF' || ok=1
import json, sys
sch, want, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = json.loads(sys.argv[4])
got = (r["pp_handoffs"], r["pp_copies_per_handoff"], r["pp_bytes_per_handoff"], r["pp_wakeups_per_handoff"])
print(f"{sch}: {got[0]} hand-offs, {got[1]} copies of {got[2]} bytes and {got[3]} progress-thread wake-ups each")
if got != (want, 1, nbytes, 0):
    sys.exit(f"FAIL: {sch}: expected {want} hand-offs, 1 copy of {nbytes} bytes and 0 wake-ups each")
PYEOF
    done
    return $ok
}

# The measured bubble counts every stage's idle time in the pipeline, the last stage's drain included
# (after its last pass it waits for the first stage's last backward in the step's reductions, not in a
# receive: the bubble left that out, and divided by the whole step, optimizer included). The reference is
# the run's own --pp-schedule-dump, timed apart from the step record: on each rank its span (first action's
# start to last action's end) and its passes' time (F, B, W); the pipeline's span the longest of the
# ranks'; a rank's bubble 1 - passes / span. The record's bubble per rank (pp_idle_ms over busy + idle)
# must be within 0.03 of it (the two differ by the instants between a pass's timer and the next action's,
# microseconds), and its lists agree with bubble_mean and bubble_max.
t_pp_bubble() {
    local d=$WORK/ppbubble ok=0 sch
    mkdir -p "$d"
    for sch in 1f1b zb-h1; do
        timeout 300 $TRAIN --nproc 2 --pp 2 --pp-schedule $sch --layers 4 --channels 64 --heads 4 --vocab 256 --seq-len 64 \
            --micro-batch 1 --batch-tokens 256 --steps 2 --threads 1 --train "$DATA/train.bin" --comm-timeout 60 \
            --log "$d/$sch.jsonl" --pp-schedule-dump "$d/$sch.tsv" >"$d/$sch.out" 2>&1 || { echo "$sch run failed"; tail -3 "$d/$sch.out"; return 1; }
        $PY - "$sch" "$d/$sch.jsonl" "$d/$sch.tsv" <<'PYEOF' || ok=1
import json, sys
sch = sys.argv[1]
r = [r for r in map(json.loads, open(sys.argv[2])) if r.get("step") == 2][0]
busy, idle = r["pp_busy_ms"], r["pp_idle_ms"]
spans = [b + i for b, i in zip(busy, idle)]
assert len(spans) == 2 and max(spans) - min(spans) < 0.01, "busy + idle differ between the stages: %s" % spans
got = [i / spans[0] for i in idle]
assert abs(sum(got) / 2 - r["bubble_mean"]) < 2e-3 and abs(max(got) - r["bubble_max"]) < 2e-3, (got, r)
first, last, passes = {}, {}, {}
for line in open(sys.argv[3]):
    f = line.rstrip("\n").split("\t")
    if line.startswith("#") or f[0] == "rank":
        continue
    rank, act, t0, t1 = int(f[0]), f[2], float(f[6]), float(f[7])
    first[rank] = min(first.get(rank, t0), t0)
    last[rank] = max(last.get(rank, t1), t1)
    passes[rank] = passes.get(rank, 0.0) + (t1 - t0 if act in ("F", "B", "W") else 0.0)
span = max(last[q] - first[q] for q in (0, 1))
want = [1 - passes[q] / span for q in (0, 1)]
print("%s, PP 2, M 4: bubble per rank %s, from the dump %s" % (sch, " ".join("%.3f" % x for x in got), " ".join("%.3f" % x for x in want)))
bad = [q for q in (0, 1) if abs(got[q] - want[q]) > 0.03]
assert not bad, "rank(s) %s: the step record's bubble is not the dump's" % bad
PYEOF
    done
    return $ok
}

# The backward's input and weight halves (model.h) against the fused backward, bitwise: recompute none,
# selective, full; whole model, first and last stage, one or two chunks; fp32 and bf16; TP 2 (with and
# without SP) and CP 2 on two ranks.
t_split_backward() {
    OMP_NUM_THREADS=1 ./build/test_split || return 1
    OMP_NUM_THREADS=1 timeout 600 ./build/test_split --nproc 2
}

# bf16 data parallelism against the single-rank bf16 run, and clipping that bites.
t_data_parallel_bf16_clip() {
    have_torch || return $?
    local d=$WORK/dpb ok=0
    mkdir -p "$d"
    $TRAIN "${DPFLAGS[@]}" --train "$DATA/train.bin" --batch-tokens 256 --dtype bf16 --log "$d/ref.jsonl" --save-model "$d/ref.bin" >/dev/null || return 1
    for z in 1 3; do
        timeout 300 $TRAIN --nproc 2 "${DPFLAGS[@]}" --train "$DATA/train.bin" --batch-tokens 256 --dtype bf16 --zero $z \
            --log "$d/z$z.jsonl" --save-model "$d/z$z.bin" >/dev/null || return 1
    done
    $PY test/compare_runs.py 1e-2 "$d/ref" "$d/z1" "$d/z3" || ok=1
    # clipping active on every step: a small threshold
    $TRAIN "${DPFLAGS[@]}" --train "$DATA/train.bin" --batch-tokens 256 --clip 0.05 --log "$d/cref.jsonl" --save-model "$d/cref.bin" >/dev/null || return 1
    timeout 300 $TRAIN --nproc 2 "${DPFLAGS[@]}" --train "$DATA/train.bin" --batch-tokens 256 --clip 0.05 --zero 2 \
        --log "$d/c.jsonl" --save-model "$d/c.bin" >/dev/null || return 1
    grep -q '"grad_norm":0.0[0-4]' "$d/cref.jsonl" && { echo "clipping threshold was never exceeded"; ok=1; }
    $PY test/compare_runs.py 1e-5 "$d/cref" "$d/c" || ok=1
    return $ok
}

# ./train plan against the seed's formulas recomputed in test/plan_check.py (every field of every
# layout, the set of layouts, the reasons, the order, for GPT-2 and Llama shapes; the Llama presets'
# parameter counts against Meta's totals; the README's 70B and Beacon tables); the planner also runs
# clean under ASan/UBSan, table and JSON.
t_plan() {
    $PY test/plan_check.py "$TRAIN" README.md || return 1
    $ASAN plan --layers 126 --channels 16384 --heads 128 --seq-len 4096 --gpus 16384 --batch-tokens 16M \
        --micro-batches 8 --zero 1 --recompute full >"$WORK/plan.txt" || return 1
    grep -q '^   8    1    4    512 ' "$WORK/plan.txt" || { echo "the 405B table lacks TP 8 x CP 1 x PP 4 x DP 512"; return 1; }
    grep -q '^   8    2    4    256 ' "$WORK/plan.txt" || { echo "the 405B table lacks TP 8 x CP 2 x PP 4 x DP 256"; return 1; }
    $ASAN plan --model d12 --gpus 6 --batch-tokens 24K --json | $PY -c 'import json, sys; json.load(sys.stdin)'
    $ASAN plan --model llama3-405b --gpus 16384 --batch-tokens 16000000 --top 3 >"$WORK/plan_llama.txt" || return 1
    grep -q '^model: Llama, L 126, C 16384, H 128, KV heads 8, FFN 53248, V 128256' "$WORK/plan_llama.txt" ||
        { echo "the Llama 3.1 405B plan lacks its model line"; return 1; }
    $ASAN plan comm --model llama3-405b --seq-len 8192 --gpus 16384 --tp 8 --cp 2 --pp 16 --dp 64 --batch-tokens 16M \
        --json | $PY -c 'import json, sys; json.load(sys.stdin)'
    # --exact builds every stage of every layout dry (fake addresses, nothing allocated): clean under ASan/UBSan
    # (the GPT-style 405B and Llama 3.1 405B, whose TP slices hold one kv head per rank)
    local shape
    for shape in "--layers 126 --channels 16384 --heads 128" "--model llama3-405b"; do
        $ASAN plan $shape --seq-len 4096 --gpus 16384 --batch-tokens 16M --micro-batches 8 --zero 3 --recompute selective \
            --exact --sp --interleaved --ckpt --json >"$WORK/plan_exact.json" || return 1
        $PY - "$WORK/plan_exact.json" <<'EOF' || return 1
import json, sys
d = json.load(open(sys.argv[1]))
runs = [y for y in d["layouts"] if y["runs"]]
assert runs and all(len(y["exact"]["stages"]) == y["pp"] for y in runs)
assert all(y["exact"]["total"] == sum(y["exact"]["stages"][y["exact"]["stage"]].values()) for y in runs)
print(d["model"]["arch"], len(runs), "layouts with llm4d's buffers on every stage")
EOF
    done
}

# ./train plan comm (one layout's communication per traffic class and algorithm, alpha-beta model)
# against the closed forms recomputed in test/comm_model_check.py: every number for five layouts, the
# transports' staging constants as the source states them, the seed's Beacon figures within stated
# tolerances, fan-in's connection, staging and incast counts, and the README's Beacon table; the table
# and the JSON also run clean under ASan/UBSan.
t_comm_model() {
    $PY test/comm_model_check.py "$TRAIN" README.md || return 1
    local beacon=(plan comm --params 405B --layers 126 --channels 16384 --heads 128 --seq-len 4096 --gpus 16384
        --tp 8 --pp 16 --dp 128 --batch-tokens 16e6 --intra-bw 450)
    $ASAN "${beacon[@]}" >"$WORK/comm.txt" || return 1
    grep -Eq '^dp +fanin +128/1/128 .* 127 \(0\+127\) ' "$WORK/comm.txt" || { echo "the Beacon table lacks DP fanin's 127 connections"; return 1; }
    $ASAN "${beacon[@]}" --json | $PY -c 'import json, sys; json.load(sys.stdin)'
}

# The planner takes a layout where the trainer does, and refuses it (a reason in its row) where the
# trainer refuses it: each case runs both. (A helper's sweep found these five apart.)
t_plan_trainer_agree() {
    local ok=0 S=(--layers 4 --channels 64 --heads 4 --vocab 256) c trainer planner reason
    while IFS='|' read -r c reason trainer planner; do
        read -ra trainer <<<"$trainer"
        read -ra planner <<<"$planner"
        local tout pout trc=0
        tout=$(timeout 120 $TRAIN "${S[@]}" --train "$DATA/train.bin" --threads 1 --steps 1 "${trainer[@]}" 2>&1) || trc=1
        pout=$($TRAIN plan "${S[@]}" "${planner[@]}" 2>&1 | tail -1) || { echo "FAIL $c: plan failed: $pout"; ok=1; continue; }
        if [ -z "$reason" ]; then
            [ $trc -eq 0 ] && ! grep -q '(' <<<"$pout" || { echo "FAIL $c: trainer rc $trc, plan row: $pout"; ok=1; }
        else
            [ $trc -ne 0 ] && grep -qF "($reason)" <<<"$pout" || { echo "FAIL $c: trainer: $(tail -1 <<<"$tout"); plan: $pout"; ok=1; }
        fi
        echo "ok $c"
    done <<'CASES'
odd T without CP||--seq-len 63 --micro-batch 2 --batch-tokens 126|--seq-len 63 --gpus 1 --batch-tokens 126 --micro-batches 1
SP with T not divisible by TP|sequence parallelism needs T (and T / CP) divisible by TP|--seq-len 6 --micro-batch 2 --batch-tokens 12 --nproc 4 --tp 4 --sp|--exact --device cpu --dtype fp32 --seq-len 6 --gpus 4 --tp 4 --sp --batch-tokens 12 --micro-batches 1
zb-v on fewer than 2 PP layers|zb-v's two chunks a stage need 2·PP layers|--layers 2 --seq-len 64 --micro-batch 1 --batch-tokens 128 --nproc 2 --pp 2 --pp-schedule zb-v|--layers 2 --seq-len 64 --gpus 2 --pp 2 --pp-schedule zb-v --batch-tokens 128 --micro-batches 2
70000 micro-batches|more micro-batches (2^16) or tokens (2^28) a rank and step than llm4d takes|--seq-len 16 --micro-batch 1 --batch-tokens 1120000|--seq-len 16 --gpus 1 --batch-tokens 1120000 --micro-batches 70000
CASES
    expect_error "--interleaved counts the interleaved schedule: drop --pp-schedule zb-v" plan "${S[@]}" --gpus 2 --batch-tokens 1024 \
        --seq-len 64 --exact --interleaved --pp-schedule zb-v || ok=1
    expect_error "plan: --gpu-mem 0.000001GB is 1000 bytes, below the 1 MiB of any GPU" plan "${S[@]}" --gpus 1 --batch-tokens 1024 \
        --gpu-mem 0.000001GB || ok=1
    return $ok
}

t_plan_bad_input() {
    local ok=0 p=(plan --gpus 8 --batch-tokens 64K)
    expect_error "plan: --gpus is required" plan --batch-tokens 4M || ok=1
    expect_error "plan: --batch-tokens is required" plan --gpus 8 || ok=1
    expect_error "--gpus must be between 1 and" plan --gpus 0 --batch-tokens 4M || ok=1
    expect_error "--gpus expects a whole number, got '8.5'" plan --gpus 8.5 --batch-tokens 4M || ok=1
    expect_error "--gpu-mem: unknown unit 'XB' in '80XB'" "${p[@]}" --gpu-mem 80XB || ok=1
    expect_error "plan: --gpu-mem 80 is 80 bytes: give a unit, e.g. 80GB (1e9) or 80GiB (2^30)" "${p[@]}" --gpu-mem 80 || ok=1
    expect_error "--batch-tokens: unknown unit 'm'" plan --gpus 8 --batch-tokens 4m || ok=1
    expect_error "--flops expects a number, got 'fast'" "${p[@]}" --flops fast || ok=1
    expect_error "--intra-bw must be between" "${p[@]}" --intra-bw 0 || ok=1
    expect_error "--recompute must be none, selective or full, got 'some'" "${p[@]}" --recompute some || ok=1
    expect_error "--attention must be flash or full" "${p[@]}" --attention paged || ok=1
    expect_error "--dtype must be bf16 or fp32, got 'fp16'" "${p[@]}" --dtype fp16 || ok=1
    expect_error "--zero must be between 0 and 3, got '4'" "${p[@]}" --zero 4 || ok=1
    expect_error "--model must be d12, d24, d36 or d48 (GPT-2), or llama3-tiny, llama3.2-1b, llama3-8b, llama3-70b or llama3-405b, got 'd13'" "${p[@]}" --model d13 || ok=1
    expect_error "channels (768) must be divisible by heads (5)" "${p[@]}" --heads 5 || ok=1
    expect_error "--seq-len 2048 is above the model's maximum sequence length 1024" "${p[@]}" --seq-len 2048 || ok=1
    expect_error "--params needs --layers and --channels" "${p[@]}" --params 70B || ok=1
    expect_error "--params replaces the shape's parameter count" "${p[@]}" --params 70B --model d12 || ok=1
    expect_error "--sp describes llm4d's own buffers: it needs --exact" "${p[@]}" --sp || ok=1
    expect_error "--algo describes llm4d's own buffers: it needs --exact" "${p[@]}" --algo ring || ok=1
    expect_error "--algo must be auto, fanin, ring or hier, got 'tree'" "${p[@]}" --exact --algo tree || ok=1
    expect_error "--device must be cuda or cpu, got 'tpu'" "${p[@]}" --exact --device tpu || ok=1
    # the trainer's name for the GPU, cuda, is the planner's gpu
    [ "$($TRAIN "${p[@]}" --exact --device cuda 2>&1)" = "$($TRAIN "${p[@]}" --exact --device gpu 2>&1)" ] ||
        { echo "FAIL: plan --exact --device cuda differs from --device gpu"; ok=1; }
    expect_error "--exact counts llm4d's buffers, and its attention is flash" "${p[@]}" --exact --attention full || ok=1
    expect_error "not --params" plan --gpus 8 --batch-tokens 64K --params 7B --layers 32 --channels 4096 --exact || ok=1
    expect_error "--bucket-mb expects a number, got 'big'" "${p[@]}" --exact --bucket-mb big || ok=1
    expect_error "plan: unknown flag --bogus (see ./train plan --help)" "${p[@]}" --bogus 1 || ok=1
    expect_error "plan: unknown flag --gpu: did you mean --gpus?" "${p[@]}" --gpu 8 || ok=1
    expect_error "--plot needs a value" "${p[@]}" --plot || ok=1
    expect_error "plan: no layout of 8 GPUs has the --tp/--cp/--pp/--dp asked for" "${p[@]}" --tp 3 || ok=1
    expect_error "plan: no layout of 8 GPUs has the --tp/--cp/--pp/--dp asked for" "${p[@]}" --cp 16 || ok=1
    expect_error "--cp must be between 1 and" "${p[@]}" --cp 0 || ok=1
    # the Llama family
    expect_error "--arch must be gpt2 or llama, got 'mamba'" "${p[@]}" --arch mamba || ok=1
    expect_error "--kv-heads, --ffn, --tie-embeddings, --rope-theta, --rope-scaling and --norm-eps are the Llama family's: give --arch llama" \
        "${p[@]}" --kv-heads 4 || ok=1
    expect_error "are the Llama family's" "${p[@]}" --model d12 --ffn 2048 || ok=1
    expect_error "--model llama3-8b is a Llama: drop --arch gpt2" "${p[@]}" --model llama3-8b --arch gpt2 || ok=1
    expect_error "--arch llama: --model must be llama3-tiny, llama3.2-1b, llama3-8b, llama3-70b or llama3-405b, got 'llama4'" \
        "${p[@]}" --arch llama --model llama4 || ok=1
    expect_error "--rope-theta must be between" "${p[@]}" --arch llama --rope-theta 1 || ok=1
    expect_error "--rope-scaling '0.5': needs FACTOR >= 1" "${p[@]}" --arch llama --rope-scaling 0.5 || ok=1
    expect_error "heads (32) must be a positive multiple of kv heads (5)" "${p[@]}" --arch llama --kv-heads 5 || ok=1
    expect_error "--tie-embeddings must be between 0 and 1, got '2'" "${p[@]}" --arch llama --tie-embeddings 2 || ok=1
    expect_error "--params is for GPT-2 shapes" "${p[@]}" --arch llama --params 7B --layers 32 --channels 4096 || ok=1
    expect_error "--seq-len 16384 is above the model's maximum sequence length 8192" "${p[@]}" --model llama3-8b --seq-len 16384 || ok=1
    # plan comm: one layout, its latencies in microseconds
    local c=(plan comm --gpus 8 --batch-tokens 64K --tp 2 --pp 2 --dp 2)
    expect_error "--intra-lat is for ./train plan comm" "${p[@]}" --intra-lat 2 || ok=1
    expect_error "--inter-lat is for ./train plan comm" "${p[@]}" --inter-lat 2 || ok=1
    expect_error "--inter-lat must be between 0 and 1e+06, got '-1'" "${c[@]}" --inter-lat -1 || ok=1
    expect_error "--intra-lat expects a number, got 'fast'" "${c[@]}" --intra-lat fast || ok=1
    expect_error "--inter-lat needs a value" "${c[@]}" --inter-lat || ok=1
    expect_error "plan comm: give one layout: --tp, --pp and --dp (and --cp) with TP x CP x PP x DP = 8" plan comm --gpus 8 --batch-tokens 64K || ok=1
    expect_error "plan comm: give one layout" plan comm --gpus 8 --batch-tokens 64K --tp 2 --pp 2 --dp 4 || ok=1
    expect_error "plan comm: --exact is for the layout search" "${c[@]}" --exact || ok=1
    expect_error "plan comm: --top is for the layout search" "${c[@]}" --top 3 || ok=1
    expect_error "plan comm: --algo is for ./train plan --exact (plan comm shows every algorithm)" "${c[@]}" --algo ring || ok=1
    return $ok
}

have_matplotlib() { $PY -c 'import matplotlib' 2>/dev/null || { echo "python3-matplotlib is not installed (scripts/deps.sh as root installs it)"; return 77; }; }

# scripts/plot.py draws a real training log (PP 2 x DP 2, so the bubble and communication panels
# appear, and the per-rank busy/idle/W-fill one) beside a single-rank log, and ./train plan --plot draws
# the planner's bars: both PNGs decode, the log's has its seven panels' size, neither is blank. Bad logs and unwritable outputs
# fail with one line and leave no file.
t_plot() {
    have_matplotlib || return $?
    local d=$WORK/plot
    mkdir -p "$d"
    local run=("${TINY[@]}" --train "$DATA/train.bin" --val "$DATA/val.bin" --micro-batch 2 --batch-tokens 256 --steps 8
        --lr 3e-3 --val-every 4)
    timeout 120 $TRAIN --nproc 4 --pp 2 --zero 1 "${run[@]}" --log "$d/pp.jsonl" >/dev/null || return 1
    $TRAIN "${run[@]}" --log "$d/one.jsonl" >/dev/null || return 1
    $PY scripts/plot.py "$d/one.jsonl" "$d/pp.jsonl" -o "$d/log.png" || return 1
    $TRAIN plan --model d12 --gpus 8 --batch-tokens 512K --plot "$d/plan.png" >/dev/null || return 1
    # the memory panel, from a record in the format plot.py documents
    { cat "$d/one.jsonl"; echo '{"memory_peak":{"weights":3e6,"gradients":3e6,"activations":5e7},"rank":0}'; } >"$d/mem.jsonl"
    $PY scripts/plot.py "$d/mem.jsonl" -o "$d/mem.png" || return 1
    $PY - "$d" <<'EOF' || return 1
import sys, json, matplotlib
matplotlib.use("Agg")
import matplotlib.image as mpimg
d = sys.argv[1]
steps = [json.loads(l) for l in open(d + "/pp.jsonl") if '"loss"' in l]
assert [r["tokens"] for r in steps] == [256 * (i + 1) for i in range(8)], "tokens is not the running total"
for name, size in (("log.png", (1760, 1430)), ("mem.png", (880, 1430)), ("plan.png", None)):
    img = mpimg.imread(d + "/" + name)
    print(name, img.shape, "pixel std", img[..., :3].std())
    if size:  # rows of 2 panels: loss, loss/tokens, tokens/s, then bubble, communication, pipeline ranks and memory, or memory
        assert img.shape[:2] == size, img.shape
    assert img[..., :3].std() > 0.05, name + " is blank"
EOF
    printf '{"step":1,"loss":5}\nnot json\n' >"$d/bad.jsonl"
    local err
    err=$($PY scripts/plot.py "$d/bad.jsonl" -o "$d/bad.png" 2>&1)
    [ $? -ne 0 ] && [ "$err" = "error: $d/bad.jsonl:2: not a JSON line" ] || { echo "bad log: $err"; return 1; }
    printf '\xc6\xd7\x34\x01\xff\xfe\x80 a model, not a log' >"$d/binary.jsonl" # (not UTF-8: one line of error, no traceback)
    err=$($PY scripts/plot.py "$d/binary.jsonl" -o "$d/bad.png" 2>&1)
    [ $? -ne 0 ] && [ "$err" = "error: $d/binary.jsonl:1: not a JSON line" ] || { echo "binary log: $err"; return 1; }
    printf '{"step":1,"loss":2,"tokens":64,"pp_busy_ms":5}\n{"step":2,"loss":1,"tokens":128,"pp_busy_ms":5}\n' >"$d/shape.jsonl"
    err=$($PY scripts/plot.py "$d/shape.jsonl" -o "$d/bad.png" 2>&1) # (a hand-edited record: pp_busy_ms not a list)
    [ $? -ne 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && grep -q "^error: cannot plot the input, a record of an unexpected shape? (" <<<"$err" ||
        { echo "a record of another shape: $err"; return 1; }
    err=$($PY scripts/plot.py "$d/one.jsonl" -o "$d/missing/x.png" 2>&1)
    [ $? -ne 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && grep -q "^error: cannot write $d/missing/x.png" <<<"$err" ||
        { echo "unwritable output: $err"; return 1; }
    err=$($TRAIN plan --model d12 --gpus 8 --batch-tokens 512K --plot "$d/missing/p.png" 2>&1 >/dev/null)
    [ $? -ne 0 ] && grep -q "^error: cannot write $d/missing/p.png" <<<"$err" || { echo "plan --plot: $err"; return 1; }
    [ ! -e "$d/bad.png" ] && [ ! -e "$d/bad.png.tmp" ] || return 1
    # the plan plot: --top N bars, each labelled with all four axes (CP too)
    err=$($TRAIN plan --model d12 --gpus 64 --batch-tokens 1M --top 5 --plot "$d/top.png" 2>&1 >/dev/null) || return 1
    grep -q "^plot: 5 layout(s): TP[0-9]* CP[0-9]* PP[0-9]* DP[0-9]*, " <<<"$err" || { echo "plan --top 5 --plot: $err"; return 1; }
    # an interpreter without Debian's matplotlib (a pyenv or venv python3 first on the PATH) runs the
    # script again under /usr/bin/python3; where it cannot, the error names the interpreter
    cp /usr/bin/python3 "$d/py3" || return 1
    "$d/py3" -S scripts/plot.py "$d/one.jsonl" -o "$d/other.png" 2>"$d/other.err" || { cat "$d/other.err"; return 1; }
    [ -s "$d/other.png" ] || { echo "no plot from another interpreter"; return 1; }
    err=$(LLM4D_PLOT_REEXEC=1 "$d/py3" -S scripts/plot.py "$d/one.jsonl" -o "$d/other2.png" 2>&1)
    [ $? -ne 0 ] && grep -q "^error: scripts/plot.py needs matplotlib, which $d/py3 cannot import" <<<"$err" ||
        { echo "no-matplotlib error: $err"; return 1; }
    [ -x scripts/plot.py ] || { echo "scripts/plot.py is not executable"; return 1; }
}

# scripts/plot.py --schedule draws a real --pp-schedule-dump (a PP 2 zb-h1 training step) and ./train
# schedule's zb-v table: the PNG decodes, is not blank, one panel per dump, and holds the F, B and W
# colours plot.py documents; the training log's per-rank busy/idle/W-fill panel draws too. A malformed
# dump (a row cut short, a wrong header) fails with one line naming the file and line, and writes no PNG.
t_plot_schedule() {
    have_matplotlib || return $?
    local d=$WORK/plotsched err
    mkdir -p "$d"
    timeout 120 $TRAIN --nproc 2 --pp 2 --pp-schedule zb-h1 "${TINY[@]}" --layers 4 --train "$DATA/train.bin" --micro-batch 1 \
        --batch-tokens 256 --steps 3 --log "$d/pp.jsonl" --pp-schedule-dump "$d/zbh1.tsv" >/dev/null || return 1
    $TRAIN schedule --pp 4 --micro-batches 8 --pp-schedule zb-v --pp-schedule-dump "$d/zbv.tsv" >/dev/null || return 1
    $PY scripts/plot.py --schedule "$d/zbh1.tsv" -o "$d/one.png" || return 1
    $PY scripts/plot.py --schedule "$d/zbh1.tsv" "$d/zbv.tsv" -o "$d/two.png" || return 1
    $PY scripts/plot.py "$d/pp.jsonl" -o "$d/log.png" || return 1
    $PY - "$d" <<'EOF' || return 1
import sys, matplotlib
matplotlib.use("Agg")
import matplotlib.image as mpimg
import numpy as np
d = sys.argv[1]
colours = {"F": "#3b6fb6", "B": "#e08a2e", "W": "#3f9b57"}  # scripts/plot.py's SCHEDULE_COLORS
shapes = {}
for name in ("one.png", "two.png", "log.png"):
    img = mpimg.imread(d + "/" + name)[..., :3]
    shapes[name] = img.shape
    assert img.std() > 0.05, name + " is blank"
    if name != "log.png":
        for k, c in colours.items():
            rgb = np.array([int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)])
            n = int((np.abs(img - rgb).max(axis=2) < 0.02).sum())
            assert n > 50, "%s: no %s bars (%d pixels of %s)" % (name, k, n, c)
    print(name, img.shape, "pixel std %.3f" % img.std())
assert shapes["two.png"][0] > shapes["one.png"][0], "the second dump's panel is missing"
EOF
    head -n -1 "$d/zbh1.tsv" >"$d/bad.tsv"
    tail -n 1 "$d/zbh1.tsv" | cut -f1-7 >>"$d/bad.tsv"
    local n
    n=$(wc -l <"$d/bad.tsv")
    err=$($PY scripts/plot.py --schedule "$d/bad.tsv" -o "$d/bad.png" 2>&1)
    [ $? -ne 0 ] && [ "$err" = "error: $d/bad.tsv:$n: expected 8 tab-separated fields, got 7" ] || { echo "cut row: $err"; return 1; }
    sed '2s/times ms/times/' "$d/zbh1.tsv" >"$d/bad2.tsv"
    err=$($PY scripts/plot.py --schedule "$d/bad2.tsv" -o "$d/bad.png" 2>&1)
    [ $? -ne 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && grep -q "^error: $d/bad2.tsv:2: " <<<"$err" || { echo "bad header: $err"; return 1; }
    [ ! -e "$d/bad.png" ] || { echo "a PNG from a malformed dump"; return 1; }
}

# scripts/plot.py --replay: on ./train schedule's unit-time dumps (every pass one unit, hand-offs
# free) the replayed and the measured bubble both equal each schedule's closed form with equal F, B
# and W: 1f1b (P-1)/(M+P-1), interleaved (V 2) (P-1)/(2M+P-1), zb-h1 (P-1)/(3M+P-1), zb-v
# (P-1)/(6M+P-1); on a real run's dump a replay with free hand-offs is never slower than what ran, so
# no rank's replayed bubble is above its measured one.
t_plot_replay() {
    local d=$WORK/replay sch v p m out
    mkdir -p "$d"
    for sch in 1f1b interleaved zb-h1 zb-v; do
        v=1
        case $sch in interleaved | zb-v) v=2 ;; esac
        for p in 2 4; do
            for m in 4 8 16; do
                $TRAIN schedule --pp $p --micro-batches $m --pp-schedule $sch --pp-virtual $v --pp-schedule-dump "$d/u.tsv" >/dev/null || return 1
                out=$($PY scripts/plot.py --replay "$d/u.tsv") || return 1
                awk -v s=$sch -v p=$p -v m=$m -v line="$out" 'BEGIN {
                    k = s == "1f1b" ? 1 : s == "interleaved" ? 2 : s == "zb-h1" ? 3 : 6
                    want = 100 * (p - 1) / (k * m + p - 1)
                    n = split(line, f, " ")
                    for (i = 1; i < n; i++) if (f[i] == "mean") { got[++j] = f[i + 1] + 0 }
                    if (j != 2) { print s " P " p " M " m ": no two means in: " line; exit 1 }
                    for (j = 1; j <= 2; j++) if (got[j] - want > 0.006 || want - got[j] > 0.006) {
                        printf "%s P %d M %d: %s %.3f%%, want %.3f%%\n", s, p, m, j == 1 ? "measured" : "replayed", got[j], want; exit 1 }
                }' || return 1
            done
        done
    done
    timeout 120 $TRAIN --nproc 2 --pp 2 --pp-schedule 1f1b "${TINY[@]}" --layers 4 --train "$DATA/train.bin" --micro-batch 1 \
        --batch-tokens 512 --steps 2 --pp-schedule-dump "$d/run.tsv" >/dev/null || return 1
    out=$($PY scripts/plot.py --replay "$d/run.tsv") || return 1
    echo "$out"
    awk -v line="$out" 'BEGIN {
        n = split(line, f, " ")
        for (i = 1; i <= n; i++) if (f[i] == "measured" || f[i] == "replayed") { w = f[i]; k = 0 } else if (f[i] == "mean") i++; else if (f[i] ~ /%$/) v[w, ++k] = f[i] + 0
        if (k != 2) { print "want two ranks in: " line; exit 1 }
        for (r = 1; r <= 2; r++) if (v["replayed", r] > v["measured", r] + 0.01) { print "rank " r - 1 ": replayed above measured"; exit 1 }
    }' || return 1
    sed '4s/\t[0-9.]*\t\([0-9.]*\)$/\t-\t-/' "$d/run.tsv" >"$d/bad.tsv"
    out=$($PY scripts/plot.py --replay "$d/bad.tsv" 2>&1)
    [ $? -ne 0 ] && [ "$out" = "error: $d/bad.tsv: untimed passes ('-'): --replay needs a dump with times" ] || { echo "an untimed F: $out"; return 1; }
}

# RDMA verbs where libibverbs is absent: ./train does not link it (it is opened at run time), the verbs
# code says why in one line, and the trainer runs as before. Hidden by a bind mount in a private
# mount namespace where the library is installed (needs root), used as is where it is not.
t_verbs_absent() {
    if ldd $TRAIN | grep -q libibverbs; then echo "./train links libibverbs"; return 1; fi
    [ -x build/verbs_pair ] || { echo "built without <infiniband/verbs.h> (scripts/deps.sh as root installs libibverbs-dev)"; return 77; }
    local lib hide=() ok=0
    lib=$(ldconfig -p | awk '$1 == "libibverbs.so.1" { print $NF; exit }')
    if [ -n "$lib" ]; then
        [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null || { echo "hiding the installed libibverbs needs root and unshare"; return 77; }
        hide=(unshare -m sh -c "mount --bind /dev/null $lib && exec \"\$0\" \"\$@\"")
    fi
    "${hide[@]}" build/verbs_pair >"$WORK/va.out" 2>"$WORK/va.err"
    local rc=$?
    cat "$WORK/va.err"
    [ $rc -eq 1 ] && [ "$(wc -l <"$WORK/va.err")" -eq 1 ] && grep -q '^error: RDMA verbs unavailable: cannot load libibverbs.so.1' "$WORK/va.err" ||
        { echo "want exit 1 and one line 'error: RDMA verbs unavailable: cannot load libibverbs.so.1 ...', got $rc"; ok=1; }
    local args=("${TINY[@]}" --train "$DATA/train.bin" --micro-batch 2 --steps 2)
    $TRAIN "${args[@]}" --save-model "$WORK/va1.bin" >/dev/null || return 1
    "${hide[@]}" $TRAIN "${args[@]}" --save-model "$WORK/va2.bin" >/dev/null || { echo "./train failed without libibverbs"; return 1; }
    cmp "$WORK/va1.bin" "$WORK/va2.bin" || ok=1
    # with the library but no RDMA device (this machine's kernel has none): one line that says so
    if [ -n "$lib" ] && [ -z "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
        build/verbs_pair >/dev/null 2>"$WORK/vn.err"
        rc=$?
        cat "$WORK/vn.err"
        [ $rc -eq 1 ] && [ "$(wc -l <"$WORK/vn.err")" -eq 1 ] && grep -q '^error: RDMA verbs: ' "$WORK/vn.err" || { echo "no device: want one error line"; ok=1; }
    fi
    return $ok
}

# RDMA verbs for real, on soft-RoCE inside a QEMU guest (test/verbs_vm.sh; skipped where the guest
# cannot run): two processes stream 1 B .. 64 MiB both ways, every byte checked, through staging
# rings of 8, 3 and 1 slots (and a short stream under ASan+UBSan); device, port and GID selection
# and their errors; a peer that dies.
t_verbs_vm() {
    [ -x build/verbs_pair ] || { echo "built without <infiniband/verbs.h> (scripts/deps.sh as root installs libibverbs-dev)"; return 77; }
    local out rc ok=0
    out=$(bash test/verbs_vm.sh --timeout 500 --bin build/verbs_pair --bin build/verbs_pair-asan -- sh -c '
        export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
        run() { echo "== $*"; build/verbs_pair "$@" 2>&1; echo "== rc $?"; }
        asan() { echo "== asan $*"; build/verbs_pair-asan "$@" 2>&1; echo "== rc $?"; }
        run --list
        run
        run --slots 3 --slot-bytes 1000 --max-bytes 200000
        run --slots 1 --slot-bytes 4096 --max-bytes 256K
        run --ib-dev rxe0:1 --ib-gid-index 1 --max-bytes 64K
        run --ib-dev mlx5_0
        run --ib-dev rxe0:2
        run --ib-gid-index 100000
        run --kill-peer --timeout 120
        asan --slots 3 --slot-bytes 5000 --max-bytes 1M
        asan --ib-dev rxe0:2')
    rc=$?
    echo "$out"
    [ $rc -eq 77 ] && return 77
    [ $rc -eq 0 ] || { echo "the guest failed (status $rc)"; return 1; }
    block() { awk -v h="== $1" '$0 == h { f = 1; next } f && /^== rc / { print; exit } f' <<<"$out"; }
    expect() { # ARGS STATUS [PATTERN [LINES]]: the run of verbs_pair ARGS exited STATUS, printed PATTERN (and LINES lines)
        local b
        b=$(block "$1")
        if ! grep -qx "== rc $2" <<<"$b"; then echo "verbs_pair $1: want exit $2"; ok=1; return; fi
        if [ -n "${3:-}" ] && ! grep -qE "$3" <<<"$b"; then echo "verbs_pair $1: want a line matching '$3'"; ok=1; fi
        if [ -n "${4:-}" ] && [ "$(grep -vc '^== rc' <<<"$b")" -ne "$4" ]; then echo "verbs_pair $1: want $4 line(s)"; ok=1; fi
    }
    # the guest's dummy0 has 192.0.2.1: its RoCE v2 GID is ::ffff:192.0.2.1, chosen over the link-local one
    expect "--list" 0 '^gid [0-9]+ ::ffff:192\.0\.2\.1 verbs:RoCE v2 sysfs:RoCE v2 chosen$'
    if block "--list" | grep 'link-local' | grep -q chosen; then echo "a link-local GID was chosen"; ok=1; fi
    expect "" 0 'MiB each way, 8 slots x 65536 bytes'
    expect "--slots 3 --slot-bytes 1000 --max-bytes 200000" 0 '3 slots x 1000 bytes'
    expect "--slots 1 --slot-bytes 4096 --max-bytes 256K" 0 '1 slots x 4096 bytes'
    expect "--ib-dev rxe0:1 --ib-gid-index 1 --max-bytes 64K" 0 'rxe0 port 1, RoCE v2 GID index 1 '
    expect "--ib-dev mlx5_0" 1 '^error: --ib-dev mlx5_0: no such RDMA device \(found: rxe0\)$' 1
    expect "--ib-dev rxe0:2" 1 '^error: --ib-dev rxe0:2: device rxe0 has 1 port' 1
    expect "--ib-gid-index 100000" 1 '^error: --ib-gid-index 100000: rxe0 port 1 has GID indices 0-' 1
    expect "--kill-peer --timeout 120" 1 '^error: rank 1 at llm4d-vm unreachable over verbs '
    expect "asan --slots 3 --slot-bytes 5000 --max-bytes 1M" 0 '3 slots x 5000 bytes' 2
    expect "asan --ib-dev rxe0:2" 1 '^error: --ib-dev rxe0:2: device rxe0 has 1 port' 1
    return $ok
}

# The collectives and DP training over the verbs transport in the same guest, ranks on two named
# nodes (test/verbs_transport.sh), and the fallback to TCP where no rank has a device.
t_verbs_transport() { bash test/verbs_transport.sh; }

# checkpoints, restarts, bad checkpoints, loss spikes, stragglers, safe files
source test/ckpt.sh
# activation recompute, memory per rank, ./train plan --exact
source test/recompute.sh
# a make without the build packages; the includes against DESIGN.md's layers
source test/build.sh
# the CUDA sources on the emulated GPU
source test/emu.sh

# ---------------------------------------------------------------------------------------------

[ $LIST -eq 1 ] || prepare || { echo "FAIL prepare"; echo "0 passed, 1 failed"; exit 1; }
run_test kernels t_unit                    "unit tests (ASan+UBSan): kernels, formats, init"
run_test kernels t_gemm_host               "tensor-core GEMM index arithmetic: tile order, split-K, swizzle, wgmma descriptors, TMA boxes (ASan+UBSan)"
run_test kernels t_attention_host          "flash-attention kernels emulated on a model of ldmatrix and mma against double-precision attention (ASan+UBSan)"
run_test cli     t_prepare_roundtrip       "prepare writes the bytes as shards and a byte tokenizer, into new parent directories too"
run_test data    t_token_gpt2_ids          "tokenizer gpt2: ids equal tiktoken and HF tokenizers on tinyshakespeare, license texts, stress text (invalid UTF-8, NUL); --tokenizer FILE the same"
run_test data    t_token_threads           "tokenizer gpt2: --threads 1 and 2 bitwise, many chunks and one long line, equal tiktoken"
run_test data    t_token_inputs            "tokenizer inputs: JSON Lines, stdin, directories, globs, --val-tokens, shard names, --skip-bad-lines"
run_test data    t_bpe_train               "bpe:N training: merges equal HF BpeTrainer and a reference trainer; decode(encode(x)) == x; HF reads its files"
run_test data    t_token_bad_input         "tokenizer bad input: one-line errors, non-zero exit, no partial output (ASan)"
run_test data    t_token_gpt2_train        "tokenizer gpt2: a V = 50257 model on GPT-2 tokens of tinyshakespeare learns and samples text"
run_test model   t_torch_c36               "PyTorch reference: C=36 (not a multiple of 8), 2 micro-batches"
run_test model   t_torch_short_t           "PyTorch reference: T=24 below maxT=64"
run_test model   t_torch_v200              "PyTorch reference: V=200 (padded to 256)"
run_test model   t_torch_heads             "PyTorch reference at 1e-5: T=27 below maxT=40, 8 heads of 4 channels"
run_test model   t_torch_one_head          "PyTorch reference at 1e-5: one head of 20 channels, T=45"
run_test model   t_torch_bf16              "PyTorch reference: bf16"
run_test model   t_torch_bf16_generic      "PyTorch reference: bf16 on the generic matmul path (LLM4D_CPU_ISA=generic)"
run_test model   t_llama_torch             "Llama against PyTorch: llama3-tiny (GQA, untied head): logits, loss, every gradient, AdamW steps"
run_test model   t_llama_torch_scaled      "Llama against PyTorch: llama3.2-1b shrunk (tied head, RoPE frequency scaling)"
run_test model   t_llama_torch_tied_mqa    "Llama against PyTorch: one kv head, tied head, T=37, V=200, F=100, theta 1e4, eps 1e-6"
run_test model   t_llama_torch_recompute   "Llama against PyTorch: --recompute selective and full"
run_test model   t_llama_rope_scaling      "--rope-scaling: Llama 3.1's frequency scaling from a flag, into --save-hf's config.json as HF's llama3, active; bad values refused"
run_test dp      t_llama_layouts           "Llama (GQA, untied and tied head): DP 2 x ZeRO 0-3 (bitwise), PP 2 1f1b/zb-h1+recompute/interleaved/zb-v (tied x DP 2 x ZeRO 1 too, bitwise 1f1b) equal one rank"
run_test tp      t_llama_tp                "Llama TP 2 + SP, TP 4 (kv heads shared by 2 ranks), TP 2 x PP 2 zb-h1, tied head TP 4, TP 2 x PP 2 x DP 2 (8 ranks), bf16 TP 2 x DP 2 x ZeRO 3: equal one rank"
run_test cp      t_llama_cp                "Llama CP 2, 4, CP 2 x TP 2, CP 2 x DP 2 ZeRO-3 (GQA K/V on the ring, RoPE at global positions): equal one rank; the ring's measured bytes fall with the kv heads"
run_test ckpt    t_llama_ckpt              "Llama checkpoints: TP 2 to PP 2 re-sharded resume equals one rank; another kv-head count refused"
run_test model   t_llama_torch_bf16        "Llama against PyTorch: bf16"
run_test kernels t_attention_torch         "attention against PyTorch: whole sequence and zigzag context-parallel blocks"
run_test model   t_grad_accum              "gradient accumulation equals the large batch"
run_test model   t_determinism             "bitwise determinism across reruns and thread counts (fp32 and bf16)"
run_test cli     t_cli_ux                  "every subcommand's --help; llm.c's short flags; one number parser (trainer and planner); defaults from the data"
run_test cli     t_sample_long_context     "sample on a Hugging Face Llama of 131072 positions: a 1024-token window unless --seq-len says otherwise"
run_test cli     t_sample_recorded_tokenizer "sample from a checkpoint away from its data decodes with the tokenizer beside the training data its manifest records"
run_test cli     t_eval_batches_cap        "eval --batches beyond the --val data's distinct windows is capped to them, with a note: the same loss"
run_test cli     t_sample_stop             "SIGTERM and SIGINT stop sample and eval between tokens and batches, on every rank alike: one line, exit 128 + the signal"
run_test cli     t_sample_eval             "sample and eval: the training run's validation loss on every layout, PyTorch's loss and greedy decoding, seeded samples"
run_test cli     t_profile                 "--profile splits each step into matmuls, attention and the rest"
run_test memory  t_activation_memory       "activation memory is linear in T (no T x T attention buffers)"
run_test model   t_model_roundtrip         "model files round trip (fp32 bitwise, bf16 exact)"
run_test model   t_bf16_master             "bf16: master weights move below bf16 resolution"
run_test cli     t_prefork_checks          "layout errors and bad combinations refused in one line before the launcher forks (--nproc 256 too)"
run_test cli     t_bad_input               "bad input: one-line errors, non-zero exit, no crash (ASan)"
run_test model   t_learns                  "the model learns and samples"
run_test comm    t_collectives             "collectives: every op, type, count, placement; 1-8 ranks; sub-communicators"
run_test comm    t_collectives_device      "device memory in the collectives (CPU stand-in): CUDA IPC protocol, marks, TCP staging; 2-3 ranks"
run_test comm    t_collectives_algos       "collectives under --algo ring and hier: bitwise against the order each promises; simulated nodes; connections counted"
run_test comm    t_comm_scale              "collectives at 32 and 64 ranks (ring, hierarchy on simulated nodes): bitwise, two connections per ring rank"
run_test comm    t_store_waits             "bootstrap: 64 ranks form with about 3 store requests a rank (waits answered when the key is set, no polling)"
run_test comm    t_two_nodes               "collectives across two simulated nodes (network namespaces)"
run_test comm    t_comm_failures           "collectives: dead, missing and impostor ranks, SIGTERM"
run_test slurm   t_slurm                   "Slurm: 2 nodes x 2 ranks under srun and sbatch equal one rank"
run_test slurm   t_usr1                    "SIGUSR1 (Slurm time-limit warning) stops every rank cleanly"
run_test dp      t_data_parallel           "data parallel DP 2,3,4 x ZeRO 0-3 x M 1,3 equals one rank; stages and bucket sizes 0, 0.02, 25 bitwise"
run_test dp      t_data_parallel_algos     "data parallel under --algo ring and hier (simulated nodes): ZeRO 0-3 x buckets bitwise per algorithm, one rank within 1e-5"
run_test dp      t_data_parallel_bf16_clip "data parallel bf16 and active clipping equal one rank"
run_test memory  t_zero_memory_accum       "ZeRO-2/3 gradients 4/N with one micro-batch, 4 + 4/N with more (the accumulation buffer named); DP x CP = 1 says ZeRO has nothing to shard"
run_test memory  t_zero_memory             "ZeRO memory per rank at DP 4 follows the formula"
run_test tp      t_tensor_parallel         "tensor parallel TP 2,3,4 with and without --sp, alone and with DP 2 x ZeRO 0,1,3, equals one rank"
run_test pp      t_pipeline                "pipeline PP 2,3,4 x M, plain and interleaved (V 2), and 3D layouts equal one rank; schedules"
run_test memory  t_tensor_parallel_memory  "tensor parallel memory falls to 1/TP (activations too with --sp); logits B x T x Vp/TP"
run_test cp      t_context_parallel        "context parallel CP 2, 4, with TP 2 (--sp), PP 2, DP 2 x ZeRO 1, 3, bf16 equal one rank; reruns bitwise; attention FLOPs balanced"
run_test memory  t_context_parallel_memory "context parallel activation memory per rank falls to 1/CP"
run_test cp      t_context_parallel_errors "context parallel: one-line errors (sequence split, layout, --sp)"
run_test plan    t_plan                    "plan: every layout's bytes, bubble, communication and compute against the formulas, GPT-2 and Llama; README's 70B and Beacon tables"
run_test plan    t_comm_model              "plan comm: each traffic class's time, connections, staging and incast per algorithm against closed forms; the seed's Beacon figures"
run_test plan    t_plan_trainer_agree      "plan takes and refuses the layouts the trainer takes and refuses (odd T, SP, zb-v depth, a step's bounds)"
run_test plan    t_plan_bad_input          "plan: bad input, one-line errors naming the flag (ASan)"
run_test memory  t_recompute               "recompute selective and full are bitwise --recompute none: 1 rank fp32/bf16, DP x ZeRO 1-3, TP+SP, PP plain/interleaved, 3D bf16, CP alone and with TP+SP x ZeRO-3, resume; no extra ZeRO-3 gathers"
run_test memory  t_memory_formulas         "memory: every rank's peak activations and recompute scratch equal the inventory; fall with recompute, TP, SP, PP, CP, B, T"
run_test plan    t_plan_exact              "plan --exact predicts every rank's measured peak per category (DP x ZeRO, TP+SP, PP, interleaved, zb-h1 and zb-v with their W stashes, CP, recompute, --algo ring and hier's comm staging; llama3-tiny's DP x ZeRO, PP, TP+SP, TP 4 on 2 kv heads, CP, recompute)"
run_test cli     t_plot_schedule           "scripts/plot.py --schedule: timelines from real --pp-schedule-dump tables (F, B, W coloured), the per-rank pipeline panel; a malformed dump, one line"
run_test cli     t_plot                    "plot.py: training logs and the planner's memory bars as PNG"
run_test cli     t_plot_replay             "plot.py --replay: unit-time schedules replay to each schedule's closed-form bubble; a real dump never replays slower than it ran"
run_test verbs   t_verbs_absent            "RDMA verbs absent: ./train does not link libibverbs, runs as before; verbs say why in one line"
run_test verbs   t_verbs_vm                "RDMA verbs on soft-RoCE in a QEMU guest: 1 B-64 MiB both ways checked, 8/3/1 slots, selection, dead peer"
run_test verbs   t_verbs_transport         "verbs transport on soft-RoCE across two named nodes: collectives (bitwise), DP 2 and 3 equal one rank, bench-comm, fallback to TCP"
run_test ckpt    t_ckpt_resume             "checkpoints: resume is bitwise (one rank, DP x ZeRO 0-3, TP, PP, interleaved, CP, 3D)"
run_test ckpt    t_ckpt_boundary           "checkpoints: a resumed run validates and samples its first step where the checkpoint's run did not (another --val-every), never twice"
run_test ckpt    t_ckpt_reshard            "checkpoints: re-sharded to another layout (CP 2 to 1 and 1 to 2 among them) equals one rank"
run_test ckpt    t_ckpt_reader             "checkpoints: the format read with numpy equals --save-model"
run_test ckpt    t_ckpt_restarts           "restarts: 10 injected rank deaths under --max-restarts end bitwise as the uninterrupted runs"
run_test ckpt    t_ckpt_bad                "checkpoints: flipped byte, truncated or missing shard, missing manifest, incompatible, --keep"
run_test ckpt    t_ckpt_full_disk          "checkpoints: a full disk leaves the previous checkpoint and the run going; a failed last checkpoint exits 1"
run_test ckpt    t_ckpt_sigint             "SIGINT (Ctrl-C) on a single rank: checkpoint, exit 130; resuming is bitwise"
run_test ckpt    t_ckpt_signal_twice       "one SIGTERM delivered twice at once (as timeout(1) does) is one clean stop: checkpoint, model, exit 0"
run_test ckpt    t_ckpt_signal_last_step   "a stop signal during the last step (SIGTERM on one rank, SIGINT under --nproc 2): the last validation, checkpoint and model as without it"
run_test ckpt    t_ckpt_sigterm            "SIGTERM: every rank checkpoints and exits 0; resuming is bitwise"
run_test ckpt    t_ckpt_lock               "checkpoints: a second run into a held --ckpt-dir is refused naming the holder; its checkpoints stay"
run_test ckpt    t_model_dir_agreed        "sample and eval --model DIR on two ranks read the checkpoint rank 0 found, while a newer one appears"
run_test ckpt    t_ckpt_schedule_note      "checkpoints: resuming with another --lr or --steps says so, with the next step's rate under either schedule"
run_test ckpt    t_ckpt_fingerprint        "checkpoints: resuming on other data of the same token count is refused, --allow-data-change accepts it"
run_test ckpt    t_ckpt_fields             "checkpoints: manifest fields out of range or type and overlapping runs are refused, naming the field"
run_test ckpt    t_ckpt_move_aside         "checkpoints: an unusable checkpoint found by --resume is moved aside to .bad; the run writes its own"
run_test ckpt    t_skip_spikes             "--skip-spikes: NaN and spiking losses are skipped on every rank"
run_test cli     t_stragglers              "stragglers are reported by rank and host"
run_test cli     t_stragglers_stop         "a SIGSTOP'd rank: every second of the run in some step's wall time, the stopped rank named for its step"
run_test build   t_make_missing_deps       "make without the build packages (jansson.h, zlib.h, the compiler) stops at one line naming them and scripts/deps.sh"
run_test layers  t_layers_fails            "scripts/check_layers.py fails on includes up the chain, circles, a file in no layer, an include of emu/; passes a clean tree"
run_test layers  t_layers                  "includes follow DESIGN.md's layers: no circle, no include up the chain (scripts/check_layers.py)"
run_test cli     t_safe_files              "safe files: outputs checked first, device nodes refused, symlinks, stale temporaries, write errors, bad input"
run_test emu     t_emu_sm90                "emulator sm_90a instructions: mbarrier, TMA and tensor maps, wgmma layouts, setmaxnreg, gemm.cu's pipeline and its broken variants (ASan+UBSan)"
run_test kernels t_llama_kernels           "Llama kernels against PyTorch (ASan+UBSan): RMSNorm, RoPE (offsets, 3.1 scaling), SwiGLU, GQA (KV heads < heads, = 1) whole and zigzag CP blocks; fp32 and bf16"
run_test ckpt    t_hf_checkpoints          "Hugging Face checkpoints: config.json range checks, safetensors F32/BF16/F16 one file and sharded, in and out against the safetensors package and numpy; bad input"
run_test ckpt    t_hf_transformers         "Hugging Face transformers' LlamaForCausalLM (GQA, RoPE scaling, untied): --init-from-hf logits, loss and gradients equal; 5 steps, --save-hf, transformers' loss equals ./train eval's; 2 ranks (ZeRO-1, PP 2, TP 2) write the tensors back bitwise"
run_test model   t_shards_u32              "token shards with 32-bit ids (llm.c's Llama 3 header) written with numpy, mixed with uint16 ones; bad headers"
run_test emu     t_emu_kernels             "emulated GPU: test_cuda --small, every op and path against the CPU backend (H100 and A100)"
run_test emu     t_emu_gemm_check          "emulated GPU: gemm_check --check --small (ragged shapes, 4 layouts, every epilogue, split-K) against fp64"
run_test emu     t_emu_checker             "emulated GPU: the checker reports broken kernels (missing __syncthreads, wait_group too low, shared memory above the attribute, wgmma swizzle, expect_tx), deadlock, divergence; the runtime"
run_test emu     t_emu_old_driver          "emulated GPU: a driver older than the build's CUDA is named with both versions; no driver says so"
run_test emu     t_emu_sync_names_kernel   "emulated GPU: LLM4D_CUDA_SYNC=1 names a failing kernel"
run_test emu     t_emu_train               "emulated GPU: ./train --device cuda fp32 and bf16 steps against the CPU; recompute bitwise"
run_test emu     t_emu_multirank           "emulated GPU: DP 2 x ZeRO 0-3 (bitwise), TP 2, PP 2 plain, interleaved and zb-v, CP 2, TP 2 x PP 2, TP 2 x PP 2 x DP 2 through CUDA IPC on one emulated GPU; DP 2 on two GPUs, a GPU each seen as device 0, TP 2 x DP 2 on four GPUs, DP 2 over TCP; equal one rank"
run_test emu     t_emu_llama               "emulated GPU: Llama (llama3-tiny, GQA 4/2) --device cuda fp32 (losses, parameters) and bf16 (hs 16 and 64) against the CPU; recompute full bitwise"
run_test emu     t_emu_llama_multirank     "emulated GPU: Llama TP 4 (kv heads shared by 2 ranks), PP 2, CP 2 through CUDA IPC on one emulated GPU: equal one rank"
run_test pp      t_pp_schedules            "pipeline schedules (1f1b, interleaved, zb-h1, zb-v, and zb-v built for other pass times) as action lists: checker for p <= 8, m <= 64; ./train schedule"
run_test pp      t_pp_handoffs             "pipeline hand-offs counted: one copy each (read in place), no progress-thread wake-up; test_comm's ping-pong and every schedule at PP 2"
run_test pp      t_pp_bubble               "the measured bubble: each stage's idle share of the pipeline's span, the last stage's drain included, against the run's --pp-schedule-dump (1f1b, zb-h1)"
run_test pp      t_pp_schedule_dump        "--pp-schedule-dump: a training run's action lists with measured times, as defined, ordered and causal; no bit changed"
run_test pp      t_pp_zero_bubble          "every schedule pipeline.c runs (zb-h1, zb-v, interleaved by name) ends bitwise at 1f1b's model: PP 2/4, TP, DP x ZeRO 1/3, CP, recompute, resume across schedules"
run_test model   t_split_backward          "backward split into input (B) and weight (W) halves equals the fused backward bitwise (recompute, PP stages, TP, SP, CP)"

if [ $LIST -eq 1 ] && [ $listed -gt 0 ]; then exit 0; fi
if [ -n "$FILTER" ] && [ $((passed + failed + skipped + listed)) -eq 0 ]; then
    echo "error: no test matches '$FILTER' (test/run.sh GROUP runs a group, any other PATTERN matches test names and descriptions; test/run.sh --list lists them)"
    echo "0 passed, 1 failed"
    exit 1
fi
if [ $skipped -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ $failed -eq 0 ]
