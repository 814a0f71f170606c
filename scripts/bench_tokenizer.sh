#!/usr/bin/env bash
# bench_tokenizer.sh (make bench): GPT-2 encoding throughput of ./train prepare on tinyshakespeare
# concatenated to about 100 MB, 1 and 2 threads, against tiktoken and Hugging Face tokenizers on the same
# text in the same run (HF on the first HF_COPIES copies, default 9 = 10 MB: at well under 1 MB/s the
# whole text would take many minutes), and BPE training for N = 8192 against HF BpeTrainer. Medians of
# RUNS runs (default 3); the load average is printed before and after: the figures are only as good as
# the machine was quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SHARED=../shared/data
[ -d "$SHARED" ] || [ ! -d ../../shared/data ] || SHARED=../../shared/data
G=$SHARED/gpt2
if [ ! -f "$G/encoder.json" ] || [ ! -f "$SHARED/tinyshakespeare.txt" ]; then
    echo "tokenizer bench skipped: $SHARED (GPT-2's files, tinyshakespeare) is not there"
    exit 0
fi
W=$(mktemp -d /tmp/llm4d-bench-tok.XXXXXX)
trap 'rm -rf "$W"' EXIT
COPIES=${COPIES:-90}
HF_COPIES=${HF_COPIES:-9}
for _ in $(seq "$COPIES"); do cat "$SHARED/tinyshakespeare.txt"; done >"$W/text.txt"
MB=$(( $(stat -c %s "$W/text.txt") / 1000000 ))
echo "machine: $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg); text: tinyshakespeare x $COPIES = $MB MB, $RUNS runs each"
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# ./train prepare: the MB/s it reports for reading and encoding (the copy into shards after is left out)
ours() { # threads
    for _ in $(seq "$RUNS"); do
        rm -rf "$W/out"
        ./train prepare --tokenizer gpt2 --bpe-encoder "$G/encoder.json" --bpe-merges "$G/vocab.bpe" --threads "$1" \
            --shard-tokens 100000000 "$W/text.txt" "$W/out" | sed -n 's/^encoded .*(\([0-9.]*\) MB\/s.*/\1/p'
    done | median
}
# the references on the same text: tiktoken one copy after another on 1 thread, the copies as a batch
# on 2; HF the copies as a batch on RAYON_NUM_THREADS threads
refs() { # threads
    RAYON_NUM_THREADS=$1 /usr/bin/python3 - "$G" "$W/text.txt" "$1" "$RUNS" "$COPIES" "$HF_COPIES" <<'PY'
import sys, time, statistics
sys.path.insert(0, "test")
from tokenizer_ref import tiktoken, tokenizers, tiktoken_enc, hf_tok
g, path, th, runs, copies, hf_copies = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
full = open(path, encoding="utf-8").read()
out = []
for name in ("tiktoken", "hf"):
    if (name == "tiktoken" and tiktoken is None) or (name == "hf" and tokenizers is None):
        out.append("nan")
        continue
    n = copies if name == "tiktoken" else min(hf_copies, copies)
    text = full[:len(full) * n // copies]
    mb = len(text.encode()) / 1e6
    docs = [text[i * len(text) // n:(i + 1) * len(text) // n] for i in range(n)]  # the copies
    if name == "tiktoken":
        enc, _ = tiktoken_enc(g + "/encoder.json", g + "/vocab.bpe")
        # one copy at a time on 1 thread (one 100 MB string is slower still), a batch on more
        run = (lambda: [enc.encode_ordinary(d) for d in docs]) if th == 1 else (lambda: enc.encode_ordinary_batch(docs, num_threads=th))
    else:
        t = hf_tok(g + "/encoder.json", g + "/vocab.bpe")
        run = lambda: t.encode_batch(docs)  # RAYON_NUM_THREADS threads
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t0)
    out.append(f"{mb / statistics.median(ts):.2f}")
print(" ".join(out))
PY
}
declare -A O T H
for th in 1 2; do
    O[$th]=$(ours $th)
    read -r T[$th] H[$th] < <(refs $th)
done
ratio() { /usr/bin/python3 -c "import math; a, b = float('$1'), float('$2'); print('n/a' if math.isnan(b) else f'{a / b:.2f}x')"; }
echo "GPT-2 encoding, MB/s (median of $RUNS; HF on the first $HF_COPIES copies):"
printf '  %-10s %12s %12s %12s %14s %14s\n' threads "./train" tiktoken "HF tokenizers" "vs tiktoken" "vs HF"
for th in 1 2; do
    printf '  %-10s %12s %12s %12s %14s %14s\n' $th "${O[$th]}" "${T[$th]}" "${H[$th]}" "$(ratio "${O[$th]}" "${T[$th]}")" "$(ratio "${O[$th]}" "${H[$th]}")"
done
echo "  2 threads against tiktoken on 1: $(ratio "${O[2]}" "${T[1]}") (goal: >= 1.8x); 1 thread: $(ratio "${O[1]}" "${T[1]}") (goal: >= 1x)"

# BPE training, N = 8192: ./train's counting + merging (the encoding pass after it left out) against BpeTrainer
N=8192
ours_train() {
    for _ in $(seq "$RUNS"); do
        rm -rf "$W/bpe"
        ./train prepare --tokenizer bpe:$N --threads 2 "$W/text.txt" "$W/bpe" | sed -n 's/^learned [0-9]* merges in \([0-9.]*\) s.*/\1/p'
    done | median
}
hf_train() {
    RAYON_NUM_THREADS=2 /usr/bin/python3 - "$W/text.txt" "$N" "$RUNS" "$COPIES" <<'PY'
import sys, time, statistics
try:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
except ImportError:
    print("nan")
    sys.exit()
path, N, runs, copies = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
text = open(path, encoding="utf-8").read()
docs = [text[i * len(text) // copies:(i + 1) * len(text) // copies] for i in range(copies)]
ts = []
for _ in range(runs):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tr = trainers.BpeTrainer(vocab_size=N, special_tokens=["<|endoftext|>"], show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t0 = time.perf_counter()
    t.train_from_iterator(docs, tr)
    ts.append(time.perf_counter() - t0)
print(f"{statistics.median(ts):.2f}")
PY
}
mine=$(ours_train)
hf=$(hf_train)
echo "BPE training, N = $N on $MB MB, 2 threads (median of $RUNS): ./train $mine s, HF BpeTrainer $hf s ($(ratio "$hf" "$mine") faster)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
