#!/usr/bin/python3
"""Plots Trident metrics files (logging.metrics JSONL) into one PNG.

Usage: scripts/plot_metrics.py METRICS.jsonl [more.jsonl ...] [--out PNG] [--dump-json]

Four panels against the optimizer step: training loss (and validation loss, dashed),
learning rate, tokens/s and MFU. Several files overlay as separate runs, labelled by
file name (the parent directory is added when two files share a name). A dotted
vertical line marks each resume (a segment header after the first one).

Records (trainer/metrics.h): {"step","loss","lr","grad_norm","step_ms","tokens_per_s",
"mfu"} per step, {"step","val_loss"} per evaluation, {"summary": ...} at the end of a
run and {"segment": {"run_id","start_step","resumed_from","time","world_size"}} at the
start of each launch. A file appended across resumes can hold a step several times
(steps after the last checkpoint of a stopped launch are trained again): a segment that
starts at step S discards the earlier records of steps after S (trained again, or
abandoned by a rollback), so each step's record comes from the last segment that has
it (train and validation records separately).

--out PNG      where to write (default: metrics.png next to the first file)
--dump-json    also print the de-duplicated series as JSON on stdout:
               {"<file>": {"steps": [...], "loss": [...], "lr": [...],
                "tokens_per_s": [...], "mfu": [...], "val_steps": [...],
                "val_loss": [...], "resumes": [start_step, ...]}}
Needs matplotlib (Debian: python3-matplotlib; scripts/setup.sh installs it). Exit 0 done,
2 bad usage or an unreadable file (the message names it). A malformed line (e.g. the
last line of a killed run) is skipped with a warning naming the file and line.
"""

import argparse
import json
import os
import sys

SERIES = ("loss", "lr", "tokens_per_s", "mfu")


def load(path):
    """The de-duplicated series of one metrics file."""
    steps, evals, resumes = {}, {}, []
    segments = 0
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise SystemExit(f"plot_metrics: {path}: cannot open: {e.strerror}") from None
    with f:
        for lineno, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                print(f"plot_metrics: {path}:{lineno}: not JSON, skipped", file=sys.stderr)
                continue
            if not isinstance(rec, dict):
                continue
            if "segment" in rec:
                segments += 1
                if segments > 1 and isinstance(rec["segment"], dict):
                    start = int(rec["segment"].get("start_step", 0) or 0)
                    resumes.append(start)
                    # The launch continues from `start`: what an earlier launch logged
                    # after it was trained again or abandoned (a rollback), never kept.
                    steps = {k: v for k, v in steps.items() if k <= start}
                    evals = {k: v for k, v in evals.items() if k <= start}
            elif "step" in rec and "loss" in rec:
                steps[int(rec["step"])] = rec  # a later segment's record wins
            elif "step" in rec and "val_loss" in rec:
                evals[int(rec["step"])] = rec["val_loss"]
    order = sorted(steps)
    out = {"steps": order}
    for key in SERIES:
        out[key] = [steps[s].get(key) for s in order]
    out["val_steps"] = sorted(evals)
    out["val_loss"] = [evals[s] for s in out["val_steps"]]
    out["resumes"] = resumes
    return out


def labels(paths):
    names = [os.path.basename(p) for p in paths]
    return [os.path.join(os.path.basename(os.path.dirname(os.path.abspath(p))), n)
            if names.count(n) > 1 else n for p, n in zip(paths, names)]


def plot(runs, out_path):
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_metrics: needs matplotlib: install python3-matplotlib (scripts/setup.sh "
              "does)", file=sys.stderr)
        sys.exit(1)

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    panels = [("loss", "loss", axes[0][0]), ("lr", "learning rate", axes[0][1]),
              ("tokens_per_s", "tokens/s", axes[1][0]), ("mfu", "MFU (%)", axes[1][1])]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, series) in enumerate(runs):
        color = colors[i % len(colors)]
        for key, _, ax in panels:
            pts = [(s, v) for s, v in zip(series["steps"], series[key]) if v is not None]
            if key == "mfu":
                pts = [(s, 100.0 * v) for s, v in pts]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, color=color, label=label + (" train" if key == "loss" else ""),
                        linewidth=1.2)
            for r in series["resumes"]:
                ax.axvline(r, color=color, linestyle=":", linewidth=0.8)
        if series["val_steps"]:
            axes[0][0].plot(series["val_steps"], series["val_loss"], color=color,
                            linestyle="--", marker="o", markersize=3, label=label + " val")
    for _, title, ax in panels:
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def main(argv):
    parser = argparse.ArgumentParser(
        prog="plot_metrics.py",
        description="Plot Trident metrics JSONL files (loss, val loss, lr, tokens/s, MFU).")
    parser.add_argument("files", nargs="+", metavar="METRICS.jsonl")
    parser.add_argument("--out", metavar="PNG", help="output PNG (default: metrics.png next "
                        "to the first file)")
    parser.add_argument("--dump-json", action="store_true",
                        help="print the de-duplicated series as JSON on stdout")
    args = parser.parse_args(argv)  # bad usage: exit 2 with a message
    runs = [(label, load(p)) for label, p in zip(labels(args.files), args.files)]
    if all(not r["steps"] and not r["val_steps"] for _, r in runs):
        raise SystemExit("plot_metrics: no step records in " + ", ".join(args.files))
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.files[0])),
                                   "metrics.png")
    plot(runs, out)
    if args.dump_json:
        json.dump({label: r for label, r in runs}, sys.stdout)
        print()
    print(f"plot_metrics: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit as e:
        if isinstance(e.code, str):  # our error messages: bad input, exit 2
            print(e.code, file=sys.stderr)
            sys.exit(2)
        raise
