#!/usr/bin/env python3
# gloo_bench.py: PyTorch's gloo backend (torch.distributed, what PyTorch users on CPUs have) timed
# the way `./train bench-comm` and mpi_bench time theirs, for scripts/bench/compare_mpi.sh. Same
# flags, same sizes, same table: the slowest rank's mean time; algbw = bytes / time; busbw =
# algbw*2(n-1)/n for all-reduce, algbw*(n-1)/n for reduce-scatter and all-gather (bytes = the whole
# vector, n equal parts of at least one element). fp32. An op gloo lacks prints one comment line.
#   python3 gloo_bench.py --nproc N --op allreduce|reduce_scatter|all_gather [--min-bytes B] [--max-bytes B]
import argparse
import os
import socket
import sys
import time


def parse_bytes(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.rstrip("B").rstrip("i")
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def worker(rank, n, port, args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one core's worth per rank, as our ranks and MPI's use
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    parts = n if args.op in ("reduce_scatter", "all_gather") else 1
    bus = 2.0 * (n - 1) / n if args.op == "allreduce" else (n - 1) / n
    if rank == 0:
        print(f"# gloo_bench: {args.op}, {n} rank(s), torch {torch.__version__} gloo, fp32, warmup {args.warmup}, iters auto")
        print("# %14s %14s %12s %6s %10s %12s %12s %6s" % ("op", "bytes", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "check"))
        sys.stdout.flush()
    b = args.min_bytes
    while b <= args.max_bytes:
        count = max(b // 4 // parts * parts, parts)
        nbytes = count * 4
        seg = count // parts
        full = torch.zeros(count)
        part = torch.zeros(seg)
        out_parts = list(full.chunk(n)) if args.op == "all_gather" else None

        def run():
            if args.op == "allreduce":
                dist.all_reduce(full)
            elif args.op == "all_gather":
                dist.all_gather(out_parts, part)
            else:
                dist.reduce_scatter(part, list(full.chunk(n)))

        try:
            for _ in range(args.warmup):
                run()
        except RuntimeError as e:  # e.g. reduce_scatter, which gloo in torch 1.13 does not have
            if rank == 0:
                print(f"# gloo has no {args.op} here: {str(e).splitlines()[0]}")
            break
        # one checked run: rank r contributes r + 1
        full.fill_(rank + 1)
        part.fill_(rank + 1)
        run()
        if args.op == "allreduce":
            ok = bool((full == n * (n + 1) / 2).all())
        elif args.op == "all_gather":
            want = torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(seg)
            ok = bool((full == want).all())
        else:
            ok = bool((part == n * (n + 1) / 2).all())
        iters = args.iters or max(5, min(1000, (256 << 20) // nbytes))
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            run()
        mean = (time.perf_counter() - t0) / iters
        stat = torch.tensor([mean, 0.0 if ok else 1.0], dtype=torch.float64)
        dist.all_reduce(stat, op=dist.ReduceOp.MAX)
        if rank == 0:
            worst = stat[0].item()
            algbw = nbytes / worst / 1e9
            print("  %14s %14d %12d %6s %10.2f %12.3f %12.3f %6s" % (args.op, nbytes, count, "fp32", worst * 1e6, algbw,
                                                                     algbw * bus, "WRONG" if stat[1].item() else "ok"))
            sys.stdout.flush()
        if b > args.max_bytes // 2:
            break
        b *= 2
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--op", choices=["allreduce", "reduce_scatter", "all_gather"], default="allreduce")
    p.add_argument("--min-bytes", type=parse_bytes, default=8)
    p.add_argument("--max-bytes", type=parse_bytes, default=64 << 20)
    p.add_argument("--iters", type=int, default=0)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(worker, args=(args.nproc, port, args), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
