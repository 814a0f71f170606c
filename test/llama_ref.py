#!/usr/bin/python3
"""PyTorch reference for the CPU backend's Llama-family ops (build/llama_check writes inputs and results).

RMSNorm (and its fused residual add), SwiGLU's activation, RoPE (rotate-half, per-token positions and
offsets, Llama 3.1 frequency scaling) and grouped-query attention with RoPE fused (whole sequence, and the
zigzag context-parallel blocks with merging and accumulation), forward and backward, each against the
op written here from its published definition in float64 with autograd. Errors are max |ours - ref| /
max |ref| per tensor. Tolerances: fp32 1e-5 (5e-6 for the elementwise ops); bf16 storage 1e-2 where a
result is stored in bf16 (8 bits of mantissa: relative rounding 2^-9 per element, compounded over a
few roundings), fp32 statistics (rstd, lse) 1e-5 or 1e-4 (computed in fp32 from bf16 inputs).
Exit status 0 means every check passed.
"""
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
failures = 0


def check(case, name, ours, ref, tol):
    global failures
    ref = ref.detach().numpy() if torch.is_tensor(ref) else ref
    ours = ours.reshape(ref.shape)
    err = float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1e-30))
    ok = err <= tol
    failures += not ok
    print(f"{'ok' if ok else 'FAIL'} {case} {name}: {err:.3e} (tolerance {tol:.0e})")


def run(binary, d, *args):
    subprocess.run([binary, d, *map(str, args)], check=True, stdout=subprocess.DEVNULL)

    def load(name, shape=None):
        x = np.fromfile(os.path.join(d, name + ".bin"), dtype=np.float32).astype(np.float64)
        return x.reshape(shape) if shape else x
    return load


def t(x, grad=False):
    return torch.tensor(x, requires_grad=grad)


def rmsnorm_case(binary, dtype, N, C, eps):
    case = f"rmsnorm {dtype} N={N} C={C} eps={eps:g}"
    with tempfile.TemporaryDirectory() as d:
        load = run(binary, d, "rmsnorm", dtype, 7, N, C, eps)
        x, w = t(load("x", (N, C)), True), t(load("w"), True)
        rstd = 1 / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
        out = x * rstd * w
        out.backward(t(load("dy", (N, C))))
        tol = 5e-6 if dtype == "fp32" else 1e-2
        check(case, "out", load("out"), out, tol)
        check(case, "rstd", load("rstd"), rstd.squeeze(-1), 1e-5 if dtype == "fp32" else 1e-4)
        check(case, "dinp (accumulated)", load("dinp"), t(load("d0", (N, C))) + x.grad, tol)
        check(case, "dweight (accumulated)", load("dw"), 0.25 + w.grad, 1e-5 if dtype == "fp32" else 1e-4)
        res = t(load("x", (N, C)) + load("b", (N, C)))
        check(case, "residual: res", load("res"), res, 1e-7 if dtype == "fp32" else 4e-3)
        r = t(load("res", (N, C)))  # the stored residual is what is normalised
        check(case, "residual: out", load("rout"), r / torch.sqrt((r * r).mean(-1, keepdim=True) + eps) * w, tol)


def swiglu_case(binary, dtype, N, F):
    case = f"swiglu {dtype} N={N} F={F}"
    with tempfile.TemporaryDirectory() as d:
        load = run(binary, d, "swiglu", dtype, 11, N, F)
        gu = t(load("gu", (N, 2 * F)), True)
        g, u = gu[:, :F], gu[:, F:]
        out = g * torch.sigmoid(g) * u
        out.backward(t(load("dy", (N, F))))
        tol = 5e-6 if dtype == "fp32" else 1e-2
        check(case, "out", load("out"), out, tol)
        check(case, "dgate|dup", load("dgu"), gu.grad, tol)


def inv_freq_ref(hs, theta, factor, low, high, orig):
    """HF's rope_type "llama3" (transformers' _compute_llama3_parameters), in float64."""
    inv = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    if factor <= 0:
        return inv
    low_wavelen, high_wavelen = orig / low, orig / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate(x, pos, inv):
    """x [..., T, heads, hs] rotated at positions pos[T] (rotate-half: HF's apply_rotary_pos_emb)."""
    ang = pos[:, None] * inv[None, :]                  # [T, hs/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def rope_case(binary, dtype, B, T, NHd, hs, theta, factor, low, high, orig, pos0):
    case = f"rope {dtype} B={B} T={T} heads={NHd} hs={hs} theta={theta:g} factor={factor:g} pos0={pos0}"
    with tempfile.TemporaryDirectory() as d:
        load = run(binary, d, "rope", dtype, 13, B, T, NHd, hs, theta, factor, low, high, orig, pos0)
        inv = inv_freq_ref(hs, theta, factor, low, high, orig)
        check(case, "inv_freq", load("inv_freq"), inv, 1e-7)
        x = t(load("x", (B, T, NHd, hs)), True)
        pos = torch.arange(T, dtype=torch.float64) * 3 + pos0
        out = rotate(x, pos, inv)
        out.backward(t(load("dy", (B, T, NHd, hs))))
        tol = 5e-6 if dtype == "fp32" else 1e-2
        check(case, "out (positions pos0 + 3t)", load("out"), out, tol)
        check(case, "backward", load("dx"), x.grad, tol)
        check(case, "out (offset pos0 + t)", load("out_offset"),
              rotate(t(load("x", (B, T, NHd, hs))), torch.arange(T, dtype=torch.float64) + pos0, inv), tol)


def gqa_case(binary, dtype, B, T, NH, NKV, hs, rope, theta=10000.0, factor=0.0, low=1.0, high=4.0, orig=8192):
    case = f"gqa {dtype} B={B} T={T} NH={NH} NKV={NKV} hs={hs} rope={rope}" + (f" factor={factor:g}" if factor else "")
    Cq, Ck, G = NH * hs, NKV * hs, NH // NKV
    with tempfile.TemporaryDirectory() as d:
        load = run(binary, d, "gqa", dtype, 42, B, T, NH, NKV, hs, rope, theta, factor, low, high, orig)
        qkv = t(load("qkv", (B, T, Cq + 2 * Ck)), True)
        q = qkv[:, :, :Cq].reshape(B, T, NH, hs)
        k = qkv[:, :, Cq:Cq + Ck].reshape(B, T, NKV, hs)
        v = qkv[:, :, Cq + Ck:].reshape(B, T, NKV, hs)
        if rope:
            inv = inv_freq_ref(hs, theta, factor, low, high, orig)
            pos = torch.arange(T, dtype=torch.float64)
            q, k = rotate(q, pos, inv), rotate(k, pos, inv)
        # query head h reads key/value head h // G (HF's repeat_kv)
        k, v = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))   # [B, NH, T, hs]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        lse = torch.logsumexp(scores, -1)
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, Cq)
        out.backward(t(load("dout", (B, T, Cq))))
        g = qkv.grad
        whole_tol = 1e-5 if dtype == "fp32" else 2e-2
        check(case, "whole: out", load("out"), out, whole_tol)
        check(case, "whole: lse", load("lse"), lse, 1e-5)
        check(case, "whole: dqkv", load("dqkv"), g, whole_tol)
        # the blocks accumulate in fp32 from the stored inputs: fp32 precision in both dtypes
        check(case, "zigzag blocks: out", load("bout"), out, 1e-5)
        check(case, "zigzag blocks: lse", load("blse"), lse, 1e-5)
        check(case, "zigzag blocks: dq", load("bdq"), g[:, :, :Cq], 1e-5)
        check(case, "zigzag blocks: dk", load("bdk"), g[:, :, Cq:Cq + Ck], 1e-5)
        check(case, "zigzag blocks: dv", load("bdv"), g[:, :, Cq + Ck:], 1e-5)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "./build/llama_check"
    rmsnorm_case(binary, "fp32", 37, 100, 1e-5)   # C not a multiple of the vector width
    rmsnorm_case(binary, "fp32", 70, 256, 1e-6)   # more rows than one chunk of the weight-gradient sums
    rmsnorm_case(binary, "bf16", 40, 96, 1e-5)
    swiglu_case(binary, "fp32", 33, 75)
    swiglu_case(binary, "bf16", 20, 128)
    rope_case(binary, "fp32", 2, 19, 3, 20, 10000.0, 0, 1, 4, 8192, 5)
    # Llama 3.1's scaling at positions past the original context: hs 64 spans all three bands
    rope_case(binary, "fp32", 1, 23, 2, 64, 500000.0, 8.0, 1.0, 4.0, 8192, 9000)
    rope_case(binary, "bf16", 2, 16, 2, 32, 500000.0, 0, 1, 4, 8192, 0)
    gqa_case(binary, "fp32", 2, 36, 4, 2, 16, 1)             # groups of 2, chunks of 9
    gqa_case(binary, "fp32", 1, 100, 6, 1, 24, 1, 500000.0, 8.0)  # one KV head (MQA), chunks of 25, 3.1 scaling
    gqa_case(binary, "fp32", 2, 44, 8, 2, 8, 0)              # no RoPE, groups of 4
    gqa_case(binary, "fp32", 2, 32, 3, 3, 16, 0)             # NKV = NH: bitwise the GPT-2 ops (llama_check checks)
    gqa_case(binary, "fp32", 1, 68, 4, 4, 16, 1)             # multi-head with RoPE
    gqa_case(binary, "bf16", 2, 64, 4, 2, 32, 1)
    print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} check(s) failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
