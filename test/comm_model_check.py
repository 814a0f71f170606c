#!/usr/bin/env python3
"""Checks `./train plan comm --json` (one layout's communication per step, per traffic class and
collective algorithm, in the alpha-beta model) against closed forms written out here, for several
layouts: every number of every class and algorithm. The groups are found here from the rank formula
rank = ((dp·PP + pp)·CP + cp)·TP + tp over every rank, not from the planner's strides. The staging
figures use the transports' constants, written below with the file and line they come from, and this
test first checks that those lines still say so. Then the seed's figures for its Beacon layout (a
405B-class model, TP 8 x PP 16 x DP 128 on 16,384 GPUs) within stated tolerances, the numbers that
show why fan-in across 128 nodes is wrong, and the README's table of them.

usage: comm_model_check.py TRAIN_BINARY README.md
"""
import json
import math
import re
import subprocess
import sys

import numpy as np

TRAIN, README = sys.argv[1], sys.argv[2]

# The transports' constants (their documented values), and where each is defined.
SLOTS = 16                 # net_verbs.h:42  VERBS_DEFAULT_SLOTS: slots per direction and connection
SLOT_MAX = 256 << 10       # net_verbs.h:42  VERBS_DEFAULT_SLOT_BYTES: the largest slot
BUDGET = 128 << 20         # net_verbs.h:48  VERBS_STAGING_BUDGET: per communicator and rank
SLOT_MIN = 16 << 10        # net_verbs.h:48  VERBS_MIN_SLOT_BYTES: the smallest slot
PAGE = 4096                # net_verbs.h:51  slots are whole pages
RING_BYTES = 1 << 20       # net_shm.c:41    RING_BYTES: one ring per local member in each inbox
RING_HEADER = 128          # net_shm.c:69-77 Ring: head, 56 pad, tail, rdv_done, can_cma, 44 pad
INBOX_HEADER = 64 + 64 + 2 * (64 + 4096)  # net_shm.c:79-87 Inbox: magic, nlocal, pad, 48 pad (64);
                                          # net.h Doorbell (64); net.h NetSlot slot[2] (64 + NET_SLOT_BYTES)
SOURCES = [
    ("net_verbs.h", r"enum \{ VERBS_DEFAULT_SLOTS = 16, VERBS_DEFAULT_SLOT_BYTES = 256 << 10 \};"),
    ("net_verbs.h", r"enum \{ VERBS_STAGING_BUDGET = 128 << 20, VERBS_MIN_SLOT_BYTES = 16 << 10 \};"),
    ("net_verbs.h", r"per = per / 4096 \* 4096;"),
    ("net_verbs.c", r"verbs_staging_slot_bytes\(s->connections\)"),  # the transport uses that rule
    ("collectives.c", r"algo_connections\(&c->a\)"),  # over the algorithm's connections
    ("net_shm.c", r"#define RING_BYTES \(1u << 20\)"),
    ("net_shm.c", r"ep->bytes = shm_inbox_bytes\(nl\);"),
    ("net.h", r"#define NET_SLOT_BYTES 4096"),
]


def check_sources():
    for path, pattern in SOURCES:
        if not re.search(pattern, open(path).read()):
            raise AssertionError("%s no longer has /%s/: update the constants in test/comm_model_check.py" % (path, pattern))
    print("ok: the transports' staging constants are as written in this test")


def slot_bytes(connections):
    per = BUDGET // (2 * SLOTS * max(connections, 1)) // PAGE * PAGE
    return min(SLOT_MAX, max(SLOT_MIN, per))


def inbox_bytes(members):
    return INBOX_HEADER + members * (RING_HEADER + RING_BYTES + 4)  # + the members' ranks, an int32 each (net_shm.c)


def gpt2_params(L, C, V, maxT):
    Vp = (V + 127) // 128 * 128
    return Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C


def group_of_rank0(G, tp, cp, pp, gpn, same):
    """The ranks whose coordinates named in `same` equal rank 0's (all 0): (size, on the fullest node, nodes)."""
    r = np.arange(G)
    co = dict(tp=r % tp, cp=r // tp % cp, pp=r // (tp * cp) % pp, dp=r // (tp * cp * pp))
    mask = np.ones(G, bool)
    for axis in same:
        mask &= co[axis] == 0
    nodes = r[mask] // gpn
    _, counts = np.unique(nodes, return_counts=True)
    return int(mask.sum()), int(counts.max()), len(counts)


def allreduce(algo, n, l, k, B, x):
    """One all-reduce of B bytes per rank: (intra bytes, inter bytes, latency, bandwidth, conns intra, inter, incast)."""
    ai, ae, bi, be = x["ai"], x["ae"], x["bi"], x["be"]
    if n == 1:
        return (0, 0), None, 0, 0, 0, 0, 0
    if algo == "ring":
        b = 2 * (n - 1) / n * B
        conns = min(2, n - 1)
        inter = 0 if k == 1 else conns if l == 1 else 1
        return (0, b) if k > 1 else (b, 0), None, 2 * (n - k) * ai + 2 * (k - 1) * ae, b / (be if k > 1 else bi), \
            conns - inter, inter, int(k > 1)
    if algo == "fanin":
        bi_, be_ = 2 * (l - 1) / n * B, 2 * (n - l) / n * B
        return (bi_, be_), None, 2 * (ae if k > 1 else ai), max(bi_ / bi, be_ / be), l - 1, n - l, n - l
    bi_, be_ = 2 * (l - 1) / l * B, 2 * (k - 1) / k * B / l  # hier
    return (bi_, be_), None, (2 * ai if l > 1 else 0) + 2 * (k - 1) * ae, bi_ / bi + be_ / be, l - 1, min(2, k - 1), \
        int(k > 1)


def p2p(algo, n, l, k, msgs, b, x):
    if n == 1:
        return (0, 0), None, 0, 0, 0, 0, 0
    inter = k > 1
    conns = n - 1 if algo == "fanin" else min(2, n - 1)
    ci = 0 if not inter else n - l if algo == "fanin" else conns if l == 1 else 1
    return (0, b) if inter else (b, 0), None, x["ae"] if inter else x["ai"], b / (x["be"] if inter else x["bi"]), \
        conns - ci, ci, int(inter)


def reference(case):
    """Every class and algorithm for one case, from the closed forms of plan.c's plan comm section."""
    G, tp, cp, pp, dp, gpn = case["G"], case["tp"], case["cp"], case["pp"], case["dp"], case["gpn"]
    L, C, N, M, zero, rc = case["L"], case["C"], case["N"], case["M"], case["zero"], case["recompute"]
    e = 4 if case["fp32"] else 2
    x = dict(ai=case["ai"], ae=case["ae"], bi=case["bi"], be=case["be"])
    P = N / (tp * pp)
    Ls, m = L / pp, case["batch"] / dp / M
    mc = m / cp
    shapes = {
        "tp": group_of_rank0(G, tp, cp, pp, gpn, ("cp", "pp", "dp")),
        "pp": group_of_rank0(G, tp, cp, pp, gpn, ("tp", "cp", "dp")),
        "dp": group_of_rank0(G, tp, cp, pp, gpn, ("tp", "pp")),  # the DP x CP ranks holding the same weights
        "cp": group_of_rank0(G, tp, cp, pp, gpn, ("tp", "pp", "dp")),
    }
    n_ar, passes = (6, 3) if rc == "full" else (4, 2)
    out = {}
    for algo in ("ring", "fanin", "hier"):
        res = {}
        for cls, (n, l, k) in shapes.items():
            if cls == "tp":
                ops, B = (n_ar * Ls * M, mc * C * e) if tp > 1 else (0, 0)
                r = allreduce(algo, n, l, k, mc * C * e, x)
            elif cls == "dp":
                ops, B = (1.5 if zero == 3 else 1, e * P) if n > 1 else (0, 0)
                r = allreduce(algo, n, l, k, e * P, x)
            elif cls == "pp":
                ops, B = (2 * M, mc * C * e / tp) if pp > 1 else (0, 0)
                r = p2p(algo, n, l, k, 2 * M, mc * C * e / tp, x)
            else:
                kv, dkv, msgs = 2 * mc * (C / tp) * e, 2 * mc * (C / tp) * 4, passes * (cp - 1) + cp
                mean = (passes * (cp - 1) * kv + cp * dkv) / msgs
                ops, B = (Ls * M * msgs, mean) if cp > 1 else (0, 0)
                r = p2p(algo, n, l, k, ops, mean, x)
            (ib, eb), _, lat, bw, c_in, c_out, incast = r
            sb = slot_bytes(c_in + c_out) if c_out else 0
            res[cls] = dict(group=n, ranks_per_node=l, nodes=k, intra_node=k == 1, ops_per_step=ops, bytes_per_op=B,
                            intra_bytes=ib * ops, inter_bytes=eb * ops, latency_s=lat * ops, bandwidth_s=bw * ops,
                            time_s=(lat + bw) * ops, connections_intra=c_in, connections_inter=c_out, verbs_slot_bytes=sb,
                            registered_bytes=c_out * 2 * SLOTS * sb, shm_bytes=inbox_bytes(c_in + 1) if c_in else 0,
                            incast_senders=incast, inflight_bytes_per_nic=incast * SLOTS * sb)
        res["time_s"] = sum(res[c]["time_s"] for c in shapes)
        res["registered_bytes"] = sum(res[c]["registered_bytes"] for c in shapes)
        res["shm_bytes"] = sum(res[c]["shm_bytes"] for c in shapes)
        res["connections"] = sum(res[c]["connections_intra"] + res[c]["connections_inter"] for c in shapes)
        out[algo] = res
    D = dp * cp
    c_flops = 8 if rc == "full" else 6
    seed = dict(gradient_bytes=e * P, dp_allreduce_intra_bw_s=2 * (D - 1) / D * e * P / case["bi"],
                dp_allreduce_inter_bw_s=2 * (D - 1) / D * e * P / case["be"], compute_s=c_flops * N * case["batch"] / G / case["flops"])
    return out, seed


def close(a, b):
    if isinstance(a, (bool, str)) or isinstance(b, (bool, str)):
        return a == b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def run(args):
    out = subprocess.run([TRAIN, "plan", "comm", "--json"] + args.split(), stdout=subprocess.PIPE, check=True).stdout
    return json.loads(out)


def check_case(args, case):
    got = run(args)
    ref, seed = reference(case)
    lay = got["layout"]
    assert (lay["tp"], lay["cp"], lay["pp"], lay["dp"]) == (case["tp"], case["cp"], case["pp"], case["dp"]), lay
    for k, v in seed.items():
        assert close(got["reference"][k], v), "%s: reference %s = %r, expected %r" % (args, k, got["reference"][k], v)
    for algo, classes in ref.items():
        for cls, want in classes.items():
            have = got["algorithms"][algo][cls]
            if not isinstance(want, dict):
                assert close(have, want), "%s: %s %s = %r, expected %r" % (args, algo, cls, have, want)
                continue
            assert set(have) == set(want), "%s: %s %s fields %s" % (args, algo, cls, set(have) ^ set(want))
            for k, v in want.items():
                assert close(have[k], v), "%s: %s %s %s = %r, expected %r" % (args, algo, cls, k, have[k], v)
    print("ok: %s: every class and algorithm" % args)
    return got


US = 1e-6
B405 = dict(L=126, C=16384, N=405e9, T=4096)
BEACON_ARGS = ("--params 405B --layers 126 --channels 16384 --heads 128 --seq-len 4096 --gpus 16384 --tp 8 --pp 16 "
               "--dp 128 --batch-tokens 16e6 --intra-bw 450")
BEACON = dict(B405, G=16384, gpn=8, tp=8, cp=1, pp=16, dp=128, batch=16e6, M=8, zero=0, recompute="none", fp32=False,
              ai=3 * US, ae=5 * US, bi=450e9, be=50e9, flops=400e12)
CASES = [
    (BEACON_ARGS, BEACON),
    # data parallel only: 8 ranks of the DP group on each node, where the hierarchy pays
    ("--params 7B --layers 32 --channels 4096 --seq-len 4096 --gpus 1024 --tp 1 --pp 1 --dp 1024 --batch-tokens 4M "
     "--micro-batches 1 --intra-bw 450",
     dict(L=32, C=4096, N=7e9, G=1024, gpn=8, tp=1, cp=1, pp=1, dp=1024, batch=4 * 2**20, M=1, zero=0, recompute="none",
          fp32=False, ai=3 * US, ae=5 * US, bi=450e9, be=50e9, flops=400e12)),
    # every axis, ZeRO-3, full recompute, 4-GPU nodes: the DP x CP group and the PP group cross nodes
    ("--model d12 --gpus 16 --gpus-per-node 4 --tp 2 --cp 2 --pp 2 --dp 2 --batch-tokens 64K --micro-batches 4 --zero 3 "
     "--recompute full",
     dict(L=12, C=768, N=gpt2_params(12, 768, 50257, 1024), G=16, gpn=4, tp=2, cp=2, pp=2, dp=2, batch=64 * 1024, M=4,
          zero=3, recompute="full", fp32=False, ai=3 * US, ae=5 * US, bi=300e9, be=50e9, flops=400e12)),
    # CP groups across nodes, fp32, other links and latencies
    ("--model d12 --gpus 32 --gpus-per-node 4 --tp 4 --cp 4 --pp 1 --dp 2 --batch-tokens 64K --micro-batches 2 --dtype fp32 "
     "--intra-bw 100 --inter-bw 12.5 --intra-lat 0.5 --inter-lat 12 --flops 2e13",
     dict(L=12, C=768, N=gpt2_params(12, 768, 50257, 1024), G=32, gpn=4, tp=4, cp=4, pp=1, dp=2, batch=64 * 1024, M=2,
          zero=0, recompute="none", fp32=True, ai=0.5 * US, ae=12 * US, bi=100e9, be=12.5e9, flops=2e13)),
    # one node: every group inside it, hier is the fan-in
    ("--model d12 --gpus 8 --tp 2 --pp 2 --dp 2 --batch-tokens 32K --micro-batches 2",
     dict(L=12, C=768, N=gpt2_params(12, 768, 50257, 1024), G=8, gpn=8, tp=2, cp=1, pp=2, dp=2, batch=32 * 1024, M=2,
          zero=0, recompute="none", fp32=False, ai=3 * US, ae=5 * US, bi=300e9, be=50e9, flops=400e12)),
]


def within(what, value, target, tol):
    assert abs(value - target) <= tol * target, "%s: %.4g, the seed says %.4g (+-%d%%)" % (what, value, target, 100 * tol)
    print("ok: %s %.4g, the seed's %.4g +-%d%%" % (what, value, target, 100 * tol))


def check_beacon(got):
    """The seed's figures for its Beacon layout, and why fan-in across 128 nodes is wrong, in numbers."""
    r = got["reference"]
    within("gradients per GPU (GB)", r["gradient_bytes"] / 1e9, 6.3, 0.02)
    within("their all-reduce over DP 128 at 450 GB/s (s)", r["dp_allreduce_intra_bw_s"], 0.03, 0.20)
    within("their all-reduce over DP 128 at 50 GB/s (s)", r["dp_allreduce_inter_bw_s"], 0.25, 0.05)
    within("compute, 6 N tokens / GPUs / 400 TFLOP/s (s)", r["compute_s"], 5.9, 0.02)
    a = got["algorithms"]
    ring, fan, hier = a["ring"]["dp"], a["fanin"]["dp"], a["hier"]["dp"]
    assert ring["inter_bytes"] == fan["inter_bytes"] == hier["inter_bytes"], "the DP bytes differ by algorithm"
    assert (fan["connections_inter"], ring["connections_inter"], hier["connections_intra"] + hier["connections_inter"]) == (127, 2, 2)
    assert (fan["incast_senders"], ring["incast_senders"]) == (127, 1)
    # the budget over the connections held: fan-in's 127 get 32 KiB slots, the ring's 2 the largest, 256 KiB
    assert fan["registered_bytes"] == 127 * 2 * 16 * 32768 and ring["registered_bytes"] == 2 * 2 * 16 * 262144
    assert fan["inflight_bytes_per_nic"] == 127 * 16 * 32768
    assert abs(ring["latency_s"] - 254 * 5e-6) < 1e-12 and abs(fan["latency_s"] - 2 * 5e-6) < 1e-12
    print("ok: DP across 128 nodes: fan-in 127 connections, 127 MiB registered, 127 senders per NIC; ring 2, 16 MiB, 1")


def check_readme(got):
    """The README's Beacon table: each row's cells against the closed forms' numbers."""
    text = open(README).read()
    start = text.index("| Beacon, TP 8 × PP 16 × DP 128")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    a = got["algorithms"]
    seen = 0
    for cells in rows:
        cls, algo = re.match(r"[A-Z]+", cells[0]).group(0).lower(), cells[1]
        if algo not in a:
            continue
        c = a[algo][cls]
        want = ["%.3f" % c["time_s"], "%.2f" % (1e3 * c["latency_s"]), "%d" % (c["connections_intra"] + c["connections_inter"]),
                "%.1f" % (c["registered_bytes"] / 2**20), "%d" % c["incast_senders"], "%.1f" % (c["inflight_bytes_per_nic"] / 2**20)]
        got_cells = [re.sub(r"[^0-9.]", "", s) for s in cells[2:8]]
        assert got_cells == want, "README Beacon table, %s %s: %s, the formulas give %s" % (cls, algo, cells[2:8], want)
        seen += 1
    assert seen >= 9, "README's Beacon table has %d rows of TP, PP and DP" % seen
    print("ok: README's Beacon table (%d rows) matches the formulas" % seen)


def main():
    check_sources()
    beacon = None
    for args, case in CASES:
        got = check_case(args, case)
        beacon = beacon or got
    check_beacon(beacon)
    check_readme(beacon)


main()
