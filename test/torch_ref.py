#!/usr/bin/python3
"""PyTorch reference for one training run of ./train.

Runs ./train twice (once to write the initial model, once to train from it with --dump), then
rebuilds the same GPT-2 in PyTorch (float64) from the model file, recomputes the global batches
from the shard bytes following the batch-order contract, and checks our logits, loss, every
parameter's gradient and the loss of every AdamW step against it. Exit status 0 means every check
passed; each check prints one line.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

PARAMS = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
          "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
DECAY = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


def load_model(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        assert header[0] == 20240326 and header[1] == 3, header[:2]
        maxT, V, L, NH, C, Vp = (int(x) for x in header[2:8])
        data = np.frombuffer(f.read(), dtype=np.float32)
    shapes = {
        "wte": (Vp, C), "wpe": (maxT, C), "ln1w": (L, C), "ln1b": (L, C), "qkvw": (L, 3 * C, C),
        "qkvb": (L, 3 * C), "attprojw": (L, C, C), "attprojb": (L, C), "ln2w": (L, C), "ln2b": (L, C),
        "fcw": (L, 4 * C, C), "fcb": (L, 4 * C), "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
        "lnfw": (C,), "lnfb": (C,),
    }
    params, off = {}, 0
    for name in PARAMS:
        n = int(np.prod(shapes[name]))
        params[name] = torch.tensor(data[off:off + n].reshape(shapes[name]), dtype=torch.float64)
        off += n
    assert off == data.size, "model file size does not match its header"
    return dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp), params, shapes


def forward(cfg, p, inp):
    B, T = inp.shape
    C, NH, L = cfg["C"], cfg["NH"], cfg["L"]
    x = p["wte"][inp] + p["wpe"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], eps=1e-5)
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p["attprojw"][l].T + p["attprojb"][l]
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], eps=1e-5)
        h = F.gelu(h @ p["fcw"][l].T + p["fcb"][l], approximate="tanh")
        x = x + h @ p["fcprojw"][l].T + p["fcprojb"][l]
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], eps=1e-5)
    return x @ p["wte"].T  # [B, T, Vp]; the tied LM head


def loss_of(cfg, p, inp, tgt):
    logits = forward(cfg, p, inp)[..., :cfg["V"]]
    return F.cross_entropy(logits.reshape(-1, cfg["V"]), tgt.reshape(-1)), logits


def read_tokens(pattern_files):
    toks = []
    for path in pattern_files:
        with open(path, "rb") as f:
            header = np.frombuffer(f.read(1024), dtype=np.int32)
            assert header[0] == 20240520 and header[1] == 1
            toks.append(np.frombuffer(f.read(), dtype=np.uint16)[: header[2]])
    return np.concatenate(toks).astype(np.int64)


def global_batch(tokens, step, G, T):
    """The contract: sequence i of step s is window (s*G + i) mod W, W = (n - 1) // T."""
    W = (len(tokens) - 1) // T
    rows = []
    for i in range(G):
        w = (step * G + i) % W
        rows.append(tokens[w * T: w * T + T + 1])
    rows = torch.tensor(np.stack(rows))
    return rows[:, :-1], rows[:, 1:]


def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    ratio = (step - a.warmup) / (a.steps - a.warmup)
    min_lr = a.lr * a.lr_min_frac
    return min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (a.lr - min_lr)


def rel(ours, ref):
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    scale = np.max(np.abs(ref))
    return float(np.max(np.abs(ours - ref)) / scale) if scale > 0 else float(np.max(np.abs(ours)))


class Checks:
    """Each check prints one line, ok or FAIL with the error and its tolerance; done() exits 1 if any failed."""

    def __init__(self):
        self.failures = 0

    def __call__(self, name, err, tol):
        ok = err <= tol
        self.failures += not ok
        print(f"{'ok' if ok else 'FAIL'} {name}: {err:.3e} (tolerance {tol:.0e})")

    def done(self):
        print(f"{'PASS' if self.failures == 0 else 'FAIL'}: {self.failures} check(s) failed")
        sys.exit(1 if self.failures else 0)


def check_gradients(check, grads, shapes, p, tol):
    """grads (the dump, in file order) against p's .grad, tensor by tensor: a line per tensor over tol, then the
    worst; shapes is [(name, shape)] in the dump's order."""
    off, worst = 0, ("", 0.0)
    for name, shape in shapes:
        n = int(np.prod(shape))
        err = rel(grads[off:off + n], p[name].grad.numpy().reshape(-1))
        if err > worst[1] or not worst[0]:
            worst = (name, err)
        if err > tol:
            check(f"gradient of {name}", err, tol)
        off += n
    check(f"every parameter gradient (worst: {worst[0]})", worst[1], tol)


def adamw_losses(p, names, decay, a, tokens, G, T, loss_fn):
    """The loss of each of a.steps PyTorch AdamW steps as the trainer takes them (betas 0.9, 0.95, eps 1e-8,
    decoupled decay a.weight_decay on the tensors named in decay, lr_at's schedule, clipping at a.clip), step
    s on global batch s, from the parameters p as they are; loss_fn(inp, tgt) gives the loss."""
    for t in p.values():
        t.grad = None
    opt = torch.optim.AdamW([{"params": [p[n] for n in names if n in decay], "weight_decay": a.weight_decay},
                             {"params": [p[n] for n in names if n not in decay], "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    losses = []
    for s in range(a.steps):
        inp, tgt = global_batch(tokens, s, G, T)
        opt.zero_grad()
        loss = loss_fn(inp, tgt)
        loss.backward()
        losses.append(loss.item())
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(list(p.values()), a.clip)
        for group in opt.param_groups:
            group["lr"] = lr_at(a, s)
        opt.step()
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="./train")
    ap.add_argument("--train", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--shape", required=True, help="shape flags for ./train, e.g. '--layers 2 ...'")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr-min-frac", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--tol-logits", type=float, default=1e-4)
    ap.add_argument("--tol-grads", type=float, default=1e-4)
    ap.add_argument("--tol-loss", type=float, default=1e-5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.workdir, exist_ok=True)
    init = os.path.join(a.workdir, "init.bin")
    dump = os.path.join(a.workdir, "dump")
    log = os.path.join(a.workdir, "log.jsonl")
    T, B = a.seq_len, a.micro_batch
    G = B * a.accum
    subprocess.run([a.binary, *a.shape.split(), "--seed", "7", "--steps", "0", "--save-model", init],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([a.binary, "--init-from", init, "--train", a.train, "--seq-len", str(T),
                    "--micro-batch", str(B), "--batch-tokens", str(G * T), "--steps", str(a.steps),
                    "--lr", str(a.lr), "--warmup", str(a.warmup), "--schedule", "cosine",
                    "--lr-min-frac", str(a.lr_min_frac), "--weight-decay", str(a.weight_decay),
                    "--clip", str(a.clip), "--dtype", a.dtype, "--dump", dump, "--log", log],
                   check=True, stdout=subprocess.DEVNULL)

    cfg, p, shapes = load_model(init)
    V = cfg["V"]
    tokens = read_tokens([a.train])
    check = Checks()

    # the batch order: our dumped step-0 tokens against the contract computed here
    inp0, tgt0 = global_batch(tokens, 0, G, T)
    dumped = np.fromfile(os.path.join(dump, "tokens.bin"), dtype=np.int32).reshape(2, G, T)
    check("step-0 tokens follow the batch-order contract",
          float(not (np.array_equal(dumped[0], inp0.numpy()) and np.array_equal(dumped[1], tgt0.numpy()))), 0)

    for t in p.values():
        t.requires_grad_(True)
    loss, logits = loss_of(cfg, p, inp0, tgt0)
    loss.backward()
    ours_logits = np.fromfile(os.path.join(dump, "logits.bin"), dtype=np.float32).reshape(B, T, V)
    check("logits", rel(ours_logits, logits[:B].detach().numpy()), a.tol_logits)
    records = [json.loads(line) for line in open(log)]
    steps = [r for r in records if "loss" in r]
    assert len(steps) == a.steps, f"expected {a.steps} step records, got {len(steps)}"
    check("step-0 loss", abs(steps[0]["loss"] - loss.item()) / loss.item(), a.tol_loss if a.dtype == "fp32" else a.tol_logits)
    grads = np.fromfile(os.path.join(dump, "grads.bin"), dtype=np.float32)
    check_gradients(check, grads, [(n, shapes[n]) for n in PARAMS], p, a.tol_grads)
    norm_ref = math.sqrt(sum(float((t.grad ** 2).sum()) for t in p.values()))
    check("gradient norm", abs(steps[0]["grad_norm"] - norm_ref) / norm_ref, a.tol_logits)

    # a steps of AdamW with warm-up, cosine decay, clipping and decoupled weight decay
    ref = adamw_losses(p, PARAMS, DECAY, a, tokens, G, T, lambda inp, tgt: loss_of(cfg, p, inp, tgt)[0])
    worst_step = max((abs(steps[s]["loss"] - ref[s]) / ref[s] for s in range(a.steps)), default=0.0)
    check(f"loss of each of {a.steps} AdamW steps", worst_step, a.tol_loss)
    check.done()


if __name__ == "__main__":
    main()
