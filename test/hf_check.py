#!/usr/bin/python3
"""Hugging Face checkpoints through hf.c (./train hf-inspect) against independent writers and readers.

Files written here (by the `safetensors` package from PyPI when installed, and always by a minimal numpy
writer of the published format) are read by hf.c and must equal the arrays bit for bit after conversion
to fp32 (F32 as is, BF16 and F16 widened exactly); files hf.c writes (one file in fp32, sharded with the
index in bf16) are read by the safetensors package (or the numpy reader below) and must equal the arrays
(bf16: rounded to nearest even, as torch rounds). Every bad input (truncated file, header length past the
end, unknown dtype, shape mismatch, missing tensor, bad config fields) must give one line naming the
problem and a non-zero exit. The conversion into llm4d's model (hf-inspect --via-model, what --init-from-hf
and --save-hf use): the full fp32 vector equals one assembled here from model.h's documented layout (q, k,
v rows concatenated into qkvw, gate and up into fcw, the vocabulary padded to a multiple of 128 with zero
rows, llm.c's tensor order), and HF -> llm4d -> HF gives back every tensor bit for bit, one file and
sharded, from F32, BF16 and F16 input, tied and untied. Usage: hf_check.py ./train
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

TRAIN = sys.argv[1] if len(sys.argv) > 1 else "./train"
try:
    import safetensors.numpy as stnp
    HAVE_ST = True
except ImportError:
    HAVE_ST = False
try:
    import torch
    import safetensors.torch as stt
    HAVE_ST_TORCH = HAVE_ST
except ImportError:
    HAVE_ST_TORCH = False

failures = 0


def report(ok, what):
    global failures
    failures += not ok
    print(f"{'ok' if ok else 'FAIL'} {what}")


CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 24, "intermediate_size": 40, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 70, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False, "torch_dtype": "float32", "max_position_embeddings": 256,
}


def shapes(cfg):
    C, F, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    hd = C // cfg["num_attention_heads"]
    Q, KV = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = {"model.embed_tokens.weight": (V, C)}
    for i in range(L):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (C,), p + "self_attn.q_proj.weight": (Q, C),
                    p + "self_attn.k_proj.weight": (KV, C), p + "self_attn.v_proj.weight": (KV, C),
                    p + "self_attn.o_proj.weight": (C, Q), p + "post_attention_layernorm.weight": (C,),
                    p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                    p + "mlp.down_proj.weight": (C, F)})
    out["model.norm.weight"] = (C,)
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = (V, C)
    return out


def arrays(cfg, seed=1):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes(cfg).items()}


ST_DT = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64"}


def np_write(path, tensors, dtypes=None, corrupt=None):
    """The published format, written here: u64 header length, JSON header, raw little-endian data.
    tensors: name -> array (float32/float16), or (uint16 raw bits, "BF16")."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        if isinstance(a, tuple):
            raw, dt = a
        else:
            raw, dt = a, ST_DT[a.dtype]
        if dtypes and name in dtypes:
            dt = dtypes[name]
        b = np.ascontiguousarray(raw).tobytes()
        header[name] = {"dtype": dt, "shape": list(raw.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if corrupt == "overlap":  # a tensor's offsets on another's bytes of the same size
        seen = {}
        for name, e in header.items():
            if name == "__metadata__":
                continue
            size = e["data_offsets"][1] - e["data_offsets"][0]
            if size in seen:
                e["data_offsets"] = list(header[seen[size]]["data_offsets"])
                break
            seen[size] = name
    h = json.dumps(header).encode()
    if corrupt == "duplicate":  # the last tensor's entry given twice (json.dumps cannot write that)
        last = [k for k in header if k != "__metadata__"][-1]
        h = h[:-1] + b", " + json.dumps(last).encode() + b": " + json.dumps(header[last]).encode() + b"}"
    h += b" " * (-len(h) % 8)
    data = struct.pack("<Q", len(h)) + h + b"".join(blobs)
    if corrupt == "truncate":
        data = data[:-7]
    elif corrupt == "header_len":
        data = struct.pack("<Q", len(data)) + data[8:]
    with open(path, "wb") as f:
        f.write(data)


def np_read(path):
    """The reading side of the same format (for hf.c's files when the package is absent)."""
    with open(path, "rb") as f:
        data = f.read()
    (hl,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hl])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = data[8 + hl + a:8 + hl + b]
        if e["dtype"] == "F32":
            out[name] = np.frombuffer(raw, np.float32).reshape(e["shape"])
        elif e["dtype"] == "BF16":
            out[name] = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(e["shape"])
    return out


def bf16_bits(a):
    """fp32 -> bf16 bits, round to nearest even (what hf.c and torch do), NaN-free inputs"""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def widen(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write_config(d, cfg):
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def inspect(d, *extra):
    return subprocess.run([TRAIN, "hf-inspect", d, *extra], capture_output=True, text=True)


def read_back(case, d, expect, cfg):
    dump = os.path.join(d, "dump")
    r = inspect(d, "--dump", dump)
    if r.returncode != 0:
        report(False, f"{case}: hf-inspect failed: {r.stderr.strip()}")
        return
    bad = [k for k, v in expect.items()
           if not np.array_equal(np.fromfile(os.path.join(dump, k + ".bin"), np.float32).reshape(v.shape), v)]
    listed = [l.split()[1] for l in r.stdout.splitlines() if l.startswith("tensor ")]
    report(not bad and sorted(listed) == sorted(expect),
           f"{case}: {len(expect)} tensors read by hf.c equal the arrays" + (f" (differ: {bad[:3]})" if bad else ""))


def expect_error(case, d, needle, *extra):
    r = inspect(d, *extra)
    lines = r.stderr.strip().splitlines()
    ok = r.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    report(ok, f"bad input: {case}: exit {r.returncode}, {lines[0] if lines else '(no message)'}")


LLM4D_ORDER = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb",
               "fcprojw", "fcprojb", "lnfw", "lnfb", "lmhead"]


def model_vector(cfg, t):
    """llm4d's full parameter vector of a Llama, assembled from HF tensors t by model.h's table (GPT-2's
    slots wpe and the biases empty)"""
    L, V, C = cfg["num_hidden_layers"], cfg["vocab_size"], cfg["hidden_size"]
    Vp = (V + 127) // 128 * 128
    pad = lambda a: np.concatenate([a, np.zeros((Vp - V, C), np.float32)])
    lay = lambda k: np.stack([t[f"model.layers.{l}.{k}"] for l in range(L)])
    cat = lambda ks: np.stack([np.concatenate([t[f"model.layers.{l}.{k}"] for k in ks]) for l in range(L)])
    parts = {"wte": pad(t["model.embed_tokens.weight"]), "ln1w": lay("input_layernorm.weight"),
             "qkvw": cat(["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"]),
             "attprojw": lay("self_attn.o_proj.weight"), "ln2w": lay("post_attention_layernorm.weight"),
             "fcw": cat(["mlp.gate_proj.weight", "mlp.up_proj.weight"]), "fcprojw": lay("mlp.down_proj.weight"),
             "lnfw": t["model.norm.weight"]}
    if not cfg["tie_word_embeddings"]:
        parts["lmhead"] = pad(t["lm_head.weight"])
    return np.concatenate([parts[k].ravel() for k in LLM4D_ORDER if k in parts]).astype(np.float32)


def hf_tensors(d):
    """every tensor of an HF directory as fp32 (the package when installed, else the numpy reader)"""
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    out = {}
    for f in files:
        out.update(stt.load_file(os.path.join(d, f)) if HAVE_ST_TORCH else np_read(os.path.join(d, f)))
    return {k: (v.float().numpy() if HAVE_ST_TORCH else v) for k, v in out.items()}


def via_model(case, src, cfg, expect, w, shard=None):
    """HF (src, whose tensors widen to expect) -> llm4d's vector -> HF; then the written checkpoint -> llm4d
    again. The vector must be the documented assembly, the written tensors the source's, bit for bit."""
    tag = "".join(ch if ch.isalnum() else "_" for ch in case)
    raw, out = os.path.join(w, tag + ".raw"), os.path.join(w, tag + "_out")
    extra = ["--max-shard-bytes", str(shard)] if shard else []
    r = inspect(src, "--via-model", raw, "--save-hf", out, *extra)
    if r.returncode != 0:
        report(False, f"{case}: hf-inspect --via-model failed: {r.stderr.strip()}")
        return
    vec = np.fromfile(raw, np.float32)
    want = model_vector(cfg, expect)
    report(vec.shape == want.shape and np.array_equal(vec, want),
           f"{case}: llm4d's vector ({vec.size} floats) is the documented assembly of the HF tensors")
    got = hf_tensors(out)
    files = sorted(os.listdir(out))
    nshards = len([f for f in files if f.startswith("model-")])
    layout_ok = (nshards > 1 and "model.safetensors.index.json" in files) if shard else files == ["config.json", "model.safetensors"]
    report(layout_ok and sorted(got) == sorted(expect) and all(np.array_equal(got[k], expect[k]) for k in expect),
           f"{case}: HF -> llm4d -> HF gives back all {len(expect)} tensors bitwise (fp32, " +
           (f"{nshards} shards)" if shard else "one file)"))
    cfg2 = json.load(open(os.path.join(out, "config.json")))
    keys = [k for k in cfg if k not in ("torch_dtype", "architectures")]
    report(all(cfg2.get(k) == cfg[k] for k in keys), f"{case}: the written config.json has the source's values " +
           str({k: (cfg.get(k), cfg2.get(k)) for k in keys if cfg2.get(k) != cfg[k]}))
    # its reals as short as the floats they hold: no 17-digit 1.0000000000000001e-05 for 1e-5
    reals = re.findall(r'": (-?[0-9]+\.[0-9]*(?:e[-+]?[0-9]+)?|-?[0-9]+e[-+]?[0-9]+)', open(os.path.join(out, "config.json")).read())
    report(reals and all(len(re.sub(r"e.*|[-.]|^0+", "", x).rstrip("0")) <= 9 for x in reals),
           f"{case}: the written config.json's reals have at most 9 significant digits: {reals}")
    raw2 = raw + "2"
    r = inspect(out, "--via-model", raw2)
    report(r.returncode == 0 and np.array_equal(np.fromfile(raw2, np.float32), vec),
           f"{case}: the written checkpoint converts back to the same vector")


def main():
    cfg = CONFIG
    arr = arrays(cfg)
    with tempfile.TemporaryDirectory() as w:
        # 1. one file, fp32, numpy writer
        d = os.path.join(w, "np_f32"); os.mkdir(d)
        write_config(d, cfg)
        np_write(os.path.join(d, "model.safetensors"), arr)
        read_back("numpy writer, one file, F32", d, arr, cfg)
        r = inspect(d)
        report("num_key_value_heads 2" in r.stdout and "rope_scaling llama3(factor 8" in r.stdout and
               "tie_word_embeddings false" in r.stdout, "hf-inspect prints the config fields")
        # 2. sharded by hand with mixed dtypes: BF16 (raw bits) and F16, numpy writer + index
        d = os.path.join(w, "np_sharded"); os.mkdir(d)
        write_config(d, dict(cfg, torch_dtype="bfloat16"))
        names = list(arr)
        half = len(names) // 2
        parts, expect, wm = [{}, {}], {}, {}
        for i, k in enumerate(names):
            if i % 2 == 0:
                bits = bf16_bits(arr[k]); parts[i >= half][k] = (bits, "BF16"); expect[k] = widen(bits)
            else:
                h = arr[k].astype(np.float16); parts[i >= half][k] = h; expect[k] = h.astype(np.float32)
            wm[k] = f"model-0000{1 + (i >= half)}-of-00002.safetensors"
        for s in range(2):
            np_write(os.path.join(d, f"model-0000{s + 1}-of-00002.safetensors"), parts[s])
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f)
        read_back("numpy writer, 2 shards + index, BF16 and F16", d, expect, cfg)
        # 3. the safetensors package as writer
        if HAVE_ST:
            d = os.path.join(w, "st_f32"); os.mkdir(d)
            write_config(d, cfg)
            stnp.save_file(arr, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
            read_back("safetensors package writer, F32", d, arr, cfg)
            d = os.path.join(w, "st_f16"); os.mkdir(d)
            write_config(d, cfg)
            stnp.save_file({k: v.astype(np.float16) for k, v in arr.items()}, os.path.join(d, "model.safetensors"))
            read_back("safetensors package writer, F16", d, {k: v.astype(np.float16).astype(np.float32) for k, v in arr.items()}, cfg)
        else:
            print("skipped the safetensors package as writer: not installed (scripts/deps.sh installs it)")
        if HAVE_ST_TORCH:
            d = os.path.join(w, "st_bf16"); os.mkdir(d)
            write_config(d, cfg)
            t = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in arr.items()}
            stt.save_file(t, os.path.join(d, "model.safetensors"))
            read_back("safetensors package writer (torch), BF16", d, {k: v.float().numpy() for k, v in t.items()}, cfg)
        # 4. hf.c as writer: fp32 one file; bf16 sharded with the index
        src = os.path.join(w, "np_f32")
        out1, out2 = os.path.join(w, "out_f32"), os.path.join(w, "out_bf16")
        r = inspect(src, "--save-hf", out1)
        report(r.returncode == 0 and sorted(os.listdir(out1)) == ["config.json", "model.safetensors"],
               "hf.c writes config.json and one model.safetensors")
        got = stnp.load_file(os.path.join(out1, "model.safetensors")) if HAVE_ST else np_read(os.path.join(out1, "model.safetensors"))
        reader = "the safetensors package" if HAVE_ST else "the numpy reader"
        report(sorted(got) == sorted(arr) and all(np.array_equal(got[k], arr[k]) for k in arr),
               f"hf.c's fp32 file read by {reader} equals the arrays")
        r = inspect(src, "--save-hf", out2, "--dtype", "bf16", "--max-shard-bytes", "4000")
        files = sorted(os.listdir(out2))
        shards = [f for f in files if f.startswith("model-")]
        n = len(shards)
        ok = r.returncode == 0 and n > 1 and shards == [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)] and \
            "model.safetensors.index.json" in files and "model.safetensors" not in files
        report(ok, f"hf.c writes bf16 in {n} shards of at most 4000 bytes with the index")
        idx = json.load(open(os.path.join(out2, "model.safetensors.index.json")))
        got, sizes = {}, 0
        for s in shards:
            sizes = max(sizes, os.path.getsize(os.path.join(out2, s)))
            part = stt.load_file(os.path.join(out2, s)) if HAVE_ST_TORCH else np_read(os.path.join(out2, s))
            for k, v in part.items():
                got[k] = v.float().numpy() if HAVE_ST_TORCH else v
                ok = ok and idx["weight_map"].get(k) == s
        total = sum(v.size * 2 for v in arr.values())
        report(ok and idx["metadata"]["total_size"] == total, "the index maps every tensor to its shard; total_size is the bytes")
        exp = {k: widen(bf16_bits(v)) for k, v in arr.items()}
        if HAVE_ST_TORCH:  # torch's own rounding as the reference
            exp = {k: torch.from_numpy(v).to(torch.bfloat16).float().numpy() for k, v in arr.items()}
        report(sorted(got) == sorted(arr) and all(np.array_equal(got[k], exp[k]) for k in arr),
               f"hf.c's bf16 shards read by {reader} equal the arrays rounded to bf16")
        cfg2 = json.load(open(os.path.join(out2, "config.json")))
        report(all(cfg2[k] == cfg[k] for k in cfg if k != "torch_dtype") and cfg2["torch_dtype"] == "bfloat16",
               "hf.c's config.json has every field of the source config")
        read_back("hf.c's own bf16 shards read by hf.c", out2, exp, cfg)
        r = inspect(out2, "--save-hf", out2 + "_one", "--dtype", "fp32")  # re-written as one file
        read_back("bf16 shards re-written as one fp32 file", out2 + "_one", exp, cfg)

        # 6. the conversion into llm4d's model and back (what --init-from-hf and --save-hf do)
        via_model("model, F32 one file, GQA", os.path.join(w, "np_f32"), cfg, arr, w)
        via_model("model, F32 to 3+ shards", os.path.join(w, "np_f32"), cfg, arr, w, shard=3000)
        via_model("model, BF16 and F16 shards", os.path.join(w, "np_sharded"), dict(cfg, torch_dtype="bfloat16"), expect, w)
        if HAVE_ST_TORCH:
            via_model("model, BF16 (torch)", os.path.join(w, "st_bf16"), cfg, {k: v.float().numpy() for k, v in t.items()}, w)
        rng = np.random.default_rng(7)  # a second random shape: tied, 3 layers, 6 heads sharing 3 kv heads, V 300
        cfg3 = dict(cfg, hidden_size=36, num_attention_heads=6, num_key_value_heads=3, num_hidden_layers=3, vocab_size=300,
                    intermediate_size=int(rng.integers(20, 80)), tie_word_embeddings=True, rope_scaling=None,
                    rms_norm_eps=1e-6, rope_theta=10000.0)
        arr3 = arrays(cfg3, seed=3)
        d = os.path.join(w, "tied3"); os.mkdir(d)
        write_config(d, cfg3)
        np_write(os.path.join(d, "model.safetensors"), arr3)
        via_model("model, tied, 6 heads / 3 kv heads", d, cfg3, arr3, w)
        d = os.path.join(w, "deep"); os.mkdir(d)
        write_config(d, dict(cfg, num_hidden_layers=5000))
        np_write(os.path.join(d, "model.safetensors"), {})
        expect_error("a config llm4d cannot hold (5000 layers)", d, "config.json: not a shape llm4d trains",
                     "--via-model", os.path.join(w, "deep.raw"))

        # 5. bad input: one line, non-zero exit
        def case_dir(name, cfgx=None, tensors=None, **kw):
            d = os.path.join(w, "bad_" + name); os.mkdir(d)
            write_config(d, cfgx or cfg)
            np_write(os.path.join(d, "model.safetensors"), tensors if tensors is not None else arr, **kw)
            return d
        expect_error("truncated file", case_dir("trunc", corrupt="truncate"), "outside the")
        expect_error("header length past the end", case_dir("hlen", corrupt="header_len"), "header length")
        expect_error("a tensor named twice", case_dir("dup", corrupt="duplicate"), "malformed header: duplicate object key")
        expect_error("two tensors on the same bytes", case_dir("overlap", corrupt="overlap"), "overlap in the data (data_offsets")
        expect_error("unknown dtype", case_dir("dtype", dtypes={"model.norm.weight": "X9"}), "dtype X9")
        expect_error("I64 tensor", case_dir("i64", tensors=dict(arr, **{"model.norm.weight": np.zeros(24, np.int64)})),
                     "dtype I64 is not F32, BF16 or F16")
        wrong = dict(arr); wrong["model.layers.1.self_attn.k_proj.weight"] = np.zeros((24, 24), np.float32)
        expect_error("shape mismatch (k_proj of 4 KV heads for 2)", case_dir("shape", tensors=wrong),
                     "model.layers.1.self_attn.k_proj.weight has shape [24, 24], the config needs [12, 24]")
        missing = {k: v for k, v in arr.items() if k != "model.layers.0.mlp.up_proj.weight"}
        expect_error("missing tensor", case_dir("missing", tensors=missing), "model.layers.0.mlp.up_proj.weight is missing")
        tied = {k: v for k, v in arr.items() if k != "lm_head.weight"}
        read_back("tied embeddings: no lm_head.weight", case_dir("tied", dict(cfg, tie_word_embeddings=True), tied), tied, cfg)
        # tensors config.json has no place for: refused where the model is built from them (--via-model, as --init-from-hf)
        raw = os.path.join(w, "unplaced.raw")
        expect_error("a layer past num_hidden_layers", case_dir("fewer", dict(cfg, num_hidden_layers=cfg["num_hidden_layers"] - 1)),
                     "but config.json's num_hidden_layers is %d: the two disagree" % (cfg["num_hidden_layers"] - 1), "--via-model", raw)
        expect_error("tied, with an lm_head.weight of its own", case_dir("tiedhead", dict(cfg, tie_word_embeddings=True)),
                     "lm_head.weight differs from model.embed_tokens.weight", "--via-model", raw)
        same = dict(arr, **{"lm_head.weight": arr["model.embed_tokens.weight"]})
        r = inspect(case_dir("tiedsame", dict(cfg, tie_word_embeddings=True), same), "--via-model", raw)
        report(r.returncode == 0, "tied, with lm_head.weight the embedding (as written tied): read (%s)" % r.stderr.strip()[:200])
        bads = [
            ("num_key_value_heads", dict(cfg, num_key_value_heads=3), "num_key_value_heads: 3 does not divide"),
            ("num_key_value_heads above heads", dict(cfg, num_key_value_heads=8), "num_key_value_heads: 8 is outside"),
            ("rms_norm_eps", dict(cfg, rms_norm_eps=-1), "rms_norm_eps: -1 is outside"),
            ("rope_theta", dict(cfg, rope_theta="big"), "rope_theta: not a number"),
            ("hidden_size missing", {k: v for k, v in cfg.items() if k != "hidden_size"}, "hidden_size: missing"),
            ("num_attention_heads", dict(cfg, num_attention_heads=5), "num_attention_heads: 5 does not divide hidden_size"),
            ("intermediate_size", dict(cfg, intermediate_size=0), "intermediate_size: 0 is outside"),
            ("num_hidden_layers", dict(cfg, num_hidden_layers=2.5), "num_hidden_layers: not an integer"),
            ("vocab_size", dict(cfg, vocab_size=-3), "vocab_size: -3 is outside"),
            ("max_position_embeddings", dict(cfg, max_position_embeddings=0), "max_position_embeddings: 0 is outside"),
            ("rope_scaling type", dict(cfg, rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling: rope_type \"yarn\""),
            ("rope_scaling factors", dict(cfg, rope_scaling=dict(cfg["rope_scaling"], high_freq_factor=0.5)), "rope_scaling: high_freq_factor 0.5"),
            ("rope_scaling factor below 1", dict(cfg, rope_scaling=dict(cfg["rope_scaling"], factor=0.5)), "rope_scaling: factor 0.5 is below 1"),
            ("rope_scaling original", dict(cfg, rope_scaling={k: v for k, v in cfg["rope_scaling"].items()
                                                              if k != "original_max_position_embeddings"}),
             "rope_scaling: original_max_position_embeddings: missing"),
            ("tie_word_embeddings", dict(cfg, tie_word_embeddings="yes"), "tie_word_embeddings: not true or false"),
            ("torch_dtype", dict(cfg, torch_dtype="int8"), "torch_dtype: \"int8\""),
            ("head_dim", dict(cfg, head_dim=8), "head_dim: 8 is not"),
            ("model_type", dict(cfg, model_type="gpt2"), "model_type"),
            ("attention_bias", dict(cfg, attention_bias=True), "attention_bias"),
        ]
        for i, (name, c, needle) in enumerate(bads):
            d = os.path.join(w, f"badcfg{i}"); os.mkdir(d)
            write_config(d, c)
            np_write(os.path.join(d, "model.safetensors"), arr)
            expect_error(f"config {name}", d, "config.json: " + needle)
        d = os.path.join(w, "badjson"); os.mkdir(d)
        open(os.path.join(d, "config.json"), "w").write("{\"hidden_size\": 24,")
        expect_error("config not JSON", d, "config.json: malformed JSON")
        d = os.path.join(w, "nofiles"); os.mkdir(d)
        write_config(d, cfg)
        expect_error("no safetensors file", d, "neither model.safetensors nor model.safetensors.index.json")
        d = os.path.join(w, "badindex"); os.mkdir(d)
        write_config(d, cfg)
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {k: "../x.safetensors" for k in arr}}, f)
        expect_error("index naming a file outside the directory", d, "not a file name in the directory")
        d = os.path.join(w, "shortindex"); os.mkdir(d)
        write_config(d, cfg)
        np_write(os.path.join(d, "a.safetensors"), arr)
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {k: "a.safetensors" for k in arr if k != "model.norm.weight"}}, f)
        expect_error("tensor absent from the index", d, "model.norm.weight is missing")
        # 7. the trainer's flags: refusals that need no Llama model
        src = os.path.join(w, "np_f32")
        flag_cases = [
            ("--init-from-hf with a shape flag", ["--init-from-hf", src, "--layers", "2"],
             f"--init-from-hf takes the shape from {src}/config.json: drop --layers"),
            ("--init-from-hf with --model", ["--init-from-hf", src, "--model", "d12"], "drop --model"),
            ("--init-from-hf with a Llama shape flag", ["--init-from-hf", src, "--kv-heads", "2"], "drop --kv-heads"),
            ("--init-from-hf with --arch", ["--init-from-hf", src, "--arch", "llama"], "drop --arch"),
            ("--init-from-hf with --init-from", ["--init-from-hf", src, "--init-from", "x.bin"], "drop --init-from"),
            ("--init-from-hf with --resume", ["--init-from-hf", src, "--resume", "--ckpt-dir", os.path.join(w, "ck")],
             "--init-from-hf and --resume both give the starting weights"),
            ("--save-hf of a GPT-2", ["--save-hf", os.path.join(w, "gpt2_hf"), "--layers", "1", "--channels", "32", "--heads",
                                      "2", "--vocab", "64", "--seq-len", "16", "--steps", "0"],
             "--save-hf writes Hugging Face Llama checkpoints: this model is GPT-2"),
            ("--save-hf-dtype", ["--save-hf", os.path.join(w, "x"), "--save-hf-dtype", "fp16"], "--save-hf-dtype must be fp32 or bf16"),
            ("--init-from-hf of a directory without config.json", ["--init-from-hf", os.path.join(w, "nowhere")],
             "nowhere/config.json"),
        ]
        for name, args, needle in flag_cases:
            r = subprocess.run([TRAIN, *args], capture_output=True, text=True)
            lines = r.stderr.strip().splitlines()
            ok = r.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
            report(ok, f"train: {name}: exit {r.returncode}, {lines[0] if lines else '(no message)'}")
        r = subprocess.run([TRAIN, "eval", "--model", os.path.join(w, "deep"), "--val", "x.bin"], capture_output=True, text=True)
        report(r.returncode != 0 and "config.json: not a shape llm4d trains" in r.stderr,
               "train eval --model DIR with config.json reads it as a Hugging Face checkpoint")
    print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} check(s) failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
