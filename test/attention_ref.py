#!/usr/bin/python3
"""PyTorch reference for the CPU backend's attention (build/attention_check writes the inputs and results).

For each shape: the whole-sequence flash attention (out, per-row log-sum-exp, dq/dk/dv), and the block
ops on a zigzag split over two context-parallel ranks (chunks 0 and 3 on rank 0, 1 and 2 on rank 1,
key chunks merged in ring order into fp32 accumulators, then the backward of every block pair) against
causal softmax attention in float64 with autograd. Exit status 0 means every check passed.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

CASES = [  # dtype, B, T, C, NH
    ("fp32", 2, 32, 48, 3),   # chunks of 8, head size 16
    ("fp32", 1, 100, 64, 1),  # one head, chunks of 25 (off the 32-row tiles)
    ("fp32", 2, 36, 32, 8),   # many heads of 4 channels
    ("bf16", 2, 64, 96, 3),   # bf16 storage
]


def rel(ours, ref):
    ref = ref.detach().numpy()
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "./build/attention_check"
    failures = 0
    for dtype, B, T, C, NH in CASES:
        hs = C // NH
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([binary, d, dtype, str(B), str(T), str(C), str(NH), "42"], check=True,
                           stdout=subprocess.DEVNULL)

            def load(name, shape):
                return np.fromfile(os.path.join(d, name + ".bin"), dtype=np.float32).reshape(shape)

            qkv = torch.tensor(load("qkv", (B, T, 3 * C)), dtype=torch.float64, requires_grad=True)
            dout = torch.tensor(load("dout", (B, T, C)), dtype=torch.float64)
            q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
            scores = (q @ k.transpose(-2, -1)) / np.sqrt(hs)
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
            lse = torch.logsumexp(scores, dim=-1)                      # [B, NH, T]
            out = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
            out.backward(dout)
            dqkv = qkv.grad.view(B, T, 3, C)
            whole_tol = 1e-5 if dtype == "fp32" else 2e-2  # bf16 stores out and dqkv rounded
            checks = [
                ("whole: out", rel(load("out", (B, T, C)), out), whole_tol),
                ("whole: lse", rel(load("lse", (B, NH, T)), lse), 1e-5),  # fp32 from the stored inputs
                ("whole: dqkv", rel(load("dqkv", (B, T, 3 * C)), qkv.grad), whole_tol),
                # the blocks accumulate in fp32 from the stored inputs: fp32 precision in both dtypes
                ("zigzag blocks: out", rel(load("bout", (B, T, C)), out), 1e-5),
                ("zigzag blocks: lse", rel(load("blse", (B, NH, T)), lse), 1e-5),
                ("zigzag blocks: dq", rel(load("bdq", (B, T, C)), dqkv[:, :, 0]), 1e-5),
                ("zigzag blocks: dk", rel(load("bdk", (B, T, C)), dqkv[:, :, 1]), 1e-5),
                ("zigzag blocks: dv", rel(load("bdv", (B, T, C)), dqkv[:, :, 2]), 1e-5),
            ]
            for name, err, tol in checks:
                ok = err <= tol
                failures += not ok
                print(f"{'ok' if ok else 'FAIL'} {dtype} B={B} T={T} C={C} NH={NH} {name}: {err:.3e} (tolerance {tol:.0e})")
    print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} check(s) failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
