#!/usr/bin/python3
"""llm4d's pictures, drawn with matplotlib (Debian's python3-matplotlib; scripts/deps.sh installs it).

  scripts/plot.py RUN.jsonl [MORE.jsonl ...] -o OUT.png
      training logs (./train --log): loss and validation loss against steps and against tokens,
      tokens/s, and where the logs have them the pipeline bubble, the communication times and the
      memory per category. Several logs share the panels, one colour each.
  scripts/plot.py --plan PLAN.json -o OUT.png      (PLAN.json: ./train plan --json; '-' reads stdin)
      memory per GPU by category for each layout the planner can run, stacked bars in its order, the
      GPU memory marked; ./train plan --plot OUT.png calls this.

  scripts/plot.py --replay DUMP [MORE ...]
      no picture: for each --pp-schedule-dump table with measured times, each rank's bubble as
      measured (1 - its F, B and W time over the step's span) and as the same passes, in the same
      order, would give it with hand-offs that cost nothing (each receive ends when its send was
      posted; the hand-offs' own times may be '-', as in ./train schedule's unit-time dumps): the
      difference is what the hand-offs and waking up cost; the rest of the gap to the schedule's
      formula is the passes' own durations (stages of unequal cost). One line per table:
      "DUMP measured R0% R1% ... mean M% replayed R0% ... mean M%".

Log records it reads: {"step","loss","tokens","tokens_per_s", "bubble_max","bubble_mean",
"bubble_formula","comm_ms","exposed_comm_ms","tp_comm_ms","cp_comm_ms","cp_exposed_ms"} per step (and with PP
the per-rank lists "pp_busy_ms","pp_idle_ms","pp_wfill_ms", drawn per rank over the steps), {"step","val_loss"} per
validation, and any record with an object "memory..." of bytes per category (optionally with "rank"),
e.g. {"memory_peak":{"weights":..,"activations":..},"rank":0}. Fields a log lacks are left out.
Schedule dumps: the format schedule.h documents (two "# " header lines, a column line, then rank, index,
action, mb, chunk, peer, start, end tab-separated; start and end "-" where untimed).
Errors: one line "error: ..." on stderr, exit status 1; OUT is written whole or not at all.
"""
import json
import os
import sys


def fail(msg):
    print("error: " + msg, file=sys.stderr)
    sys.exit(1)


DEBIAN_PYTHON = "/usr/bin/python3"  # where Debian's python3-matplotlib is (scripts/deps.sh installs it)


def load_matplotlib():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        pass
    # `python3 scripts/plot.py` may run another interpreter than Debian's (a pyenv or venv python3 on
    # the PATH), one that does not see Debian's matplotlib: run this script again under Debian's
    here = os.path.realpath(sys.executable or "")
    if os.access(DEBIAN_PYTHON, os.X_OK) and here != os.path.realpath(DEBIAN_PYTHON) and \
            not os.environ.get("LLM4D_PLOT_REEXEC"):
        os.environ["LLM4D_PLOT_REEXEC"] = "1"
        os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])
    fail("scripts/plot.py needs matplotlib, which %s cannot import: install python3-matplotlib (scripts/deps.sh "
         "does, as root) and run it with %s" % (sys.executable or "this python", DEBIAN_PYTHON))


def read_log(path):
    steps, vals, mems = [], [], []
    try:
        f = open(path, encoding="utf-8", errors="replace")  # (a binary file: not a JSON line, below)
    except OSError as e:
        fail("cannot open %s: %s" % (path, e.strerror))
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                fail("%s:%d: not a JSON line" % (path, n))
            if not isinstance(r, dict):
                fail("%s:%d: not a JSON object" % (path, n))
            for k in ("loss", "val_loss", "grad_norm"):  # null: not finite (a skipped spike's NaN), a gap
                if k in r and r[k] is None:
                    r[k] = float("nan")
            if "loss" in r and "step" in r:
                steps.append(r)
            elif "val_loss" in r and "step" in r:
                vals.append(r)
            for k, v in r.items():
                if k.startswith("memory") and isinstance(v, dict):
                    mems.append((k, r.get("rank"), v))
    if not steps and not vals:
        fail("%s: no step or validation records" % path)
    return steps, vals, mems


def column(records, key):
    return [r[key] for r in records if key in r]


def has_nonzero(logs, key):
    return any(any(r.get(key, 0) for r in steps) for _, steps, _, _ in logs)


def save(fig, plt, out):
    tmp = out + ".tmp"
    try:
        fig.savefig(tmp, format="png", dpi=110)
        os.replace(tmp, out)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        fail("cannot write %s: %s" % (out, e.strerror))
    plt.close(fig)
    print("plot: wrote %s" % out, file=sys.stderr)  # stdout may carry the planner's JSON


def plot_logs(paths, out):
    plt = load_matplotlib()
    logs = [(os.path.basename(p),) + read_log(p) for p in paths]
    panels = ["loss_step", "loss_tokens", "throughput"]
    if has_nonzero(logs, "bubble_max") or has_nonzero(logs, "bubble_formula"):
        panels.append("bubble")
    # a single rank's exposed wait is timer noise: the panel is for runs whose DP, TP or CP groups talk
    if has_nonzero(logs, "comm_ms") or has_nonzero(logs, "tp_comm_ms") or has_nonzero(logs, "cp_comm_ms"):
        panels.append("comm")
    if any("pp_busy_ms" in r for _, steps, _, _ in logs for r in steps):
        panels.append("pp_ranks")
    if any(mems for _, _, _, mems in logs):
        panels.append("memory")
    rows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(13, 4 * rows), squeeze=False)
    axes = [a for row in axes for a in row]
    for a in axes[len(panels):]:
        a.axis("off")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, steps, vals, mems) in enumerate(logs):
        c = colors[i % len(colors)]
        s = column(steps, "step")
        tokens_at = {0: 0}
        for r in steps:
            if "tokens" in r:
                tokens_at[r["step"]] = r["tokens"]
        for p, ax in zip(panels, axes):
            if p == "loss_step":
                ax.plot(s, column(steps, "loss"), color=c, lw=1, label=name + " train")
                if vals:
                    ax.plot(column(vals, "step"), column(vals, "val_loss"), "o--", color=c, ms=4, label=name + " val")
            elif p == "loss_tokens":
                pts = [(tokens_at[r["step"]], r["loss"]) for r in steps if r["step"] in tokens_at]
                if pts:
                    ax.plot([t for t, _ in pts], [l for _, l in pts], color=c, lw=1, label=name + " train")
                vpts = [(tokens_at[r["step"]], r["val_loss"]) for r in vals if r["step"] in tokens_at]
                if vpts and len(tokens_at) > 1:
                    ax.plot([t for t, _ in vpts], [l for _, l in vpts], "o--", color=c, ms=4, label=name + " val")
                if len(tokens_at) == 1:
                    ax.text(0.5, 0.5, "no \"tokens\" field in the log", ha="center", transform=ax.transAxes)
            elif p == "throughput":
                ax.plot(s, column(steps, "tokens_per_s"), color=c, lw=1, label=name)
            elif p == "bubble":
                if not any(r.get("bubble_max", 0) or r.get("bubble_formula", 0) for r in steps):
                    continue  # no pipeline in this run
                for key, style in (("bubble_max", "-"), ("bubble_mean", ":"), ("bubble_formula", "--")):
                    ys = [100 * r.get(key, 0) for r in steps]
                    ax.plot(s, ys, style, color=c, lw=1, label="%s %s" % (name, key.split("_")[1]))
            elif p == "pp_ranks":  # busy (solid), idle (dashed), W-fill (dotted) per pipeline rank
                recs = [r for r in steps if "pp_busy_ms" in r]
                ranks = len(recs[0]["pp_busy_ms"]) if recs else 0
                for q in range(ranks):
                    for key, style in (("pp_busy_ms", "-"), ("pp_idle_ms", "--"), ("pp_wfill_ms", ":")):
                        ax.plot([r["step"] for r in recs], [r[key][q] for r in recs], linestyle=style,
                                color=colors[(i * ranks + q) % len(colors)], lw=1,
                                label="%s rank %d %s" % (name, q, key[3:-3].replace("wfill", "W-fill")))
            elif p == "comm":
                if not any(r.get("comm_ms", 0) or r.get("tp_comm_ms", 0) or r.get("cp_comm_ms", 0) for r in steps):
                    continue
                for key, style in (("comm_ms", "-"), ("exposed_comm_ms", "--"), ("tp_comm_ms", ":"), ("cp_comm_ms", "-."),
                                   ("cp_exposed_ms", (0, (1, 3)))):
                    if any(r.get(key, 0) for r in steps):
                        ax.plot(s, [r.get(key, 0) for r in steps], linestyle=style, color=c, lw=1,
                                label="%s %s" % (name, key[:-3].replace("_", " ")))
    titles = {
        "loss_step": ("loss", "step", "loss"),
        "loss_tokens": ("loss against tokens", "tokens", "loss"),
        "throughput": ("throughput", "step", "tokens/s"),
        "bubble": ("pipeline bubble (share of the step a stage waits)", "step", "%"),
        "comm": ("communication per step", "step", "ms"),
        "memory": ("memory per rank by category", "", "MiB"),
        "pp_ranks": ("pipeline ranks: busy, idle (the bubble), W-fill per step", "step", "ms"),
    }
    for p, ax in zip(panels, axes):
        if p == "memory":
            plot_memory_bars(ax, logs)
        t, xl, yl = titles[p]
        ax.set_title(t)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, plt, out)


def plot_memory_bars(ax, logs):
    bars = []
    for name, _, _, mems in logs:
        for key, rank, cats in mems:
            label = name if rank is None else "%s rank %s" % (name, rank)
            bars.append((label + "\n" + key, cats))
    cats = []
    for _, c in bars:
        for k in c:
            if k not in cats:
                cats.append(k)
    bottom = [0.0] * len(bars)
    for k in cats:
        h = [c.get(k, 0) / 2**20 for _, c in bars]
        ax.bar(range(len(bars)), h, bottom=bottom, label=k)
        bottom = [b + x for b, x in zip(bottom, h)]
    ax.set_xticks(range(len(bars)))
    # many ranks: rotated labels, so that neighbours never overlap
    many = len(bars) > 4
    ax.set_xticklabels([b.replace("\n", " ") if many else b for b, _ in bars], fontsize=6 if many else 7,
                       rotation=60 if many else 0, ha="right" if many else "center")


def plot_plan(path, out, max_bars=40):
    plt = load_matplotlib()
    try:
        plan = json.load(sys.stdin if path == "-" else open(path))
        layouts, inputs, model = plan["layouts"], plan["inputs"], plan["model"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail("%s: not a ./train plan --json document (%s)" % ("standard input" if path == "-" else path, e))
    runs = [y for y in layouts if y["runs"]]
    top = inputs.get("top") or 0  # ./train plan --top N: the same N layouts as its table
    shown = runs[:min(max_bars, top) if top else max_bars]
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(shown) + 3), 6))
    exact = inputs.get("exact", False)  # --exact: llm4d's own buffers on each layout's fullest stage
    if exact:
        cats = (("weights", "weights"), ("gradients", "gradients"), ("optimizer", "optimizer state"),
                ("activations", "activations"), ("recompute", "recompute scratch"), ("comm", "comm buffers"),
                ("other", "other"))
    else:
        cats = (("weights", "weights"), ("gradients", "gradients"), ("optimizer", "optimizer state"),
                ("activations_1f1b", "activations (1F1B)"))
    bottom = [0.0] * len(shown)
    for key, label in cats:
        h = [(y["exact"]["bytes"] if exact else y["bytes"])[key] / 1e9 for y in shown]
        ax.bar(range(len(shown)), h, bottom=bottom, label=label)
        bottom = [b + x for b, x in zip(bottom, h)]
    limit = inputs["gpu_mem_bytes"] / 1e9
    ax.axhline(limit, color="red", ls="--", lw=1.5, label="GPU memory %.4g GB" % limit)
    for i, y in enumerate(shown):
        ax.text(i, bottom[i], "%.0f%%" % (100 * y["bubble"]), ha="center", va="bottom", fontsize=7)
    if not shown:
        ax.text(0.5, 0.5, "no layout llm4d can run", ha="center", transform=ax.transAxes)
    ax.set_xticks(range(len(shown)))
    ax.set_xticklabels(["TP%d CP%d PP%d DP%d" % (y["tp"], y.get("cp", 1), y["pp"], y["dp"]) for y in shown], rotation=60,
                       ha="right", fontsize=8)
    ax.set_ylabel("GB per GPU (1e9 bytes)")
    more = "" if len(runs) == len(shown) else ", the first %d of %d" % (len(shown), len(runs))
    n = model["params"]
    count = "%.1f B" % (n / 1e9) if n >= 1e9 else "%.1f M" % (n / 1e6)
    ax.set_title("memory per GPU: L %d, C %d, %s parameters on %d GPUs, %d micro-batches, ZeRO-%d, recompute %s, %s\n"
                 "layouts llm4d can run, best first%s; the number above each bar is its bubble%s"
                 % (model["layers"], model["channels"], count, inputs["gpus"], inputs["micro_batches"], inputs["zero"],
                    inputs["recompute"], inputs["dtype"], more, "; llm4d's own buffers (--exact)" if exact else ""),
                 fontsize=9)
    ax.set_ylim(0, max([limit] + bottom) * 1.12)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save(fig, plt, out)
    print("plot: %d layout(s): %s" % (len(shown), ", ".join(t.get_text() for t in ax.get_xticklabels())), file=sys.stderr)


SCHEDULE_COLS = ["rank", "index", "action", "mb", "chunk", "peer", "start", "end"]
SCHEDULE_PASSES = ("F", "B", "W")  # the compute; the rest are hand-offs
SCHEDULE_ACTIONS = SCHEDULE_PASSES + ("send-act", "recv-act", "send-grad", "recv-grad")
SCHEDULE_COLORS = {"F": "#3b6fb6", "B": "#e08a2e", "W": "#3f9b57"}  # tests look for these pixels


def read_schedule(path):
    """A --pp-schedule-dump table: (meta, rows), or one line of error naming the file and line."""
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        fail("cannot open %s: %s" % (path, e.strerror))
    except UnicodeDecodeError:
        fail("%s: not a text file" % path)
    if not lines or lines[0] != "# llm4d pipeline schedule dump 1":
        fail("%s:1: not a --pp-schedule-dump table (expected '# llm4d pipeline schedule dump 1')" % path)
    h = lines[1].split() if len(lines) > 1 else []
    meta = dict(zip(h[1::2], h[2::2]))
    if len(h) != 13 or h[0] != "#" or any(k not in meta for k in ("schedule", "p", "m", "v", "split", "times")):
        fail("%s:2: expected '# schedule NAME p P m M v V split S times unit|ms'" % path)
    try:
        P, M, V = int(meta["p"]), int(meta["m"]), int(meta["v"])
    except ValueError:
        fail("%s:2: p, m and v must be integers" % path)
    if len(lines) < 3 or lines[2].split("\t") != SCHEDULE_COLS:
        fail("%s:3: expected the column line '%s'" % (path, "\\t".join(SCHEDULE_COLS)))
    rows = []
    for n, ln in enumerate(lines[3:], 4):
        f = ln.split("\t")
        if len(f) != 8:
            fail("%s:%d: expected 8 tab-separated fields, got %d" % (path, n, len(f)))
        try:
            r, idx, mb, ch, peer = int(f[0]), int(f[1]), int(f[3]), int(f[4]), int(f[5])
            t0 = None if f[6] == "-" else float(f[6])
            t1 = None if f[7] == "-" else float(f[7])
        except ValueError:
            fail("%s:%d: rank, index, mb, chunk, peer must be integers and start, end numbers or '-'" % (path, n))
        if f[2] not in SCHEDULE_ACTIONS:
            fail("%s:%d: unknown action '%s'" % (path, n, f[2]))
        if not 0 <= r < P or not 0 <= ch < V or not 0 <= mb < M:
            fail("%s:%d: rank, chunk or micro-batch outside p %d, v %d, m %d" % (path, n, P, V, M))
        if (t0 is None) != (t1 is None) or (t0 is not None and t1 < t0):
            fail("%s:%d: start and end must both be given, end not before start" % (path, n))
        rows.append((r, idx, f[2], mb, ch, peer, t0, t1))
    if not any(x[2] in SCHEDULE_COLORS and x[6] is not None for x in rows):
        fail("%s: no timed F, B or W action to draw" % path)
    return meta, rows


def replay_schedule(rows):
    """Each rank's bubble as measured and as replayed with free hand-offs: two lists, rank order.
    A send is posted at its time in the rank's compute (the replayed clock: as far before the end of the
    pass that posted it as it was measured, since a B on the head's chunk sends before the head's weight
    gradient); the k-th receive on r from q of a kind ends no earlier than the k-th such send from q to r
    (one channel per direction and kind)."""
    ranks = sorted({x[0] for x in rows})
    acts = {r: sorted((x for x in rows if x[0] == r), key=lambda x: x[1]) for r in ranks}
    busy = {r: sum(x[7] - x[6] for x in acts[r] if x[2] in SCHEDULE_PASSES) for r in ranks}
    timed = [x for x in rows if x[6] is not None]
    span = max(x[7] for x in timed) - min(x[6] for x in timed)
    sent, taken = {}, {}
    pos, clock = {r: 0 for r in ranks}, {r: 0.0 for r in ranks}
    pass_end = {r: None for r in ranks}  # the measured end of the rank's last pass
    while any(pos[r] < len(acts[r]) for r in ranks):
        moved = False
        for r in ranks:
            while pos[r] < len(acts[r]):
                _, _, act, _, _, peer, t_start, t_end = acts[r][pos[r]]
                if act.startswith("recv-"):
                    key = (act[5:], peer, r)
                    k = taken.get(key, 0)
                    if len(sent.get(key, [])) <= k:
                        break
                    clock[r] = max(clock[r], sent[key][k])
                    taken[key] = k + 1
                elif act.startswith("send-"):
                    early = pass_end[r] - t_start if t_start is not None and pass_end[r] is not None else 0.0
                    sent.setdefault((act[5:], r, peer), []).append(clock[r] - max(early, 0.0))
                else:
                    clock[r] += t_end - t_start
                    pass_end[r] = t_end
                pos[r] += 1
                moved = True
        if not moved:
            fail("the schedule's receives wait for sends that never come (a deadlock in the dump)")
    replay_span = max(clock.values())
    return ([1 - busy[r] / span for r in ranks] if span > 0 else [0.0] * len(ranks),
            [1 - busy[r] / replay_span for r in ranks] if replay_span > 0 else [0.0] * len(ranks))


def replay_schedules(paths):
    pct = lambda v: " ".join("%.2f%%" % (100 * x) for x in v) + " mean %.2f%%" % (100 * sum(v) / len(v))
    for path in paths:
        meta, rows = read_schedule(path)
        if any(x[6] is None for x in rows if x[2] in SCHEDULE_PASSES):
            fail("%s: untimed passes ('-'): --replay needs a dump with times" % path)
        measured, replayed = replay_schedule(rows)
        print("%s measured %s replayed %s" % (path, pct(measured), pct(replayed)))


def plot_schedules(paths, out):
    plt = load_matplotlib()
    dumps = [(p, *read_schedule(p)) for p in paths]
    heights = [max(1.6, 0.45 * int(meta["p"]) + 1.1) for _, meta, _ in dumps]
    fig, axes = plt.subplots(len(dumps), 1, figsize=(13, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (path, meta, rows) in zip([a for row in axes for a in row], dumps):
        P, V, unit = int(meta["p"]), int(meta["v"]), meta["times"]
        t_min = min(x[6] for x in rows if x[6] is not None)
        span = max(x[7] for x in rows if x[7] is not None) - t_min
        for q in range(P):
            busy = 0.0
            for r, _, act, mb, ch, _, t0, t1 in rows:
                if r != q or act not in SCHEDULE_COLORS or t0 is None or t1 <= t0:
                    continue  # hand-offs and 1f1b's merged W (its B holds it) are not drawn: the wait is idle
                busy += t1 - t0
                ax.barh(q, t1 - t0, left=t0 - t_min, height=0.8, color=SCHEDULE_COLORS[act], alpha=1.0 if ch == 0 else 0.55,
                        edgecolor="white", linewidth=0.4)
                if (t1 - t0) > span / 90:  # the micro-batch where it fits
                    ax.text((t0 + t1) / 2 - t_min, q, str(mb), ha="center", va="center", fontsize=6, color="white")
            ax.text(span * 1.005, q, "%.0f%% busy" % (100 * busy / span if span else 0), va="center", fontsize=7)
        ax.set_ylim(P - 0.5, -0.5)  # rank 0 on top, as in the paper's figures
        ax.set_yticks(range(P))
        ax.set_yticklabels(["rank %d" % q for q in range(P)], fontsize=8)
        ax.set_xlim(0, span * 1.08 if span else 1)
        ax.set_xlabel("ms from the step's start (measured)" if unit == "ms" else "time (F = B = W = 1 unit)")
        merged = "" if meta["split"] == "1" else "; B holds its W (one backward)"
        ax.set_title("%s: %s, p %s, m %s%s%s" % (os.path.basename(path), meta["schedule"], meta["p"], meta["m"],
                                                 ", v %d (lighter: second chunk)" % V if V > 1 else "", merged), fontsize=9)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in SCHEDULE_COLORS.values()]
        ax.legend(handles, list(SCHEDULE_COLORS), fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3,
                  frameon=False)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    save(fig, plt, out)


def main(argv):
    out, plan, logs, schedules, replay = None, None, [], False, False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(__doc__)
            return
        if a in ("-o", "--plan"):
            if i + 1 >= len(argv):
                fail("%s needs a value" % a)
            if a == "-o":
                out = argv[i + 1]
            else:
                plan = argv[i + 1]
            i += 2
            continue
        if a == "--schedule":
            schedules = True
            i += 1
            continue
        if a == "--replay":
            replay = True
            i += 1
            continue
        if a.startswith("-") and a != "-":
            fail("unknown flag %s (see scripts/plot.py --help)" % a)
        logs.append(a)
        i += 1
    if replay:
        if plan or out or schedules or not logs:
            fail("--replay takes one or more --pp-schedule-dump tables and nothing else")
        replay_schedules(logs)
        return
    if not out:
        fail("-o OUT.png is required")
    if plan and logs:
        fail("--plan takes one planner document and no logs")
    if schedules:
        if plan or not logs:
            fail("--schedule takes one or more --pp-schedule-dump tables and no --plan")
        plot_schedules(logs, out)
    elif plan:
        plot_plan(plan, out)
    elif logs:
        plot_logs(logs, out)
    else:
        fail("nothing to plot: give one or more JSONL logs, or --plan PLAN.json")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (TypeError, KeyError, IndexError, ValueError, RecursionError) as e:
        # mostly a record of the right keys with values of another shape (a hand-edited log): one line
        fail("cannot plot the input, a record of an unexpected shape? (%s: %s)" % (type(e).__name__, e))
