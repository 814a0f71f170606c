#!/usr/bin/python3
"""Writes a checkpoint's full fp32 master weights as an llm.c-style model file (256 int32 header, zeros
but the magic, then the tensors in model.h's order, the ones the architecture lacks skipped), so that
compare_runs.py compares models that have no --save-model (the Llama family). Reads the shards the way
ckpt_reader.py does (the documented format: each tensor's runs of full positions); every element once.
Usage: ckpt_model.py CKPT_DIR OUT.bin"""
import json
import struct
import sys

import numpy as np

NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb",
         "fcprojw", "fcprojb", "lnfw", "lnfb", "lmhead"]
ckpt, out = sys.argv[1], sys.argv[2]
man = json.load(open(f"{ckpt}/manifest.json"))
full, seen = {}, {}
for s in man["shards"]:
    b = open(f"{ckpt}/{s['file']}", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    meta = header.pop("__metadata__")
    data = b[8 + n:]
    for name in NAMES:
        if "shape." + name not in meta:
            continue
        size = int(np.prod(json.loads(meta["shape." + name])))
        full.setdefault(name, np.zeros(size, np.float32))
        seen.setdefault(name, np.zeros(size, np.int32))
        if name + ".runs" not in header:
            continue
        a, e = header[name + ".runs"]["data_offsets"]
        runs = np.frombuffer(data[a:e], dtype="<i8").reshape(-1, 2)
        a, e = header[name + ".master"]["data_offsets"]
        vals = np.frombuffer(data[a:e], dtype="<f4")
        pos = 0
        for start, length in runs:
            full[name][start:start + length] = vals[pos:pos + length]
            seen[name][start:start + length] += 1
            pos += length
names = [n for n in NAMES if n in full]
for n in names:
    assert (seen[n] == 1).all(), f"{n}: elements written {seen[n].min()} to {seen[n].max()} times"
head = np.zeros(256, np.int32)
head[0] = 20240326
with open(out, "wb") as f:
    f.write(head.tobytes())
    f.write(np.concatenate([full[n] for n in names]).tobytes())
