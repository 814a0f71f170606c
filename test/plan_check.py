#!/usr/bin/env python3
"""Checks `./train plan --json` against the seed's formulas, recomputed here from the inputs alone
(the shapes below are written out, not read back from the planner), for several models, clusters,
ZeRO stages, recompute modes and dtypes: every field of every layout, the set of layouts (exactly the
(TP, CP, PP, DP) the rules allow), the reasons a layout cannot run, and the order. The Llama family
the same way: its parameter count from the architecture (and within 0.5% of Meta's published totals),
its activations from the block's tensors listed one by one, its FLOPs per token against
6·(matmul weights) + 6·L·C·T, its CP ring on the kv heads only. Then checks the README's 70B table
and its Llama Beacon table against the same closed forms.

usage: plan_check.py TRAIN_BINARY README.md
"""
import json
import math
import re
import shlex
import subprocess
import sys

import numpy as np

TRAIN, README = sys.argv[1], sys.argv[2]


def gpt2_params(L, C, V, maxT):
    Vp = (V + 127) // 128 * 128
    per_layer = 12 * C * C + 13 * C  # ln1 2C, qkv 3C^2+3C, proj C^2+C, ln2 2C, fc 4C^2+4C, fcproj 4C^2+C
    return Vp * C + maxT * C + L * per_layer + 2 * C


def llama_model(L, C, H, KV, F, V, T, tie):
    """A Llama's shape and its parameter count from the architecture: per block q (H·hs rows), k and v
    (KV·hs rows each) and o projections, SwiGLU's gate, up (F x C) and down (C x F), two RMSNorm
    weights; the embedding, the final RMSNorm, and an untied head of its own."""
    hs, Vp = C // H, (V + 127) // 128 * 128
    attn = C * H * hs + 2 * C * KV * hs + H * hs * C
    mlp = 3 * C * F
    N = Vp * C + L * (attn + mlp + 2 * C) + C + (0 if tie else Vp * C)
    matmul = L * (attn + mlp) + Vp * C  # weights a token multiplies by: every block's, and the head (wte if tied)
    return dict(arch="llama", L=L, C=C, H=H, KV=KV, F=F, T=T, Vp=Vp, tie=tie, N=N, matmul=matmul)


# Meta's published totals (model cards): Llama 3.2 1B 1.24 B (tied), Llama 3 8B 8.03 B, Llama 3 70B
# 70.6 B, Llama 3.1 405B 405.9 B (the presets' shapes: HF config.json)
PUBLISHED = {"llama3.2-1b": (llama_model(16, 2048, 32, 8, 8192, 128256, 2048, True), 1.24e9),
             "llama3-8b": (llama_model(32, 4096, 32, 8, 14336, 128256, 8192, False), 8.03e9),
             "llama3-70b": (llama_model(80, 8192, 64, 8, 28672, 128256, 8192, False), 70.6e9),
             "llama3-405b": (llama_model(126, 16384, 128, 8, 53248, 128256, 4096, False), 405.9e9)}
L1B, L8B, L70B, L405B = (PUBLISHED[k][0] for k in ("llama3.2-1b", "llama3-8b", "llama3-70b", "llama3-405b"))

# Each case: the command line, and the same facts written out for the reference.
D12 = dict(L=12, C=768, H=12, T=1024, N=gpt2_params(12, 768, 50257, 1024))
D24 = dict(L=24, C=1024, H=16, T=1024, N=gpt2_params(24, 1024, 50257, 1024))
B70 = dict(L=80, C=8192, H=64, T=4096, N=gpt2_params(80, 8192, 50257, 4096))
B405 = dict(L=126, C=16384, H=128, T=4096, N=gpt2_params(126, 16384, 50257, 4096))
SHAPE70 = "--layers 80 --channels 8192 --heads 64 --vocab 50257 --seq-len 4096"
SHAPE405 = "--layers 126 --channels 16384 --heads 128 --seq-len 4096"
BASE = dict(gpn=8, max_tp=8, M=8, V=2, zero=0, recompute="none", flash=True, fp32=False, mem=80e9, intra=300e9,
            inter=50e9, flops=400e12)
CASES = [
    (SHAPE70 + " --gpus 512 --batch-tokens 4M --micro-batches 32 --zero 1",
     dict(BASE, model=B70, G=512, batch=4 * 2**20, M=32, zero=1)),
    (SHAPE70 + " --gpus 512 --batch-tokens 4M --micro-batches 32 --zero 3",
     dict(BASE, model=B70, G=512, batch=4 * 2**20, M=32, zero=3)),
    (SHAPE405 + " --gpus 16384 --batch-tokens 16M --micro-batches 8 --zero 1 --recompute full",
     dict(BASE, model=B405, G=16384, batch=16 * 2**20, M=8, zero=1, recompute="full")),
    ("--model d12 --gpus 24 --gpus-per-node 4 --batch-tokens 96K --micro-batches 4 --zero 2 --dtype fp32 "
     "--recompute selective --attention full --gpu-mem 16GiB --intra-bw 100 --inter-bw 12.5 --flops 2.5e13 --pp-virtual 3",
     dict(BASE, model=D12, G=24, gpn=4, max_tp=4, batch=96 * 1024, M=4, zero=2, fp32=True, recompute="selective",
          flash=False, mem=16 * 2**30, intra=100e9, inter=12.5e9, flops=2.5e13, V=3)),
    ("--model d24 --gpus 6 --gpus-per-node 6 --batch-tokens 48K --micro-batches 2 --recompute full --attention full",
     dict(BASE, model=D24, G=6, gpn=6, max_tp=6, batch=48 * 1024, M=2, recompute="full", flash=False)),
    # 6 GPUs on one 8-GPU node: every group inside it, TP 3 and 6 too
    ("--model d12 --gpus 6 --batch-tokens 24K --micro-batches 2 --zero 3",
     dict(BASE, model=D12, G=6, batch=24 * 1024, M=2, zero=3)),
    # 12 GPUs, 8 per node: TP 4 groups stay in a node, TP 3 and 6 groups would cross one
    ("--model d12 --gpus 12 --batch-tokens 48K --micro-batches 4 --zero 1",
     dict(BASE, model=D12, G=12, batch=48 * 1024, M=4, zero=1)),
    # fixed axes: one layout, and the TP 4 slice of another search
    (SHAPE70 + " --gpus 512 --batch-tokens 4M --micro-batches 32 --zero 1 --tp 8 --pp 8",
     dict(BASE, model=B70, G=512, batch=4 * 2**20, M=32, zero=1, only=(8, None, 8, None))),
    ("--model d12 --gpus 12 --batch-tokens 48K --micro-batches 4 --tp 4",
     dict(BASE, model=D12, G=12, batch=48 * 1024, M=4, only=(4, None, None, None))),
    ("--params 7B --layers 32 --channels 4096 --seq-len 2048 --gpus 64 --batch-tokens 2M --micro-batches 16 --max-tp 4 "
     "--gpu-mem 40GB --flops 300T",
     dict(BASE, model=dict(L=32, C=4096, H=64, T=2048, N=7e9), G=64, max_tp=4, batch=2 * 2**20, M=16, mem=40e9,
          flops=300e12)),
    # context parallelism: T = 1000 cuts into 2·CP chunks for CP 1, 2, 4 only; CP groups across 4-GPU nodes
    ("--model d12 --max-seq-len 1000 --gpus 16 --gpus-per-node 4 --batch-tokens 16000 --micro-batches 2 --zero 1 "
     "--recompute full --top 500",
     dict(BASE, model=dict(D12, T=1000, N=gpt2_params(12, 768, 50257, 1000)), G=16, gpn=4, max_tp=4, batch=16000, M=2,
          zero=1, recompute="full")),
    # long sequences, where CP pays: the CP 8 slice, ZeRO-3 over DP x CP
    (SHAPE70 + " --gpus 64 --batch-tokens 256K --micro-batches 4 --zero 3 --cp 8",
     dict(BASE, model=B70, G=64, batch=256 * 1024, M=4, zero=3, only=(None, 8, None, None))),
    # the Llama family: the Beacon as Llama 3.1 405B (the README's table), 70B with CP, 8B in fp32 with
    # the probabilities kept, the tied 1B
    ("--model llama3-405b --seq-len 4096 --gpus 16384 --batch-tokens 16M --micro-batches 8 --zero 1 --recompute full",
     dict(BASE, model=L405B, G=16384, batch=16 * 2**20, M=8, zero=1, recompute="full")),
    ("--model llama3-70b --gpus 512 --batch-tokens 4M --micro-batches 8 --zero 3 --recompute selective",
     dict(BASE, model=L70B, G=512, batch=4 * 2**20, M=8, zero=3, recompute="selective")),
    ("--model llama3-8b --gpus 64 --batch-tokens 1M --micro-batches 4 --dtype fp32 --attention full --zero 2",
     dict(BASE, model=L8B, G=64, batch=2**20, M=4, fp32=True, flash=False, zero=2)),
    ("--model llama3.2-1b --seq-len 2048 --gpus 16 --batch-tokens 256K --micro-batches 2 --cp 4",
     dict(BASE, model=L1B, G=16, batch=256 * 1024, M=2, only=(None, 4, None, None))),
    # a custom Llama: 12 heads in 3 kv groups on nodes of 6: TP 6 replicates each kv head on 2 ranks, TP 2
    # and 4 cannot split them, TP 5 not the heads; --arch llama with --heads and no --kv-heads: NKV = H,
    # --channels and no --ffn: 8C/3 rounded up to 256
    ("--arch llama --layers 6 --channels 768 --heads 12 --kv-heads 3 --ffn 2016 --vocab 1000 --max-seq-len 512 "
     "--tie-embeddings 1 --gpus 60 --gpus-per-node 6 --batch-tokens 60K --micro-batches 2 --recompute selective --top 1000",
     dict(BASE, model=llama_model(6, 768, 12, 3, 2016, 1000, 512, True), G=60, gpn=6, max_tp=6, batch=60 * 1024, M=2,
          recompute="selective")),
    # SwiGLU's 682 rows split over TP 2, not 4
    ("--arch llama --layers 2 --channels 256 --heads 4 --kv-heads 4 --ffn 682 --vocab 512 --seq-len 128 --rope-theta 10000 "
     "--norm-eps 1e-6 --gpus 4 --batch-tokens 1K --micro-batches 2",
     dict(BASE, model=llama_model(2, 256, 4, 4, 682, 512, 128, True), G=4, batch=1024, M=2)),
    ("--arch llama --layers 4 --channels 1024 --heads 16 --seq-len 1024 --gpus 8 --batch-tokens 64K --micro-batches 4 "
     "--zero 1 --recompute full --cp 2",
     dict(BASE, model=llama_model(4, 1024, 16, 16, math.ceil(8 * 1024 / 3 / 256) * 256, 128256, 1024, True), G=8,
          batch=64 * 1024, M=4, zero=1, recompute="full", only=(None, 2, None, None))),
]


def coords(G, tp, cp, pp):
    """rank = ((dp·PP + pp)·CP + cp)·TP + tp: the (tp, cp, pp, dp) coordinates of every rank"""
    r = np.arange(G)
    return r % tp, r // tp % cp, r // (tp * cp) % pp, r // (tp * cp * pp)


def in_one_node(key, G, gpn):
    """Every group of ranks with the same key (an integer per rank) lies in one node (node = rank // gpn)."""
    node = np.arange(G) // gpn
    lo, hi = np.full(G, G), np.full(G, -1)
    np.minimum.at(lo, key, node)
    np.maximum.at(hi, key, node)
    used = hi >= 0
    return bool(np.all(lo[used] == hi[used]))


def reference(case, tp, cp, pp, dp):
    m = case["model"]
    L, C, H, T, N = m["L"], m["C"], m["H"], m["T"], m["N"]
    llama = m.get("arch") == "llama"
    KV, hs = m.get("KV", H), C // H
    M, zero, rc = case["M"], case["zero"], case["recompute"]
    e = 4 if case["fp32"] else 2
    w, g, o = (4, 4, 8) if case["fp32"] else (2, 2, 12)
    P = N / (tp * pp)
    kv_heads_per_rank = KV / tp if KV >= tp else 1  # a kv head shared by TP/KV ranks is held whole by each
    if llama:  # every weight splits over TP x PP but the K and V projections, held per kv head
        kv_weights = L * 2 * KV * hs * C
        P = (N - kv_weights) / (tp * pp) + L * 2 * kv_heads_per_rank * hs * C / pp
    same = dp * cp  # the ranks holding the same weights
    r = {}
    r["params_per_gpu"] = P
    r["weights"] = w * P / (same if zero == 3 else 1)
    r["gradients"] = g * P / (same if zero >= 2 else 1)
    r["optimizer"] = o * P / (same if zero >= 1 else 1)
    Ls, R = L / pp, case["batch"] / dp
    mt = R / M
    k = min(pp, M)
    r["layers_per_stage"], r["tokens_per_replica"], r["micro_batch_tokens"] = Ls, R, mt
    r["sequences_per_micro_batch"] = mt / T
    per_layer = 34 * C * e / 2  # Korthikanti's 34·C bytes in bf16
    probs = 0 if case["flash"] else 5 * H * T * e / 2  # the 5·a·s term, per token
    if llama:  # the Llama block's tensors kept for the backward, elements per token; no dropout
        F = m["F"]
        kept = dict(attn_norm_in=C, attn_norm_out=C, q=H * hs, k=KV * hs, v=KV * hs, attn_out=H * hs, mlp_norm_in=C,
                    mlp_norm_out=C, gate=F, up=F, silu_product=F)
        per_layer = e * sum(kept.values())
        probs = 0 if case["flash"] else e * H * T  # the probabilities only
        selective = e * sum(v for k, v in kept.items() if k not in ("attn_norm_out", "mlp_norm_out", "silu_product"))
    g_act = tp * cp  # GPUs sharing a micro-batch's activations
    if rc == "none":
        a = per_layer + probs
        up, f1 = R * Ls * a / g_act, k * mt * Ls * a / g_act
    elif rc == "selective":  # LayerNorm outputs (2 x 2C) and GELU's input (8C) recomputed, probabilities too
        a = selective if llama else (34 - 4 - 8) * C * e / 2
        up, f1 = R * Ls * a / g_act, k * mt * Ls * a / g_act
    else:  # block inputs kept (2C in bf16), one block's activations rebuilt at a time
        a = per_layer + probs
        up = R * (Ls * C * e + a) / g_act
        f1 = (k * mt * Ls * C * e + mt * a) / g_act
    r["activations_upper"], r["activations_1f1b"] = up, f1
    state = r["weights"] + r["gradients"] + r["optimizer"]
    r["total"], r["total_upper"] = state + f1, state + up
    why = None
    if H % tp:
        why = "TP does not divide the heads"
    elif llama and KV % tp and tp % KV:
        why = "TP and the kv heads do not divide one another"
    elif llama and m["F"] % tp:
        why = "TP does not divide the SwiGLU size"
    elif pp > L:
        why = "more stages than layers"
    elif T % (2 * cp):
        why = "the sequence does not cut into 2·CP equal chunks"
    elif case["batch"] % (dp * M * T):
        why = "the batch does not split into whole sequences per micro-batch"
    r["why"], r["runs"] = why, why is None
    r["fits"] = r["total"] <= case["mem"]
    r["bubble"] = (pp - 1) / (M + pp - 1)
    V = case["V"]
    r["bubble_interleaved"] = (pp - 1) / (V * M + pp - 1) if pp > 1 and pp * V <= L and M % pp == 0 else None
    G, gpn = case["G"], case["gpn"]
    # the gradient group: every rank with the same (pp, tp); the CP group: the same (tp, pp, dp)
    t_, c_, p_, d_ = coords(G, tp, cp, pp)
    intra = in_one_node(p_ * tp + t_, G, gpn)
    r["dp_intra_node"] = intra
    bw = case["intra"] if intra else case["inter"]
    r["dp_allreduce_s"] = (3 if zero == 3 else 2) * (same - 1) / same * g * P / bw
    n_ar = 6 if rc == "full" else 4
    one_allreduce = 2 * (tp - 1) / tp * (mt / cp) * C * e / case["intra"]
    r["tp_comm_s"] = n_ar * Ls * M * one_allreduce
    cp_intra = in_one_node((d_ * pp + p_) * tp + t_, G, gpn)
    r["cp_intra_node"] = cp_intra
    block = (mt / cp) * (kv_heads_per_rank * hs if llama else C / tp)  # K (or V) elements of one GPU's tokens and heads
    ring = (3 if rc == "full" else 2) * (cp - 1) * 2 * block * e + cp * 2 * block * 4
    r["cp_comm_s"] = 0 if cp == 1 else Ls * M * ring / (case["intra"] if cp_intra else case["inter"])
    # FLOPs per token: the seed's 6·N for GPT-2; a Llama 6 per matmul weight and causal attention's
    # 6·L·C·T (forward 2·T·C per block: scores and weighted sum over T/2 keys on average)
    flops = 6 * m["matmul"] + 6 * L * C * T if llama else 6 * N
    r["compute_s"] = (8 if rc == "full" else 6) / 6 * flops * case["batch"] / case["G"] / case["flops"]
    # the step: TP blocks; the CP ring hides behind attention's share of the FLOPs (causal 2·T·C per
    # token and layer against the matmuls' 2·12·C², a Llama's its own); the DP reduction behind one
    # micro-batch's compute
    block_matmuls = 2 * (m["matmul"] - m["Vp"] * C) / L if llama else 24 * C * C
    attention = r["compute_s"] * (2 * T * C) / (2 * T * C + block_matmuls)
    r["cp_exposed_s"] = max(0.0, r["cp_comm_s"] - attention)
    r["dp_exposed_s"] = max(0.0, r["dp_allreduce_s"] - r["compute_s"] / M)
    r["step_s"] = (r["compute_s"] + r["tp_comm_s"] + r["cp_exposed_s"]) / (1 - r["bubble"]) + r["dp_exposed_s"]
    return r


def close(a, b):
    if a is None or b is None or isinstance(a, (bool, str)) or isinstance(b, (bool, str)):
        return a == b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def check_case(args, case):
    out = subprocess.run([TRAIN, "plan", "--json"] + args.split(), stdout=subprocess.PIPE, check=True).stdout
    plan = json.loads(out)
    m = case["model"]
    if not close(plan["model"]["params"], m["N"]):
        raise AssertionError("%s: parameters %s, expected %s" % (args, plan["model"]["params"], m["N"]))
    if m.get("arch") == "llama":
        want = dict(arch="llama", layers=m["L"], channels=m["C"], heads=m["H"], kv_heads=m["KV"], ffn=m["F"],
                    tied=m["tie"], padded_vocab=m["Vp"], seq_len=m["T"],
                    flops_per_token=6 * m["matmul"] + 6 * m["L"] * m["C"] * m["T"])
        for k, v in want.items():
            assert close(plan["model"][k], v), "%s: model %s = %r, expected %r" % (args, k, plan["model"][k], v)
    G = case["G"]
    divisors = [x for x in range(1, G + 1) if G % x == 0]
    expect = {(t, c, p, G // (t * c * p)) for t in divisors if t <= case["max_tp"] for c in divisors for p in divisors
              if G % (t * c * p) == 0 and in_one_node(np.arange(G) // t, G, case["gpn"])}
    for axis, value in enumerate(case.get("only", (None, None, None, None))):
        if value:
            expect = {y for y in expect if y[axis] == value}
    got = [(y["tp"], y["cp"], y["pp"], y["dp"]) for y in plan["layouts"]]
    assert len(got) == len(set(got)), "%s: a layout is listed twice" % args
    assert set(got) == expect, "%s: layouts %s, expected %s" % (args, sorted(set(got) ^ expect), "")
    keys = []
    for y in plan["layouts"]:
        ref = reference(case, y["tp"], y["cp"], y["pp"], y["dp"])
        flat = dict(y, **y["bytes"])
        for k, v in ref.items():
            if not close(flat[k], v):
                raise AssertionError("%s: TP %d CP %d PP %d DP %d: %s = %r, expected %r" % (args, y["tp"], y["cp"], y["pp"],
                                                                                           y["dp"], k, flat[k], v))
        group = 2 if ref["why"] else 0 if ref["fits"] else 1
        keys.append((group, ref["step_s"], y["tp"], y["cp"], y["pp"]))
    assert keys == sorted(keys), "%s: layouts not sorted (fitting first, then by the estimated step time)" % args
    assert plan["inputs"]["gpus"] == G and plan["inputs"]["zero"] == case["zero"]
    print("ok: %s: %d layouts, %d run and fit" % (args, len(got), sum(y["runs"] and y["fits"] for y in plan["layouts"])))
    return plan


def check_readme(case1, case3):
    """The README's 70B table (TP 8, PP 8, DP 8; ZeRO-1 and ZeRO-3 columns) against the closed forms."""
    text = open(README).read()
    start = text.index("| 70B-class")
    rows = {}
    for line in text[start:].splitlines():
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    r1, r3 = reference(case1, 8, 1, 8, 8), reference(case3, 8, 1, 8, 8)

    def num(s):
        return float(re.sub(r"[^0-9.]", "", s.split()[0]))

    want = {
        "weights": (r1["weights"] / 1e9, r3["weights"] / 1e9, 2),
        "gradients": (r1["gradients"] / 1e9, r3["gradients"] / 1e9, 2),
        "optimizer state": (r1["optimizer"] / 1e9, r3["optimizer"] / 1e9, 2),
        "activations, 1F1B": (r1["activations_1f1b"] / 1e9, r3["activations_1f1b"] / 1e9, 2),
        "total": (r1["total"] / 1e9, r3["total"] / 1e9, 2),
        "tokens per replica": (r1["tokens_per_replica"], r3["tokens_per_replica"], 0),
        "layers per stage": (r1["layers_per_stage"], r3["layers_per_stage"], 0),
        "bubble": (100 * r1["bubble"], 100 * r3["bubble"], 1),
        "interleaved bubble (V 2)": (100 * r1["bubble_interleaved"], 100 * r3["bubble_interleaved"], 1),
    }
    for label, (a, b, digits) in want.items():
        got = [c for k, c in rows.items() if k.startswith(label)]
        assert got, "README's 70B table has no row '%s'" % label
        for value, cell in zip((a, b), got[0]):
            if round(value, digits) != round(num(cell), digits):
                raise AssertionError("README 70B table, %s: '%s', the formula gives %.*f" % (label, cell, digits, value))
    print("ok: README's 70B table (TP 8, PP 8, DP 8, ZeRO-1 and ZeRO-3) matches the formulas")


def check_ranking():
    """d48 on 64 GPUs: a CP 64 layout whose ring takes far longer than the compute must not rank above
    the pipeline layouts (it did when the order was bubble first); and a batch below one sequence is
    refused in one line."""
    args = "--layers 48 --channels 1600 --heads 25 --vocab 50257 --seq-len 1024 --gpus 64 --batch-tokens 1M --micro-batches 8"
    plan = json.loads(subprocess.run([TRAIN, "plan", "--json"] + args.split(), stdout=subprocess.PIPE, check=True).stdout)
    runs = [y for y in plan["layouts"] if y["runs"] and y["fits"]]
    best = runs[0]
    assert best["cp_comm_s"] < best["compute_s"], "best layout %s is communication-bound" % best
    cp64 = [i for i, y in enumerate(runs) if y["cp"] == 64]
    pp2 = [i for i, y in enumerate(runs) if y["pp"] == 2 and y["cp"] == 1]
    assert not cp64 or not pp2 or min(pp2) < min(cp64), "a CP 64 layout ranks above every PP 2 layout"
    r = subprocess.run([TRAIN, "plan", "--model", "d12", "--gpus", "4", "--batch-tokens", "1000"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    assert r.returncode != 0 and r.stdout == "" and r.stderr.count("\n") == 1 and "--batch-tokens 1000" in r.stderr, r
    print("ok: ranked by the estimated step time; a batch below one sequence refused")


def check_readme_llama(gpt, llama):
    """The README's Beacon table: the seed's GPT-style 405B and Llama 3.1 405B (the same flags) against
    the closed forms: the best layout (TP 8, PP 4, DP 512), the Beacon (TP 8, PP 16, DP 128), its CP 2
    variant's ring."""
    text = open(README).read()
    start = text.index("| Beacon on 16,384 GPUs")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]

    def num(s):
        return float(re.sub(r"[^0-9.]", "", s.split()[0]))

    def refs(key, scale, layout):
        return [scale * reference(case, *layout)[key] for case in (gpt, llama)]

    lm = llama["model"]
    want = {
        "parameters": ([gpt["model"]["N"] / 1e9, lm["N"] / 1e9], 2),
        "FLOPs per token": ([6 * gpt["model"]["N"] / 1e9, (6 * lm["matmul"] + 6 * lm["L"] * lm["C"] * lm["T"]) / 1e9], 0),
        "best layout, TP 8 × PP 4 × DP 512: total per GPU": (refs("total", 1e-9, (8, 1, 4, 512)), 2),
        "best layout: step": (refs("step_s", 1e3, (8, 1, 4, 512)), 1),
        "the Beacon, TP 8 × PP 16 × DP 128: total per GPU": (refs("total", 1e-9, (8, 1, 16, 128)), 2),
        "the Beacon: step": (refs("step_s", 1e3, (8, 1, 16, 128)), 1),
        "TP 8 × CP 2 × PP 16 × DP 64: the CP ring": (refs("cp_comm_s", 1e3, (8, 2, 16, 64)), 1),
    }
    for label, (values, digits) in want.items():
        assert label in rows, "README's Beacon table has no row '%s'" % label
        for value, cell in zip(values, rows[label]):
            if round(value, digits) != round(num(cell), digits):
                raise AssertionError("README Beacon table, %s: '%s', the formula gives %.*f" % (label, cell, digits, value))
    print("ok: README's Beacon table (GPT-style and Llama 3.1 405B) matches the formulas")


def check_published():
    """The presets' parameter counts against Meta's published totals, within 0.5%; the closed form above
    is the exact reference (check_case), this one says the shapes are the right ones."""
    for name, (m, published) in PUBLISHED.items():
        plan = json.loads(subprocess.run([TRAIN, "plan", "--json", "--model", name, "--seq-len", str(m["T"]), "--gpus",
                                          "1", "--batch-tokens", str(m["T"])], stdout=subprocess.PIPE, check=True).stdout)
        got = plan["model"]["params"]
        assert close(got, m["N"]), "%s: %r parameters, the architecture gives %r" % (name, got, m["N"])
        assert abs(got / published - 1) < 0.005, "%s: %.4g parameters, published %.4g" % (name, got, published)
        print("ok: %s: %d parameters (published %.4g B)" % (name, got, published / 1e9))


def check_readme_commands():
    """Every README block that shows `$ ./train plan FLAGS` with its output shows what the command
    prints today: each of its lines (but `...` and the lines after a `$ ./train plan ...` variant)
    is a line of the command's output."""
    text = open(README).read()
    blocks = 0
    for m in re.finditer(r"```\n(\$ \./train plan .*?)```", text, re.S):
        lines = m.group(1).split("\n")
        cmd, i = [], 0
        while True:  # the command, with its continuation lines
            part = lines[i][2:] if i == 0 else lines[i].strip()
            cmd.append(part.rstrip("\\").strip())
            i += 1
            if not part.endswith("\\"):
                break
        if "..." in " ".join(cmd):
            continue
        body = []
        for line in lines[i:]:
            if line.startswith("$ "):
                break
            if line.strip() and line.strip() != "..." and not line.startswith("... "):
                body.append(line)
        args = shlex.split(" ".join(cmd))[1:]
        out = subprocess.run([TRAIN] + args, capture_output=True, text=True, check=True).stdout.split("\n")
        missing = [line for line in body if line not in out]
        assert not missing, "README's `./train %s` shows a line the command no longer prints:\n%s" % (" ".join(args), missing[0])
        blocks += 1
    assert blocks >= 4, "found %d README plan examples" % blocks
    print("ok: the README's %d `./train plan` examples show what the commands print" % blocks)


def main():
    for args, case in CASES:
        check_case(args, case)
    check_readme(CASES[0][1], CASES[1][1])
    by_args = dict(CASES)
    check_readme_llama(by_args[SHAPE405 + " --gpus 16384 --batch-tokens 16M --micro-batches 8 --zero 1 --recompute full"],
                       by_args["--model llama3-405b --seq-len 4096 --gpus 16384 --batch-tokens 16M --micro-batches 8 --zero 1 "
                               "--recompute full"])
    check_published()
    check_ranking()
    check_readme_commands()


main()
