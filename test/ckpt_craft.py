#!/usr/bin/python3
"""Crafts a damaged copy of an llm4d checkpoint whose checksums still verify, so that what the reader
must catch is the damage itself (README, "Checkpoints": the format; the crc32 as the reader checks it).
Usage: ckpt_craft.py SRC DST EDIT...
  PATH=JSON    sets a manifest member (dotted path, e.g. layout.dp=-7, model.layers=4294967300)
  -PATH        removes it (e.g. -data.fingerprint)
  overlap      moves the first run of rank 1's shard that starts after element 0 of its tensor one element
               back, onto an element another run holds (one element then in no run): prints
               'TENSOR START', START the element now held twice
  value:KEY=X  sets the first element of rank 0's shard tensor KEY (e.g. wte.v, a float32) to X (nan, inf, -1)
Then recomputes the shards' crc32 in the manifest and the manifest's own."""
import json
import shutil
import struct
import sys
import zlib

src, dst, edits = sys.argv[1], sys.argv[2], sys.argv[3:]
shutil.copytree(src, dst)
man = json.loads(open(f"{dst}/manifest.json", "rb").read())
del man["manifest_crc32"]
for e in edits:
    if e == "overlap":
        path = f"{dst}/rank_00001.safetensors"
        b = bytearray(open(path, "rb").read())
        n = struct.unpack("<Q", b[:8])[0]
        header = json.loads(b[8:8 + n])
        done = False
        for key, t in header.items():
            if not key.endswith(".runs"):
                continue
            a, _ = t["data_offsets"]
            for i in range(t["shape"][0]):
                at = 8 + n + a + 16 * i
                start = struct.unpack("<q", b[at:at + 8])[0]
                if start > 0:
                    b[at:at + 8] = struct.pack("<q", start - 1)
                    print(key[:-len(".runs")], start - 1)
                    done = True
                    break
            if done:
                break
        assert done, "rank 1 holds no run that starts after element 0"
        open(path, "wb").write(b)
        man["shards"][1]["crc32"] = zlib.crc32(bytes(b))
        continue
    if e.startswith("value:"):
        key, x = e[len("value:"):].split("=", 1)
        path = f"{dst}/rank_00000.safetensors"
        b = bytearray(open(path, "rb").read())
        n = struct.unpack("<Q", b[:8])[0]
        t = json.loads(b[8:8 + n])[key]
        assert t["dtype"] == "F32", t
        b[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][0] + 4] = struct.pack("<f", float(x))
        open(path, "wb").write(b)
        man["shards"][0]["crc32"] = zlib.crc32(bytes(b))
        continue
    remove = e.startswith("-")
    keys, value = (e[1:], None) if remove else e.split("=", 1)
    obj, keys = man, keys.split(".")
    for k in keys[:-1]:
        obj = obj[k]
    if remove:
        del obj[keys[-1]]
    else:
        obj[keys[-1]] = json.loads(value)
# the crc32 covers every byte before the "manifest_crc32" member, its last
body = json.dumps(man, indent=2)
prefix = body[:body.rindex("}")].rstrip() + ",\n  "
text = prefix + '"manifest_crc32": %d\n}\n' % zlib.crc32(prefix.encode())
open(f"{dst}/manifest.json", "w").write(text)
