#!/usr/bin/python3
"""llm4d against Hugging Face transformers' LlamaForCausalLM, through --init-from-hf and --save-hf.

A random tiny LlamaConfig with grouped-query attention (4 heads sharing 2 kv heads), Llama 3.1's RoPE
scaling, an untied head and a vocabulary that is not a multiple of 128 (so llm4d pads it), its weights
drawn larger than transformers' initialisation (so that every tensor moves the logits), saved with
save_pretrained in fp32. Then:
  1. ./train --init-from-hf DIR trains 5 steps with --dump (step 0's logits and gradients), --log (each
     step's loss) and --save-hf OUT: step 0's batch, logits, loss and every parameter's gradient equal
     transformers' forward and autograd on the same sequences (fp32: logits and loss to 1e-5);
  2. ./train eval --model DIR (the initial weights) and --model OUT (the trained ones) print the loss of
     the first validation batch; transformers, loading each directory with from_pretrained, computes the
     same loss (1e-5);
  3. the trained checkpoint differs from the initial one (training moved it), and a run of no steps on
     two ranks (data-parallel with ZeRO-1; two pipeline stages; TP 2) writes back the initial tensors bit for
     bit;
  4. a tied head (no lm_head.weight) with 8 query heads on 1 kv head: eval's loss equals transformers', and
     --save-hf writes it back bit for bit, still tied.
transformers comes from scripts/deps.sh's directory ($LLM4D_CACHE/py-transformers-4.49.0, the newest
release that runs on Debian's PyTorch 1.13); without it the test exits 77 (skipped) saying why.
Usage: hf_transformers.py ./train
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

TF_VERSION = "4.49.0"
TF_DIR = os.path.join(os.environ.get("LLM4D_CACHE", "/var/cache/llm4d"), "py-transformers-" + TF_VERSION)
sys.path.insert(0, TF_DIR)
try:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
except Exception as e:  # noqa: BLE001 (any import failure means: not installed here)
    print(f"transformers {TF_VERSION} is not importable from {TF_DIR} ({type(e).__name__}: {e}); "
          "scripts/deps.sh installs it")
    sys.exit(77)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_check import model_vector  # noqa: E402 (model.h's layout, assembled from HF tensors)

TRAIN = sys.argv[1] if len(sys.argv) > 1 else "./train"
B, T, STEPS = 2, 16, 5
failures = 0


def report(ok, what):
    global failures
    failures += not ok
    print(f"{'ok' if ok else 'FAIL'} {what}")


def run(args, what):
    r = subprocess.run([TRAIN, *args], capture_output=True, text=True)
    if r.returncode != 0:
        report(False, f"{what}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
        sys.exit(1)
    return r.stdout


def write_shard(path, tokens):
    """llm.c's token shard: 256 int32 header (magic 20240520, version 1, count), uint16 tokens"""
    h = np.zeros(256, np.int32)
    h[0], h[1], h[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(h.tobytes())
        f.write(np.asarray(tokens, np.uint16).tobytes())


def hf_loss(model, x, y):
    logits = model(input_ids=torch.from_numpy(x).long()).logits
    return logits, torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).long().reshape(-1))


def close(a, b, tol=1e-5):
    """|a - b| <= tol * max(1, |b|) everywhere (fp32 agreement)"""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= tol * np.maximum(1.0, np.abs(b))))


def eval_loss(model_dir, shard, what):
    out = run(["eval", "--model", model_dir, "--val", shard, "--batches", "1", "--micro-batch", str(B), "--seq-len", str(T)], what)
    line = [l for l in out.splitlines() if l.startswith("eval ")]
    return float(line[0].split("loss ")[1].split()[0])


def main():
    torch.manual_seed(1234)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500000.0,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 16},
                      tie_word_embeddings=False, attention_bias=False, mlp_bias=False, torch_dtype="float32")
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, cfg.vocab_size, size=B * T * 8 + 1)
    with tempfile.TemporaryDirectory() as w:
        src, out, dump = os.path.join(w, "hf0"), os.path.join(w, "hf5"), os.path.join(w, "dump")
        model.save_pretrained(src, safe_serialization=True)
        shard = os.path.join(w, "tokens.bin")
        write_shard(shard, tokens)
        log = os.path.join(w, "log.jsonl")
        run(["--init-from-hf", src, "--train", shard, "--steps", str(STEPS), "--micro-batch", str(B), "--seq-len", str(T),
             "--lr", "1e-3", "--warmup", "0", "--schedule", "constant", "--dump", dump, "--log", log, "--save-hf", out],
            "train --init-from-hf --save-hf")
        # 1. step 0 against transformers on the same sequences
        tok = np.fromfile(os.path.join(dump, "tokens.bin"), np.int32).reshape(2, B, T)
        x, y = tok[0], tok[1]
        want_x = np.stack([tokens[j * T:j * T + T] for j in range(B)])
        want_y = np.stack([tokens[j * T + 1:j * T + T + 1] for j in range(B)])
        report(np.array_equal(x, want_x) and np.array_equal(y, want_y), "step 0's batch is windows 0..B-1 of the shard")
        model.zero_grad()
        logits, loss = hf_loss(model, x, y)
        loss.backward()
        got = np.fromfile(os.path.join(dump, "logits.bin"), np.float32).reshape(B, T, cfg.vocab_size)
        ref = logits.detach().numpy()
        report(close(got, ref), f"step 0 logits equal transformers' (max |diff| {np.abs(got - ref).max():.2e})")
        steps = [json.loads(l) for l in open(log) if '"loss"' in l]
        l0 = steps[0]["loss"]
        report(abs(l0 - loss.item()) <= 1e-5 * loss.item(), f"initial loss {l0:.7f} equals transformers' {loss.item():.7f}")
        grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
        gcfg = {"num_hidden_layers": cfg.num_hidden_layers, "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
                "tie_word_embeddings": False}
        gwant = model_vector(gcfg, grads)
        ggot = np.fromfile(os.path.join(dump, "grads.bin"), np.float32)
        scale = np.abs(gwant).max()
        report(ggot.shape == gwant.shape and np.abs(ggot - gwant).max() <= 1e-5 * scale,
               f"step 0's gradient of every parameter equals transformers' autograd (max |diff| "
               f"{np.abs(ggot - gwant).max() if ggot.shape == gwant.shape else float('nan'):.2e}, max |grad| {scale:.2e})")
        report(len(steps) == STEPS, f"{len(steps)} steps logged")
        # 2. eval: llm4d and transformers on the initial and the trained checkpoint
        vx, vy = want_x, want_y  # eval's batch 0: the same windows
        for d, what in ((src, "initial"), (out, f"after {STEPS} steps")):
            mine = eval_loss(d, shard, f"eval --model {what}")
            m = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")
            with torch.no_grad():
                ref = hf_loss(m, vx, vy)[1].item()
            report(abs(mine - ref) <= 1e-5 * ref + 1e-6, f"{what}: ./train eval's loss {mine:.6f} equals transformers' "
                   f"{ref:.7f} on the loaded checkpoint")
        trained = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
        moved = [n for n, p in trained.named_parameters() if not torch.equal(p, dict(model.named_parameters())[n])]
        report(len(moved) == len(list(model.parameters())), f"training moved all {len(moved)} tensors of the saved checkpoint")
        # 3. two ranks, no steps: --save-hf gathers every rank's slice (ZeRO-1's shards, the pipeline's stages,
        # the tensor-parallel slices: a query-head half and one kv head each)
        for layout in (["--zero", "1"], ["--pp", "2"], ["--tp", "2"]):
            back = os.path.join(w, "hf_" + layout[0].strip("-"))
            run(["--nproc", "2", *layout, "--init-from-hf", src, "--steps", "0", "--micro-batch", str(B), "--seq-len", str(T),
                 "--save-hf", back], f"train --nproc 2 {' '.join(layout)} --steps 0 --save-hf")
            again = LlamaForCausalLM.from_pretrained(back, torch_dtype=torch.float32)
            same = all(torch.equal(p, dict(model.named_parameters())[n]) for n, p in again.named_parameters())
            report(same, f"2 ranks ({' '.join(layout)}), no steps: --save-hf writes the initial tensors back bit for bit")
        # 4. a tied head (tie_word_embeddings: no lm_head.weight in the file), plain RoPE, 8 heads on 1 kv head
        tcfg = LlamaConfig(vocab_size=131, hidden_size=32, intermediate_size=40, num_hidden_layers=1, num_attention_heads=8,
                           num_key_value_heads=1, max_position_embeddings=32, rms_norm_eps=1e-6, rope_theta=10000.0,
                           tie_word_embeddings=True, torch_dtype="float32")
        tcfg._attn_implementation = "eager"
        tied = LlamaForCausalLM(tcfg).float()
        with torch.no_grad():
            for name, p in tied.named_parameters():
                p.copy_((1.0 if "norm" in name else 0.0) + 0.2 * torch.randn_like(p))
        tdir, tout = os.path.join(w, "tied"), os.path.join(w, "tied_out")
        tied.save_pretrained(tdir, safe_serialization=True)
        tshard = os.path.join(w, "tied_tokens.bin")
        write_shard(tshard, rng.integers(0, tcfg.vocab_size, size=B * T * 4 + 1))
        ttok = np.fromfile(tshard, np.uint16, offset=1024).astype(np.int64)
        tx = np.stack([ttok[j * T:j * T + T] for j in range(B)])
        ty = np.stack([ttok[j * T + 1:j * T + T + 1] for j in range(B)])
        mine = eval_loss(tdir, tshard, "eval --model (tied)")
        with torch.no_grad():
            ref = hf_loss(tied, tx, ty)[1].item()
        report(abs(mine - ref) <= 1e-5 * ref + 1e-6, f"tied head, 8 heads / 1 kv head: ./train eval's loss {mine:.6f} equals "
               f"transformers' {ref:.7f}")
        run(["--init-from-hf", tdir, "--steps", "0", "--micro-batch", str(B), "--seq-len", str(T), "--save-hf", tout],
            "train --init-from-hf (tied) --steps 0 --save-hf")
        again = LlamaForCausalLM.from_pretrained(tout, torch_dtype=torch.float32)
        report(all(torch.equal(p, dict(tied.named_parameters())[n]) for n, p in again.named_parameters()) and
               again.config.tie_word_embeddings, "tied head: --save-hf writes the tensors back bit for bit, still tied")
    print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} check(s) failed (transformers {transformers.__version__}, "
          f"torch {torch.__version__})")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
