#!/usr/bin/python3
"""check_layers.py: the #include "..." lines of the top-level sources against the layers of DESIGN.md.

    scripts/check_layers.py [DIR]     DIR: the repository root (default: this script's ../)

DESIGN.md ("Layers, bottom up") draws the sources as a one-way chain: each row may use the rows above
it only. LAYERS below is that table, file by file (including the files the open issues name, present
or not). Every .c, .h, .cu and .cuh in DIR is read (emu/ is the tests' emulated GPU, never linked into
./train, and test/ may include anything: neither is checked) and each violation is printed as one line:

    FILE includes HEADER: LAYER_A may not use LAYER_B     an include up the chain
    circle: a -> b -> a                                   modules that include each other
    FILE: in no layer (add it to LAYERS in scripts/check_layers.py and to DESIGN.md's table)
    FILE includes emu/HEADER: ...                         the emulated GPU is the tests' alone

A module is a file name without its extension (a.c, a.h and a.cu are module a; a .cuh is a module of
its own): a.c including b.h and b.c including a.h is a circle between a and b, though no header
includes itself. Includes are read
whatever #if surrounds them: a build option must not turn the chain around. Exit status 1 on any
violation, 0 (and one line saying so) when there is none.
"""
import os
import re
import sys

# DESIGN.md's table, bottom (may be used by all) to top. Row names are DESIGN.md's, shortened.
LAYERS = [
    ("common", "common.c common.h"),
    ("memory", "hostmem.c hostmem.h devmem.h"),
    ("kernels", "kernels.h kernels_cpu.c kernels.cu gemm.cu gemm.h attention.cu attention.h common.cuh"),
    # DESIGN.md's memory row, split: the counting allocator allocates through a kernels Backend, the
    # host reductions convert bf16 with the kernels' helpers, and the device-memory stand-in reduces
    # with them, so these three sit above the kernels (README, "What is where")
    ("accounting", "mem.c mem.h reduce.c reduce.h devmem_cpu.c"),
    # "emulated GPU" (emu/) sits here: tests only, not checked
    ("bootstrap", "sock.c sock.h bootstrap.c bootstrap.h"),  # DESIGN.md: "sockets, bootstrap"
    ("transports", "net.h net.c net_shm.c net_tcp.c net_verbs.c net_verbs.h net_ipc.cu"),
    ("algorithms", "algorithms.c algorithms.h"),
    ("collectives", "collectives.c collectives.h"),
    ("launch", "launch.c launch.h"),
    ("layout", "layout.c layout.h timing.h schedule.c schedule.h"),  # timing.h: one step's times, filled by every axis above
    ("model", "model.c model.h context.c context.h"),
    ("zero", "zero.c zero.h"),
    ("pipeline", "pipeline.c pipeline.h"),
    ("data", "data.c data.h tokenizer.c tokenizer.h prepare.c prepare.h"),
    ("ckpt", "ckpt.c ckpt.h safetensors.c safetensors.h hf.c hf.h"),
    ("plan", "plan.c"),
    # bench_comm.c is `./train bench-comm`, one of train's commands
    ("train", "train.c options.c options.h report.c report.h bench_comm.c"),
]
EXCLUDED_DIRS = ("emu", "test", "scripts", "build", "data")
SOURCE = re.compile(r".*\.(c|h|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def module(name):
    """a.c, a.h, a.cu: module a. A .cuh keeps its name: common.cuh (kernels) is not common.h's module
    (common), and a module never spans two rows."""
    base = os.path.basename(name)
    return base if base.endswith(".cuh") else base.split(".")[0]


def read_includes(root):
    """{file: [header, ...]} for the top-level sources of root (files only, not subdirectories)."""
    out = {}
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not SOURCE.match(name) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            out[name] = [m.group(1) for m in map(INCLUDE.match, f) if m]
    return out


def circles(edges):
    """Every elementary cycle of the module graph, each once, starting at its smallest module."""
    found = []
    for start in sorted(edges):
        # depth-first from start over modules greater than start: each cycle is found from its minimum
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges.get(node, ()), reverse=True):
                if nxt == start:
                    found.append(path + [start])
                elif nxt > start and nxt not in path:
                    stack.append((nxt, path + [nxt]))
    return sorted(found, key=lambda c: (len(c), c))


def check(root):
    rank = {}
    for i, (layer, files) in enumerate(LAYERS):
        for f in files.split():
            rank[f] = (i, layer)
    includes = read_includes(root)
    problems = []
    edges = {}
    for src in sorted(includes):
        if src not in rank:
            problems.append(f"{src}: in no layer (add it to LAYERS in scripts/check_layers.py and to DESIGN.md's table)")
            continue
        for hdr in includes[src]:
            if hdr.split("/")[0] == "emu":
                problems.append(f"{src} includes {hdr}: {rank[src][1]} may not use the emulated GPU (emu/ is for tests, never part of ./train)")
                continue
            if os.path.dirname(hdr) or hdr not in includes:
                continue  # not a top-level source (emu/..., a system header written with quotes)
            if hdr not in rank:
                continue  # reported once as a file of its own
            if rank[hdr][0] > rank[src][0]:
                problems.append(f"{src} includes {hdr}: {rank[src][1]} may not use {rank[hdr][1]}")
            if module(hdr) != module(src):
                edges.setdefault(module(src), set()).add(module(hdr))
    for c in circles(edges):
        problems.append("circle: " + " -> ".join(c))
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    if len(sys.argv) > 2 or not os.path.isdir(root):
        print("usage: scripts/check_layers.py [DIR]  (DIR: a repository root)")
        return 2
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layer violations (the chain is DESIGN.md's \"Layers\" table)")
        return 1
    print("layers: no circle, no include up the chain")
    return 0


if __name__ == "__main__":
    sys.exit(main())
