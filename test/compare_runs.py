#!/usr/bin/python3
"""Compares training runs: each candidate's per-step losses (JSON Lines) and saved model against the
reference run's, within a relative tolerance. Usage:
  compare_runs.py TOL REF_PREFIX CAND_PREFIX...   (PREFIX.jsonl and PREFIX.bin for each run)
The parameter error is max|cand - ref| / max|ref| over the whole model; the loss error is the largest
relative difference over the steps. Exit status 1 when any candidate is out of tolerance."""
import json
import sys

import numpy as np


def losses(prefix):
    return [json.loads(line)["loss"] for line in open(prefix + ".jsonl") if '"loss"' in line]


def params(prefix):
    return np.fromfile(prefix + ".bin", dtype=np.float32)[256:].astype(np.float64)


tol = float(sys.argv[1])
ref = sys.argv[2]
ref_l, ref_p = losses(ref), params(ref)
bad = 0
for cand in sys.argv[3:]:
    l, p = losses(cand), params(cand)
    if len(l) != len(ref_l) or p.shape != ref_p.shape:
        print(f"FAIL {cand}: {len(l)} steps / {p.size} parameters, reference has {len(ref_l)} / {ref_p.size}")
        bad += 1
        continue
    lerr = max(abs(a - b) / abs(b) for a, b in zip(l, ref_l))
    perr = float(np.max(np.abs(p - ref_p)) / np.max(np.abs(ref_p)))
    ok = lerr <= tol and perr <= tol
    bad += not ok
    print(f"{'ok' if ok else 'FAIL'} {cand}: loss {lerr:.2e}, parameters {perr:.2e} (tolerance {tol:.0e})")
sys.exit(1 if bad else 0)
