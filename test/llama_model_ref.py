#!/usr/bin/python3
"""PyTorch reference for one training run of ./train --arch llama.

Runs ./train once with --dump (its initial weights, step-0 logits and gradients, in model.h's file
order), rebuilds the Llama written here from the published architecture in float64 (RMSNorm, rotary
embeddings in the rotate-half convention with theta^(-2i/hs), grouped-query causal attention, the SwiGLU
MLP, no biases, the head tied to wte or its own tensor), and checks our logits, loss, every parameter's
gradient and the loss of every AdamW step. Batches, the schedule and the comparison helpers are
torch_ref.py's (one contract). Exit status 0 means every check passed.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ref import Checks, adamw_losses, check_gradients, global_batch, read_tokens, rel  # noqa: E402

DECAY = {"wte", "qkvw", "attprojw", "fcw", "fcprojw", "lmhead"}


def shapes_of(c):
    L, C, NH, NKV, F_, Vp = c["L"], c["C"], c["NH"], c["NKV"], c["F"], c["Vp"]
    hs = C // NH
    s = [("wte", (Vp, C)), ("ln1w", (L, C)), ("qkvw", (L, (NH + 2 * NKV) * hs, C)), ("attprojw", (L, C, NH * hs)),
         ("ln2w", (L, C)), ("fcw", (L, 2 * F_, C)), ("fcprojw", (L, C, F_)), ("lnfw", (C,))]
    if not c["tie"]:
        s.append(("lmhead", (Vp, C)))
    return s


def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def inv_freq(c, hs):
    """theta^(-2i/hs), with Llama 3.1's frequency scaling when factor > 0 (Meta's apply_scaling)."""
    inv = c["theta"] ** (-torch.arange(0, hs // 2, dtype=torch.float64) * 2 / hs)
    if c["factor"] <= 0:
        return inv
    lo_wl, hi_wl = c["orig"] / c["low"], c["orig"] / c["high"]
    out = []
    for f in inv.tolist():
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(f)
        elif wl > lo_wl:
            out.append(f / c["factor"])
        else:
            smooth = (c["orig"] / wl - c["low"]) / (c["high"] - c["low"])
            out.append((1 - smooth) * f / c["factor"] + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def rope(x, c):  # x [B, T, H, hs]: channel pairs (i, i + hs/2) rotated by t·inv_freq[i]
    T, hs = x.shape[1], x.shape[3]
    inv = inv_freq(c, hs)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[None, :, None, :], torch.cat([ang.sin()] * 2, -1)[None, :, None, :]
    rot = torch.cat([-x[..., hs // 2:], x[..., :hs // 2]], -1)
    return x * cos + rot * sin


def forward(c, p, inp):
    B, T = inp.shape
    C, NH, NKV, F_, eps = c["C"], c["NH"], c["NKV"], c["F"], c["eps"]
    hs = C // NH
    x = p["wte"][inp]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(c["L"]):
        h = rmsnorm(x, p["ln1w"][l], eps)
        qkv = h @ p["qkvw"][l].T
        q = qkv[..., :NH * hs].view(B, T, NH, hs)
        k = qkv[..., NH * hs:(NH + NKV) * hs].view(B, T, NKV, hs)
        v = qkv[..., (NH + NKV) * hs:].view(B, T, NKV, hs)
        q, k = rope(q, c), rope(k, c)
        k, v = (t.repeat_interleave(NH // NKV, dim=2) for t in (k, v))  # query head h reads kv head h // (NH/NKV)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * hs)
        x = x + y @ p["attprojw"][l].T
        h = rmsnorm(x, p["ln2w"][l], eps)
        gu = h @ p["fcw"][l].T
        x = x + (F.silu(gu[..., :F_]) * gu[..., F_:]) @ p["fcprojw"][l].T
    x = rmsnorm(x, p["lnfw"], eps)
    return x @ p["wte" if c["tie"] else "lmhead"].T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="./train")
    ap.add_argument("--train", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--shape", default="--model llama3-tiny", help="model flags for ./train")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--extra", default="", help="more ./train flags (e.g. --recompute selective)")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr-min-frac", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--tol", type=float, default=1e-5, help="logits, gradients and losses")
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.workdir, exist_ok=True)
    dump, log = os.path.join(a.workdir, "dump"), os.path.join(a.workdir, "log.jsonl")
    T, B = a.seq_len, a.micro_batch
    G = B * a.accum
    subprocess.run([a.binary, *a.shape.split(), *a.extra.split(), "--seed", "7", "--train", a.train, "--seq-len", str(T),
                    "--micro-batch", str(B), "--batch-tokens", str(G * T), "--steps", str(a.steps),
                    "--lr", str(a.lr), "--warmup", str(a.warmup), "--schedule", "cosine",
                    "--lr-min-frac", str(a.lr_min_frac), "--weight-decay", str(a.weight_decay),
                    "--clip", str(a.clip), "--dtype", a.dtype, "--dump", dump, "--log", log,
                    "--ckpt-dir", os.path.join(a.workdir, "ckpt"), "--ckpt-every", str(a.steps)],
                   check=True, stdout=subprocess.DEVNULL)
    # the shape from the checkpoint's manifest (which must hold the whole Llama config)
    with open(os.path.join(a.workdir, "ckpt", f"ckpt_{a.steps:08d}", "manifest.json")) as f:
        m = json.load(f)["model"]
    assert m["arch"] == "llama", m
    c = dict(L=m["layers"], C=m["channels"], NH=m["heads"], NKV=m["kv_heads"], F=m["ffn"], V=m["vocab"],
             Vp=m["padded_vocab"], tie=int(m["tie_embeddings"]), eps=m["norm_eps"], theta=m["rope_theta"],
             factor=m["rope_factor"], low=m["rope_low_freq_factor"], high=m["rope_high_freq_factor"],
             orig=m["rope_original_max_pos"])
    check = Checks()

    data = np.fromfile(os.path.join(dump, "params.bin"), dtype=np.float32)
    p, off, shapes = {}, 0, shapes_of(c)
    for name, shape in shapes:
        n = int(np.prod(shape))
        p[name] = torch.tensor(data[off:off + n].reshape(shape), dtype=torch.float64, requires_grad=True)
        off += n
    check("the dumped weights are the layout's size", float(off != data.size), 0)
    # the initialisation: norms 1, matrices N(0, 0.02), the residual projections 0.02/sqrt(2L), padding rows 0
    check("RMSNorm weights initialised to 1", float(max(abs(p[k].detach() - 1).max() for k in ("ln1w", "ln2w", "lnfw"))), 0)
    std = float(p["qkvw"].detach().std())
    check("qkvw std 0.02", abs(std - 0.02) / 0.02, 0.05)
    std = float(p["fcprojw"].detach().std())
    check("fcprojw std 0.02/sqrt(2L)", abs(std - 0.02 / math.sqrt(2 * c["L"])) / 0.02 * math.sqrt(2 * c["L"]), 0.08)

    tokens = read_tokens([a.train])
    V = c["V"]

    def loss_of(inp, tgt):
        logits = forward(c, p, inp)[..., :V]
        return F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1)), logits

    inp0, tgt0 = global_batch(tokens, 0, G, T)
    loss, logits = loss_of(inp0, tgt0)
    loss.backward()
    ours = np.fromfile(os.path.join(dump, "logits.bin"), dtype=np.float32).reshape(B, T, V)
    check("logits", rel(ours, logits[:B].detach().numpy()), a.tol)
    steps = [r for r in (json.loads(x) for x in open(log)) if "loss" in r]
    assert len(steps) == a.steps, f"expected {a.steps} step records, got {len(steps)}"
    check("step-0 loss", abs(steps[0]["loss"] - loss.item()) / loss.item(), a.tol)
    grads = np.fromfile(os.path.join(dump, "grads.bin"), dtype=np.float32)
    check_gradients(check, grads, shapes, p, a.tol)

    ref = adamw_losses(p, [n for n, _ in shapes], DECAY, a, tokens, G, T, lambda inp, tgt: loss_of(inp, tgt)[0])
    worst_step = max((abs(steps[s]["loss"] - ref[s]) / ref[s] for s in range(a.steps)), default=0.0)
    check(f"loss of each of {a.steps} AdamW steps", worst_step, a.tol)
    check.done()


if __name__ == "__main__":
    main()
