#!/usr/bin/python3
"""Checks a --pp-schedule-dump table (schedule.h's format) against the schedules' definitions computed
here, independently of schedule.c: each rank's F and B order is 1F1B's (test/pp_schedule.py; the
interleaved order with V > 1), each W comes after its B and a chunk's Ws run in micro-batch order, every
F past the first virtual stage receives its activation from the rank before and every B before the last
its gradient. With measured times (times ms): each rank's actions in order without overlap (a send, a
moment, inside the compute that posted it), and every
receive ends no earlier than its message was sent (the k-th send from q to r of a kind is the k-th
receive on r from q of that kind: one channel per direction and kind, in order).
Usage: schedule_dump_check.py DUMP [SAME_LISTS_DUMP]   (the second: a dump whose lists must be equal)"""
import ast
import sys

src = open("test/pp_schedule.py").read()
defs = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)]
exec(compile(ast.Module(body=defs, type_ignores=[]), "pp_schedule.py", "exec"))

COLS = ["rank", "index", "action", "mb", "chunk", "peer", "start", "end"]


def load(path):
    lines = open(path).read().splitlines()
    assert lines[0] == "# llm4d pipeline schedule dump 1", (path, lines[0])
    h = lines[1].split()
    assert h[0] == "#" and len(h) == 13, (path, lines[1])
    meta = dict(zip(h[1::2], h[2::2]))
    assert lines[2].split("\t") == COLS, lines[2]
    rows = []
    for ln in lines[3:]:
        f = ln.split("\t")
        assert len(f) == 8, ln
        rows.append(dict(rank=int(f[0]), index=int(f[1]), action=f[2], mb=int(f[3]), chunk=int(f[4]), peer=int(f[5]),
                         start=None if f[6] == "-" else float(f[6]), end=None if f[7] == "-" else float(f[7])))
    return meta, rows


def check(path):
    meta, rows = load(path)
    kind, P, M, V = meta["schedule"], int(meta["p"]), int(meta["m"]), int(meta["v"])
    ranks = [[x for x in rows if x["rank"] == r] for r in range(P)]
    assert sum(map(len, ranks)) == len(rows) and all(x["index"] == i for rk in ranks for i, x in enumerate(rk)), "ranks out of order"
    for r, acts in enumerate(ranks):
        fb = [f"{x['action']}{x['mb']}" + (f"c{x['chunk']}" if V > 1 else "") for x in acts if x["action"] in "FB"]
        if kind in ("1f1b", "zb-h1"):
            assert fb == one_f_one_b(P, M, r), (r, fb)
        elif kind == "interleaved":
            assert fb == interleaved(P, M, V, r), (r, fb)
        for c in range(V):
            ws = [x["mb"] for x in acts if x["action"] == "W" and x["chunk"] == c]
            assert ws == list(range(M)), (r, c, ws)
            for mb in range(M):
                pos = {a: [i for i, x in enumerate(acts) if x["action"] == a and x["mb"] == mb and x["chunk"] == c][0] for a in "FBW"}
                assert pos["F"] < pos["B"] < pos["W"], (r, c, mb, pos)
        # the hand-offs: one receive before each F past the first virtual stage, one before each B before the last
        for i, x in enumerate(acts):
            if x["action"] in ("recv-act", "recv-grad"):
                nxt = acts[i + 1]
                assert nxt["action"] == ("F" if x["action"] == "recv-act" else "B") and nxt["mb"] == x["mb"], (r, i)
    if meta["times"] == "ms":
        for r, acts in enumerate(ranks):
            assert all(x["start"] is not None and x["start"] <= x["end"] for x in acts), (r, "untimed or negative action")
            t = [(x["start"], x["end"]) for x in acts if not x["action"].startswith("send")]
            assert all(t[i][1] <= t[i + 1][0] for i in range(len(t) - 1)), (r, "actions overlap")
            for i, x in enumerate(acts):  # a send is posted by its F or B (the one before it), inside its time
                if x["action"].startswith("send"):
                    c = [y for y in acts[:i] if y["action"] == ("F" if x["action"] == "send-act" else "B")][-1]
                    assert c["mb"] == x["mb"] and c["start"] <= x["start"] <= c["end"], (r, i, "send outside its compute")
        for kind_ in ("act", "grad"):
            for q in range(P):
                for r in range(P):
                    sends = [x for x in ranks[q] if x["action"] == "send-" + kind_ and x["peer"] == r]
                    recvs = [x for x in ranks[r] if x["action"] == "recv-" + kind_ and x["peer"] == q]
                    assert len(sends) == len(recvs), (kind_, q, r)
                    for s, v in zip(sends, recvs):
                        assert s["mb"] == v["mb"], (kind_, q, r, s, v)
                        assert v["end"] >= s["start"], f"rank {r} received {kind_} {v['mb']} at {v['end']} ms before rank {q} sent it at {s['start']} ms"
    else:
        for x in rows:
            if x["action"] in "FBW":
                assert x["end"] - x["start"] == 1, x
    return meta, rows


meta, rows = check(sys.argv[1])
if len(sys.argv) > 2:
    _, other = check(sys.argv[2])
    key = lambda x: (x["rank"], x["index"], x["action"], x["mb"], x["chunk"], x["peer"])
    assert list(map(key, rows)) == list(map(key, other)), "the two dumps' action lists differ"
print(f"{sys.argv[1]}: {meta['schedule']} p {meta['p']} m {meta['m']} v {meta['v']}: {len(rows)} actions as defined"
      + (", measured times ordered and causal" if meta["times"] == "ms" else ""))
