#!/usr/bin/python3
"""./train eval and ./train sample against the training run and PyTorch (test/torch_ref.py's GPT-2).

Trains a tiny byte-level model that validates at its end, then checks: eval's loss equals the validation
loss the training run printed (same model, same batches) on 1 rank, TP 2, PP 2, CP 2 and from the
checkpoint directory (within 1e-5), and equals PyTorch's float64 loss of the saved model over the same
windows; `--steps 0 --init-from` prints the validation and the sample; a seeded sample is bitwise the
same twice and on TP 2, PP 2, CP 2 and TP 2 + SP, and decodes to the prompt and one piece per token; --top-k 1 equals
greedy decoding in PyTorch from the same weights. Exit status 0 means every check passed.
Usage: test/sample_eval.py ./train WORKDIR
"""
import os
import re
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ref import forward, global_batch, load_model, read_tokens  # noqa: E402

TRAIN, WORK = sys.argv[1], sys.argv[2]
os.makedirs(WORK, exist_ok=True)
CORPUS = "/usr/share/common-licenses/GPL-3"
SHAPE = "--layers 2 --channels 32 --heads 4 --vocab 256 --max-seq-len 64 --seq-len 32".split()
T, B, NVAL, PROMPT = 32, 4, 4, "The GNU"
failed = 0


def run(args, ok=True):
    p = subprocess.run([TRAIN] + args, capture_output=True, text=True, timeout=600)
    if ok and p.returncode != 0:
        sys.exit(f"FAIL: ./train {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout


def check(name, good, detail):
    global failed
    print(("ok   " if good else "FAIL ") + name + ": " + detail)
    failed += not good


def val_loss(out, pattern=r"step \d+ \| val loss ([0-9.]+)"):
    m = re.findall(pattern, out)
    if not m:
        sys.exit(f"FAIL: no loss in:\n{out}")
    return float(m[-1])


def sample_text(out):
    """The sample: standard output, all of it (./train sample prints the header and notes on stderr)."""
    return out.rstrip("\n")


def escape(tokens):
    """How samples print the bytes of a byte-level tokenizer's tokens: well-formed UTF-8 as it is, ill-formed
    bytes (Python's backslashreplace) and controls other than newline as \\xNN."""
    text = bytes(tokens).decode("utf-8", "backslashreplace")
    return "".join("\\x%02x" % ord(c) if (ord(c) < 32 and c != "\n") or ord(c) == 127 else c for c in text)


data = os.path.join(WORK, "d")
run(["prepare", CORPUS, data])
model, ck = os.path.join(data, "m.bin"), os.path.join(WORK, "ck")
val = os.path.join(data, "val.bin")
out = run(SHAPE + ["--train", os.path.join(data, "train.bin"), "--steps", "30", "--lr", "3e-3", "--val", val,
                   "--val-every", "30", "--val-steps", str(NVAL), "--save-model", model, "--ckpt-dir", ck])
trained = val_loss(out)

# eval on every layout, and from the checkpoint
for layout in [[], ["--nproc", "2", "--tp", "2"], ["--nproc", "2", "--pp", "2"], ["--nproc", "2", "--cp", "2"],
               ["--nproc", "2", "--tp", "2", "--sp"]]:
    got = val_loss(run(["eval", "--model", model, "--val", val, "--seq-len", str(T), "--batches", str(NVAL)] + layout),
                   r"loss ([0-9.]+) \| perplexity")
    check("eval " + (" ".join(layout) or "1 rank"), abs(got - trained) <= 1e-5, f"{got:.6f} vs training's {trained:.6f}")
for src in [ck, os.path.join(ck, "ckpt_00000030")]:
    got = val_loss(run(["eval", "--model", src, "--val", val, "--seq-len", str(T), "--batches", str(NVAL)]),
                   r"loss ([0-9.]+) \| perplexity")
    check("eval --model " + os.path.basename(src), abs(got - trained) <= 1e-5, f"{got:.6f} vs {trained:.6f}")

# PyTorch: the mean over the batches of the mean token loss; batch s holds windows s*B .. s*B+B-1
cfg, params, _ = load_model(model)
tokens = read_tokens([val])
with torch.no_grad():
    losses = []
    for s in range(NVAL):
        inp, tgt = global_batch(tokens, s, B, T)
        logits = forward(cfg, params, inp)[..., :cfg["V"]]
        losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["V"]), tgt.reshape(-1)).item())
ref = sum(losses) / NVAL
check("eval against PyTorch", abs(trained - ref) <= 1e-5, f"{trained:.6f} vs {ref:.6f}")

# --steps 0 --init-from: the validation and the sample at the end
out = run(["--init-from", model, "--steps", "0", "--seq-len", str(T), "--val", val, "--val-every", "1", "--val-steps",
           str(NVAL), "--sample-every", "1", "--sample-tokens", "8"])
check("--steps 0 validates", abs(val_loss(out) - trained) <= 1e-5, f"{val_loss(out):.6f}")
check("--steps 0 samples", "sample at step 0:" in out, "a sample printed")

# seeded samples: reproducible, the same on every layout, decoded
NTOK = 20
base = ["sample", "--model", model, "--seq-len", str(T), "--prompt", PROMPT, "--tokens", str(NTOK), "--seed", "7"]
texts = {name: sample_text(run(base + extra)) for name, extra in
         [("1 rank", []), ("again", []), ("TP 2", ["--nproc", "2", "--tp", "2"]), ("PP 2", ["--nproc", "2", "--pp", "2"]),
          # each token's window is the context rounded up to what the layout splits (4 positions, 2)
          ("CP 2", ["--nproc", "2", "--cp", "2"]), ("TP 2 + SP", ["--nproc", "2", "--tp", "2", "--sp"])]}
first = texts["1 rank"]
for name, text in texts.items():
    check("sample " + name, text == first, repr(text))
piece = r"(\\x[0-9a-f]{2}|[^\x00-\x09\x0b-\x1f\x7f])"
check("sample decodes", re.fullmatch(re.escape(PROMPT) + piece + "{1,%d}" % NTOK, first) is not None, repr(first))
# CP 2 x TP 2 + SP on a window of 12 (6 positions a rank, not a multiple of 2 x 2): the windows round
# up to what the layout splits and stop at T, to the window's last token
short = ["sample", "--model", model, "--seq-len", "12", "--prompt", PROMPT, "--tokens", "5", "--seed", "7"]
one = sample_text(run(short))
check("sample to the end of a 12-token window", len(one) >= len(PROMPT) + 5, repr(one))
check("sample CP 2 x TP 2 + SP, window 12", sample_text(run(short + ["--nproc", "4", "--cp", "2", "--tp", "2", "--sp"])) == one, repr(one))
# more tokens than the window holds: the window's worth, the same text, and a note saying so
p = subprocess.run([TRAIN] + short[:-3] + ["50", "--seed", "7"], capture_output=True, text=True, timeout=600)
check("--tokens past the window: its 5 tokens", p.returncode == 0 and sample_text(p.stdout) == one, repr(sample_text(p.stdout)))
check("--tokens past the window: a note", "--tokens 50 and the 7-token prompt exceed the 12-token window (--seq-len): sampling 5"
      in p.stderr, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "no stderr")
other = sample_text(run(base[:-1] + ["8"]))
check("another seed, another sample", other != first, repr(other))

# --top-k 1 against greedy decoding in PyTorch: the trained model, and the initial one (whose choices vary more)
init = os.path.join(data, "init.bin")
run(SHAPE + ["--steps", "0", "--save-model", init])
for path in [model, init]:
    c, p, _ = load_model(path)
    ctx = [ord(ch) for ch in PROMPT]
    with torch.no_grad():
        for _ in range(NTOK):
            logits = forward(c, p, torch.tensor([ctx]))[0, -1, :c["V"]]
            ctx.append(int(logits.argmax()))
    greedy = sample_text(run(["sample", "--model", path] + base[3:] + ["--top-k", "1"]))
    check("--top-k 1 is greedy, " + os.path.basename(path), greedy == escape(ctx), f"{greedy!r} vs PyTorch {escape(ctx)!r}")
sys.exit(1 if failed else 0)
