#!/usr/bin/python3
"""Reads an llm4d checkpoint with nothing but the documented format (README, "Checkpoints"): checks
every shard's size and zlib crc32 and the manifest's own crc32, puts the full fp32 master weights, m
and v together from the shards' runs, checks that every element of the model was written exactly
once, and compares the master weights with an llm.c model file (--save-model of the same state).
Usage: ckpt_reader.py CKPT_DIR MODEL.bin"""
import json
import struct
import sys
import zlib

import numpy as np

ckpt, model_file = sys.argv[1], sys.argv[2]
raw = open(f"{ckpt}/manifest.json", "rb").read()
man = json.loads(raw)
assert zlib.crc32(raw[:raw.rindex(b'"manifest_crc32"')]) == man["manifest_crc32"], "manifest crc32"
names = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb",
         "fcprojw", "fcprojb", "lnfw", "lnfb"]
full, seen = {}, {}
for s in man["shards"]:
    b = open(f"{ckpt}/{s['file']}", "rb").read()
    assert len(b) == s["bytes"] and zlib.crc32(b) == s["crc32"], f"{s['file']}: size or crc32"
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    meta = header.pop("__metadata__")
    data = b[8 + n:]

    def tensor(key):
        t = header[key]
        a, e = t["data_offsets"]
        return np.frombuffer(data[a:e], dtype={"F32": "<f4", "I64": "<i8"}[t["dtype"]]).reshape(t["shape"])

    for name in names:
        shape = json.loads(meta["shape." + name])
        if name not in full:
            full[name] = {q: np.zeros(int(np.prod(shape)), np.float32) for q in ("master", "m", "v")}
            seen[name] = np.zeros(int(np.prod(shape)), np.int32)
        if name + ".runs" not in header:
            continue
        pos = 0
        for start, length in tensor(name + ".runs"):
            for q in ("master", "m", "v"):
                full[name][q][start:start + length] = tensor(f"{name}.{q}")[pos:pos + length]
            seen[name][start:start + length] += 1
            pos += length
for name in names:
    assert (seen[name] == 1).all(), f"{name}: elements written {seen[name].min()} to {seen[name].max()} times"
params = np.fromfile(model_file, dtype=np.float32)[256:]
assembled = np.concatenate([full[n]["master"] for n in names])
assert assembled.shape == params.shape, (assembled.shape, params.shape)
assert np.array_equal(assembled, params), f"master weights differ from {model_file}: max {np.abs(assembled - params).max()}"
assert all(np.isfinite(full[n]["v"]).all() and (full[n]["v"] >= 0).all() for n in names), "v"
print(f"{len(man['shards'])} shard(s) of step {man['step']} read; every element once; master weights equal {model_file}")
