#!/usr/bin/python3
"""Token shards of llm.c's two header variants written here with numpy (dev/data/data_common.py's
format: 256 int32 header of magic, version, token count; then uint16 tokens for GPT-2, magic 20240520
version 1, or uint32 tokens for Llama 3, magic 20240801 version 7), read by ./train: the step-0 batch
that --dump writes must be the windows cut from the arrays here, ids above 65,535 included; bad
headers and out-of-vocabulary ids fail with one line. Usage: shards_u32.py ./train WORKDIR
"""
import os
import subprocess
import sys

import numpy as np

TRAIN, W = sys.argv[1], sys.argv[2]
os.makedirs(W, exist_ok=True)
failures = 0


def report(ok, what):
    global failures
    failures += not ok
    print(f"{'ok' if ok else 'FAIL'} {what}")


def write(path, toks, llama3, magic=None, version=None, count=None, cut=0):
    h = np.zeros(256, np.int32)
    h[0] = magic if magic is not None else (20240801 if llama3 else 20240520)
    h[1] = version if version is not None else (7 if llama3 else 1)
    h[2] = len(toks) if count is None else count
    data = h.tobytes() + np.asarray(toks, np.uint32 if llama3 else np.uint16).tobytes()
    with open(path, "wb") as f:
        f.write(data[:len(data) - cut])


V, T, B, G = 70000, 8, 2, 4
rng = np.random.default_rng(3)
a = rng.integers(0, 65536, 20)            # a GPT-2 shard: ids below 65,536 (windows 2 and 3 reach b)
b = rng.integers(60000, V, 41)            # a Llama 3 shard: ids above 65,535 among them
write(f"{W}/tok_0.bin", a, False)
write(f"{W}/tok_1.bin", b, True)
allt = np.concatenate([a, b])
shape = ["--layers", "1", "--channels", "8", "--heads", "1", "--vocab", str(V), "--seq-len", str(T),
         "--micro-batch", str(B), "--batch-tokens", str(G * T), "--steps", "1"]
dump = f"{W}/dump"
r = subprocess.run([TRAIN, "--train", f"{W}/tok_*.bin", *shape, "--dump", dump], capture_output=True, text=True)
report(r.returncode == 0, f"./train reads a uint16 and a uint32 shard together{'' if r.returncode == 0 else ': ' + r.stderr.strip()}")
if r.returncode == 0:
    tok = np.fromfile(f"{dump}/tokens.bin", np.int32).reshape(2, G, T)
    Wn = (len(allt) - 1) // T
    want_in = np.stack([allt[(g % Wn) * T:(g % Wn) * T + T] for g in range(G)])
    want_tg = np.stack([allt[(g % Wn) * T + 1:(g % Wn) * T + T + 1] for g in range(G)])
    report(np.array_equal(tok[0], want_in) and np.array_equal(tok[1], want_tg) and tok.max() > 65535,
           "the step-0 batch equals the numpy windows (ids above 65,535 kept)")


def bad(name, needle, **kw):
    d = f"{W}/bad_{name}"
    os.makedirs(d, exist_ok=True)
    write(f"{d}/x.bin", b, True, **kw)
    r = subprocess.run([TRAIN, "--train", f"{d}/x.bin", *shape], capture_output=True, text=True)
    lines = r.stderr.strip().splitlines()
    report(r.returncode != 0 and len(lines) == 1 and needle in lines[0],
           f"bad shard: {name}: {lines[0] if lines else '(no message)'}")


bad("version", "unsupported token shard version 1 (expected 7 with magic 20240801)", version=1)
bad("magic", "bad magic 20240802", magic=20240802)
bad("truncated", "is truncated", cut=3)
bad("count", "more than the", count=40)
d = f"{W}/bad_vocab"
os.makedirs(d, exist_ok=True)
write(f"{d}/x.bin", np.array([1, 2, V, 3] * 5), True)
r = subprocess.run([TRAIN, "--train", f"{d}/x.bin", *shape], capture_output=True, text=True)
report(r.returncode != 0 and f"token {V} at position 2 (byte offset 1032) is not below the vocabulary size {V}" in r.stderr,
       "bad shard: a uint32 id at the vocabulary size is named with its byte offset")
print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} check(s) failed")
sys.exit(1 if failures else 0)
