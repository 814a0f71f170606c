#!/usr/bin/env bash
# The default run: a small GPT-2 (4 blocks, 128 channels, byte-level vocabulary) trained on the
# license texts that every Debian machine carries in /usr/share/common-licenses (base-files), so it
# needs no download. It prints the loss falling, validation loss and samples as text, and draws the
# loss curves into data/licenses/demo_loss.png (scripts/plot.py, when matplotlib is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=data/licenses
mkdir -p "$DATA"
if [ ! -f "$DATA/train.bin" ]; then
    # each license once: skip the symlinks (GPL -> GPL-3, ...)
    find /usr/share/common-licenses -maxdepth 1 -type f | sort | xargs cat >"$DATA/corpus.txt"
    ./train prepare "$DATA/corpus.txt" "$DATA"
fi
./train --train "$DATA/train.bin" --val "$DATA/val.bin" \
    --layers 4 --channels 128 --heads 4 --vocab 256 --seq-len 128 --micro-batch 8 \
    --steps 1200 --lr 2e-3 --warmup 50 --lr-min-frac 0.1 --weight-decay 0.1 \
    --val-every 200 --val-steps 8 --sample-every 400 --sample-tokens 120 --top-k 40 --temperature 0.8 \
    --log "$DATA/demo.jsonl" --save-model "$DATA/demo_model.bin" "$@"
PY=/usr/bin/python3 # Debian's, where scripts/deps.sh installs matplotlib
[ -x "$PY" ] || PY=python3
if "$PY" -c 'import matplotlib' 2>/dev/null; then
    "$PY" scripts/plot.py "$DATA/demo.jsonl" -o "$DATA/demo_loss.png"
    echo "demo: the loss curves are in $DATA/demo_loss.png, the step log in $DATA/demo.jsonl"
else
    echo "demo: no loss plot: matplotlib is missing (scripts/deps.sh installs python3-matplotlib as root)"
fi
