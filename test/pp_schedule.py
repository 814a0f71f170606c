#!/usr/bin/python3
"""Checks the pipeline schedule each stage ran (--pp-trace DIR) against 1F1B computed here (or, with V
chunks per stage, the interleaved 1F1B of Megatron-LM), and that no stage held more than P micro-
batches' activations under plain 1F1B. Usage: pp_schedule.py DIR P M [V]"""
import sys


def one_f_one_b(P, M, s):
    """Stage s of P over M micro-batches: warm-up forwards, then one forward / one backward, then
    the remaining backwards."""
    warm = min(P - s - 1, M)
    ops = [f"F{i}" for i in range(warm)]
    for i in range(M - warm):
        ops += [f"F{warm + i}", f"B{i}"]
    ops += [f"B{i}" for i in range(M - warm, M)]
    return ops


def interleaved(P, M, V, s):
    """Groups of P micro-batches visit the V chunks in turn; warm-up (P - s - 1)*2 + (V - 1)*P."""
    def op(k, backward):
        mb = (k // (P * V)) * P + k % P
        chunk = (k // P) % V
        return f"{'B' if backward else 'F'}{mb}c{V - 1 - chunk if backward else chunk}"
    total = M * V
    warm = min((P - s - 1) * 2 + (V - 1) * P, total)
    ops = [op(k, False) for k in range(warm)]
    for i in range(total - warm):
        ops += [op(warm + i, False), op(i, True)]
    ops += [op(i, True) for i in range(total - warm, total)]
    return ops


def live_peak(ops):
    live = peak = 0
    for op in ops:
        live += 1 if op[0] == "F" else -1
        peak = max(peak, live)
    return peak


d, P, M = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
V = int(sys.argv[4]) if len(sys.argv) > 4 else 1
bad = 0
for s in range(P):
    lines = open(f"{d}/stage{s}.txt").read().splitlines()
    assert lines, f"stage {s}: no trace"
    want = one_f_one_b(P, M, s) if V == 1 else interleaved(P, M, V, s)
    for line in lines:
        head, ops = line.split(": ", 1)
        ops = ops.split()
        peak = int(head.split()[3])
        if ops != want:
            print(f"FAIL stage {s}: ran {' '.join(ops)}, 1F1B is {' '.join(want)}")
            bad += 1
        if peak != live_peak(want) or (V == 1 and peak > P):
            print(f"FAIL stage {s}: peak {peak} live micro-batches (1F1B: {live_peak(want)}, bound {P})")
            bad += 1
    bound = f" <= {P}" if V == 1 else ""
    print(f"stage {s}: {len(lines)} step(s) of {' '.join(want)} (peak {live_peak(want)}{bound})")
sys.exit(1 if bad else 0)
