#!/usr/bin/env python3
"""Checks the per-rank peak memory that training runs logged ({"memory_peak":{...},"rank":R} records).

  memory_check.py formulas DIR [TRAIN]  activations and recompute scratch of every rank against llm4d's
                                        activation inventory, written out here from the shapes (the
                                        README's table), and how they fall with recompute, TP, SP, PP, CP,
                                        the micro-batch size and the sequence length (TRAIN, default
                                        ./train: the interleaved schedule's gradient buffers, which
                                        test_schedule checks, from ./train schedule)
  memory_check.py exact DIR TRAIN [SHAPE FLAGS...]
                                        every category of every rank against ./train plan --exact (the
                                        runs' model: the shape flags given, default test/recompute.sh's
                                        RC_SHAPE)

DIR holds the runs of test/recompute.sh: runs.txt lines "NAME MODE RANKS FLAGS...", NAME-MODE.jsonl.
Tolerance 5% (the figures are expected to agree exactly).
"""
import json
import math
import subprocess
import sys

TOL = 0.05
SHAPE = dict(L=4, C=32, H=4, V=256, maxT=64, T=32)  # test/recompute.sh's RC_SHAPE
SHAPE_FLAGS = ["--layers", "4", "--channels", "32", "--heads", "4", "--vocab", "256", "--max-seq-len", "64"]


def flag(flags, name, default=None, cast=int):
    return cast(flags[flags.index(name) + 1]) if name in flags else default


def load_runs(d):
    runs = []
    for line in open(d + "/runs.txt"):
        name, mode, ranks, *flags = line.split()
        peaks = {}
        for rec in map(json.loads, open("%s/%s-%s.jsonl" % (d, name, mode))):
            if "memory_peak" in rec:
                peaks[rec["rank"]] = rec["memory_peak"]
        n = int(ranks)
        T = flag(flags, "--seq-len", SHAPE["T"])
        tp, pp, cp = flag(flags, "--tp", 1), flag(flags, "--pp", 1), flag(flags, "--cp", 1)
        dp = n // (tp * pp * cp)
        B, batch = flag(flags, "--micro-batch"), flag(flags, "--batch-tokens")
        lay = dict(name=name, mode=mode, n=n, flags=flags, T=T, B=B, batch=batch, tp=tp, pp=pp, cp=cp, dp=dp,
                   sp="--sp" in flags, V=flag(flags, "--pp-virtual", 1) if pp > 1 else 1, M=batch // (dp * B * T),
                   e=2 if flag(flags, "--dtype", "fp32", str) == "bf16" else 4, zero=flag(flags, "--zero", 0),
                   bucket=flag(flags, "--bucket-mb", None, str), ckpt="--ckpt-every" in flags,
                   schedule=flag(flags, "--pp-schedule", "1f1b", str), algo=flag(flags, "--algo", "auto", str),
                   times=flag(flags, "--pp-times", None, str))
        if sorted(peaks) != list(range(n)):
            sys.exit("%s-%s: memory_peak records for ranks %s, expected 0..%d" % (name, mode, sorted(peaks), n - 1))
        runs.append((lay, peaks))
    return runs


def stage_of(lay, r):
    """Pipeline stage of rank r: rank = ((dp·PP + pp)·CP + cp)·TP + tp."""
    return r // (lay["tp"] * lay["cp"]) % lay["pp"]


def stage_blocks(L, P, V, s):
    """Blocks of stage s and of its longest chunk: P·V equal chunks (earlier ones one longer), stage s holds
    s, s+P, ..."""
    n = P * V
    count = [L // n + (i < L % n) for i in range(n)]
    return sum(count[c * P + s] for c in range(V)), max(count[c * P + s] for c in range(V))


TRAIN = "./train"


def gradient_buffers(lay, stage):
    """Interleaved: the buffers stage s sends its input gradients back from (each held until the stage
    knows it received), as ./train schedule prints them."""
    out = subprocess.run([TRAIN, "schedule", "--pp", str(lay["pp"]), "--micro-batches", str(lay["M"]), "--pp-schedule",
                          "interleaved", "--pp-virtual", str(lay["V"])], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("rank %d (" % stage):
            return int(line.split(" gradient buffer")[0].rsplit(" ", 1)[1]) if "gradient buffer" in line else 0
    sys.exit("./train schedule printed no line for rank %d" % stage)


def activation_sets(lay, stage):
    """Activation sets of stage s and the chunks each holds: 1F1B min(P - s, M); zb-h1 min(P, M) (a set is
    busy from F to W); interleaved a pool of one-chunk sets, min(b, V·M) with V = 2 where b is
    Megatron's warm-up bound (P - s - 1)·2 + (V - 1)·P + 1 (test_schedule checks it)."""
    P, M, V = lay["pp"], lay["M"], lay["V"]
    if V > 1:
        return min((P - stage - 1) * 2 + (V - 1) * P + 1, V * M), 1
    if lay["schedule"] == "zb-h1" and P > 1:
        return min(P, M), V
    return min(P - stage, M), V


def inventory(lay, stage):
    """llm4d's activations and recompute scratch of one rank, in bytes (README: "Activation recompute")."""
    L, C, H, Vp = SHAPE["L"], SHAPE["C"], SHAPE["H"], (SHAPE["V"] + 127) // 128 * 128
    B, T, tp, e, mode = lay["B"], lay["T"] // lay["cp"], lay["tp"], lay["e"], lay["mode"]  # T: this rank's positions
    BT = B * T
    R = BT // tp if lay["sp"] else BT  # rows of the residual stream on this rank
    Ct, Ht, Vt = C // tp, H // tp, -(-Vp // tp)
    Ls, Lc = stage_blocks(L, lay["pp"], lay["V"], stage)
    first, last = stage == 0, stage == lay["pp"] - 1
    slots, nch = activation_sets(lay, stage)
    if nch < lay["V"]:  # one-chunk sets: room for the longest chunk
        Ls = Lc
    stats = 2 * R * 4  # a LayerNorm's mean and 1/std per row, fp32
    slot = nch * R * C * e + Ls * R * C * e  # each chunk's input, each block's output
    if mode != "full":  # the LayerNorm statistics, QKV, attention output and lse, residual2, GELU's input
        slot += Ls * (2 * stats + BT * 3 * Ct * e + BT * Ct * e + B * Ht * T * 4 + R * C * e + BT * 4 * Ct * e)
    if mode == "none":  # the two LayerNorm outputs and GELU's output
        slot += Ls * (2 * R * C * e + BT * 4 * Ct * e)
    # final LayerNorm, logits, cross-entropy statistics, targets: in the set with one stage, else in a
    # ring of their own, which B frees (1F1B, zb-h1 and interleaved run the last chunk's B right after
    # its F on the last stage: one)
    head = R * C * e + stats + BT * Vt * e + 3 * BT * 4 + BT * 4 if last else 0
    if lay["pp"] == 1:
        slot += head
        head = 0
    if first:  # token ids
        slot += BT * 4
    slot += R * C * e  # the residual gradient handed back
    grads = gradient_buffers(lay, stage) * R * C * e if lay["V"] > 1 else 0  # and the buffers it is sent back from
    shared = head + grads + 2 * BT * C * e + BT * 4 * Ct * e + BT * 3 * Ct * e  # partial sums, gradients of C, 4C and QKV
    if lay["sp"]:
        shared += BT * C * e + R * C * e + 2 * C * 4
    if lay["cp"] > 1:  # the ring's fp32 accumulators: attention output (or dq), and this rank's dK/dV share
        shared += BT * Ct * 4 + BT * 2 * Ct * 4
    act = slots * slot + shared
    if lay["schedule"] == "zb-h1" and lay["pp"] > 1:
        act += stashes(lay, stage, Ls, first, last, BT, R, C, Ct, e)
    rc = 0
    if mode != "none":  # a LayerNorm output and GELU's output
        rc = R * C * e + BT * 4 * Ct * e
    if mode == "full":  # and everything else of one block
        rc += 2 * stats + BT * 3 * Ct * e + BT * Ct * e + B * Ht * T * 4 + 2 * R * C * e + BT * 4 * Ct * e
    return act, rc


def stashes(lay, stage, Ls, first, last, N, R, C, Ct, e):
    """zb-h1's weight-gradient stashes (model.c's WStash): stage s delays its W passes by s, so at most
    min(s + 1, M) Bs await their W. What a pending W reads stays in its activation set where the set
    holds it, and the output gradients B leaves for W go into regions of the set B has consumed
    (residual3, residual2, GELU's input, QKV, the chunk's input); each stash's arena holds the rest, in
    256-byte pieces, per block: GELU's output unless recompute none; the two LayerNorm outputs unless
    recompute none without SP; under full recompute also the pre-GELU gradient, attention's output and
    its gradient, and dqkv (their regions are scratch then); under SP the two residual-stream gradients
    (gathered) and the embedding's gradient (the head's weight gradient is added in B)."""
    mode, sp = lay["mode"], lay["sp"]
    piece = lambda b: -(-b // 256) * 256
    NC = N * C * e
    block = 0
    if sp:
        block += piece(NC)  # the MLP's output gradient
    if mode != "none":
        block += piece(N * 4 * Ct * e)  # GELU's output, rebuilt into scratch
    if mode != "none" or sp:
        block += 2 * piece(NC)  # the LayerNorm outputs, rebuilt or gathered
    if mode == "full":
        block += piece(N * 4 * Ct * e) + piece(N * Ct * e) + piece(N * 3 * Ct * e)  # pre-GELU grad, atty, dqkv
    if mode == "full" or sp:
        block += piece(NC)  # attention's output gradient
    one = Ls * block + (piece(NC) if sp and first else 0)
    return min(stage + 1, lay["M"]) * one


def seed_activations(lay):
    """The seed's 1F1B activations (plan.c's formulas, per GPU): for the ratios only."""
    C, L, e = SHAPE["C"], SHAPE["L"], lay["e"]
    Ls, m, k = L / lay["pp"], lay["B"] * lay["T"], min(lay["pp"], lay["M"])
    a = (11 if lay["mode"] == "selective" else 17) * e * C
    if lay["mode"] == "full":
        return (k * m * Ls * e * C + m * 17 * e * C) / (lay["tp"] * lay["cp"])
    return k * m * Ls * a / (lay["tp"] * lay["cp"])


def rel(a, b):
    return 0.0 if a == b else abs(a - b) / max(abs(a), abs(b))


def formulas(d):
    runs = load_runs(d)
    bad = 0
    by = {}
    for lay, peaks in runs:
        if lay["schedule"] == "zb-v":  # its sets follow its list-scheduled order: checked by `exact` alone
            print("%s --recompute %s: zb-v, against plan --exact only" % (lay["name"], lay["mode"]))
            continue
        for r, got in peaks.items():
            stage = stage_of(lay, r)
            act, rc = inventory(lay, stage)
            for cat, want in (("activations", act), ("recompute", rc)):
                err = rel(got[cat], want)
                if err > TOL:
                    print("FAIL %s --recompute %s rank %d %s: %d bytes, inventory %d (%.1f%%)" %
                          (lay["name"], lay["mode"], r, cat, got[cat], want, 100 * err))
                    bad += 1
        by[(lay["name"], lay["mode"])] = (lay, peaks)
    print("every rank's activations and recompute scratch agree with the inventory (%d runs)" % len(runs))
    # how rank 0's activations (and recompute scratch) fall: measured against the inventory, the seed's beside
    # how the activations (and recompute scratch) of a rank fall: measured against the inventory, the
    # seed's 1F1B figure beside (which leaves out the head, the scratch and the statistics)
    pairs = [("recompute none -> selective", ("one", "none", 0), ("one", "selective", 0)),
             ("recompute none -> full", ("one", "none", 0), ("one", "full", 0)),
             ("recompute none -> full, PP 2 stage 0", ("pp2", "none", 0), ("pp2", "full", 0)),
             ("micro-batch 4 -> 2", ("b4", "none", 0), ("one", "none", 0)),
             ("sequence 64 -> 32", ("t64", "none", 0), ("one", "none", 0)),
             ("TP 1 -> 2, sequence parallel", ("one", "none", 0), ("tp2sp", "none", 0)),
             ("TP 2 -> TP 2 with SP", ("tp2", "none", 0), ("tp2sp", "none", 0)),
             ("PP 1 -> 2, last stage", ("one", "none", 0), ("pp2", "none", 1)),
             ("CP 1 -> 2", ("one", "none", 0), ("cp2", "none", 0))]
    print("%-40s %9s %9s %9s" % ("activations + recompute scratch", "measured", "inventory", "seed"))
    for what, a, b in pairs:
        (la, pa), (lb, pb) = by[a[:2]], by[b[:2]]
        ga = pa[a[2]]["activations"] + pa[a[2]]["recompute"]
        gb = pb[b[2]]["activations"] + pb[b[2]]["recompute"]
        wa = sum(inventory(la, stage_of(la, a[2])))
        wb = sum(inventory(lb, stage_of(lb, b[2])))
        print("%-40s %9.3f %9.3f %9.3f" % (what, gb / ga, wb / wa, seed_activations(lb) / seed_activations(la)))
        if rel(gb / ga, wb / wa) > TOL or not gb < ga:
            print("FAIL %s: measured ratio %.4f, inventory %.4f (it must fall)" % (what, gb / ga, wb / wa))
            bad += 1
    sys.exit(1 if bad else 0)


def exact(d, train, shape):
    bad = 0
    for lay, peaks in load_runs(d):
        cmd = [train, "plan", *shape, "--seq-len", str(lay["T"]), "--gpus", str(lay["n"]), "--tp", str(lay["tp"]),
               "--pp", str(lay["pp"]), "--cp", str(lay["cp"]), "--dp", str(lay["dp"]), "--batch-tokens", str(lay["batch"]),
               "--micro-batches", str(lay["M"]), "--zero", str(lay["zero"]), "--recompute", lay["mode"],
               "--dtype", "bf16" if lay["e"] == 2 else "fp32", "--exact", "--device", "cpu", "--json"]
        if lay["sp"]:
            cmd.append("--sp")
        if lay["V"] > 1:
            cmd += ["--interleaved", "--pp-virtual", str(lay["V"])]
        if lay["bucket"]:
            cmd += ["--bucket-mb", lay["bucket"]]
        if lay["ckpt"]:
            cmd.append("--ckpt")
        if lay["schedule"] != "1f1b":
            cmd += ["--pp-schedule", lay["schedule"]]
        if lay["algo"] != "auto":
            cmd += ["--algo", lay["algo"]]
        if lay["times"]:  # zb-v's lists built for those pass times hold their own pool of sets
            cmd += ["--pp-times", lay["times"]]
        plan = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        (y,) = plan["layouts"]
        worst = 0.0
        for r, got in peaks.items():
            want = y["exact"]["stages"][stage_of(lay, r)]
            for cat, w in want.items():
                err = rel(got[cat], w)
                worst = max(worst, err)
                if err > TOL:
                    print("FAIL %s --recompute %s rank %d %s: measured %d bytes, plan --exact %d (%.1f%%)" %
                          (lay["name"], lay["mode"], r, cat, got[cat], w, 100 * err))
                    bad += 1
        print("%-6s %-9s %d rank(s): plan --exact within %.2f%% of every measured category (total %.0f bytes, rank 0)" %
              (lay["name"], lay["mode"], lay["n"], 100 * worst, sum(peaks[0].values())))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if sys.argv[1] == "formulas":
        TRAIN = sys.argv[3] if len(sys.argv) > 3 else TRAIN
        formulas(sys.argv[2])
    else:
        exact(sys.argv[2], sys.argv[3], sys.argv[4:] or SHAPE_FLAGS)
