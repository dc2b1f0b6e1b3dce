#!/usr/bin/env python3
"""Compares the per-step losses of two `trident train` runs (their logging.metrics JSONL
files) for scripts/gpu_check.sh, and prints one verdict line: PASS or FAIL.

    compare_runs.py compare A.jsonl B.jsonl --steps 1-30 --bitwise
    compare_runs.py compare A.jsonl B.jsonl --steps 1-30 --max-rel 5e-4 --first-rel 1e-5
                    [--table DIFFS.tsv]
    compare_runs.py ckpt A/step_30 B/step_30
    compare_runs.py perturb IN.jsonl OUT.jsonl --step 17 --rel 1e-6

compare: both files must hold every step of --steps (a missing step is a FAIL naming it)
and only finite losses. Per step the last record wins (a resumed run appends a segment
that may repeat steps; scripts/plot_metrics.py reads the file the same way).
  --bitwise            loss and grad_norm identical to the bit (the JSON numbers are
                       written round-trip exact, so parsing them back is lossless)
  --max-rel X          max over steps of |a - b| / max(|a|, 1e-12) on the loss <= X
  --mean-rel X         mean of the same over steps <= X
  --first-rel X        the same at the first step of --steps (before any update) <= X
  --table FILE         also write every step's losses, gradient norms and relative loss
                       difference to FILE (tab-separated), to set tolerances from data
A tolerance comparison also prints the measured max/mean/first figures, so the limits
can be calibrated from a PASS as much as from a FAIL; a bitwise FAIL names the first
difference and how many steps differ.
ckpt: two checkpoint step directories hold the same tensors bit for bit: the same names,
shapes and dtypes and the same xxh3 checksum per stored box (manifest.json; `trident ckpt
verify` checks that the checksums match the bytes).
perturb: writes a copy of IN with the loss of one step scaled by (1 + rel): the dry run
uses it to show that the comparator fails on a real difference.

Exit codes: 0 PASS (or perturb done), 1 FAIL, 2 bad usage or unreadable input.
"""
import argparse
import json
import math
import struct
import sys


class InputError(Exception):
    pass


def read_steps(path):
    """{step: record} of the training-step records of a metrics JSONL file."""
    steps = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}")
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            # A run killed mid-write leaves a partial last line; anything else is corrupt.
            if number == len(lines):
                continue
            raise InputError(f"{path}:{number}: not JSON: {e.msg}")
        if isinstance(record, dict) and "step" in record and "loss" in record:
            steps[int(record["step"])] = record
    return steps


def parse_range(text):
    try:
        if "-" in text:
            lo, hi = text.split("-", 1)
            lo, hi = int(lo), int(hi)
        else:
            lo = hi = int(text)
    except ValueError:
        raise InputError(f"--steps {text}: expected N or A-B")
    if lo < 1 or hi < lo:
        raise InputError(f"--steps {text}: expected 1 <= A <= B")
    return list(range(lo, hi + 1))


def bits(x):
    return struct.pack("<d", float(x))


def rel_diff(a, b):
    return abs(a - b) / max(abs(a), 1e-12)


def compare(args):
    wanted = parse_range(args.steps)
    a, b = read_steps(args.a), read_steps(args.b)
    name = args.name or f"{args.a} vs {args.b}"
    for path, run in ((args.a, a), (args.b, b)):
        missing = [s for s in wanted if s not in run]
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
            print(f"FAIL {name}: {path} has no step {shown} ({len(missing)} of "
                  f"{len(wanted)} steps missing)")
            return 1
        for s in wanted:
            loss = run[s]["loss"]
            if not isinstance(loss, (int, float)) or not math.isfinite(loss):
                print(f"FAIL {name}: {path} step {s}: loss {loss} is not finite")
                return 1
    diffs = [rel_diff(a[s]["loss"], b[s]["loss"]) for s in wanted]
    if args.table:
        write_table(args.table, wanted, a, b, diffs)
    if args.bitwise:
        first, differing = None, 0
        for s in wanted:
            step_differs = False
            for key in ("loss", "grad_norm"):
                va, vb = a[s].get(key), b[s].get(key)
                if va is None or vb is None:
                    print(f"FAIL {name}: step {s} has no {key} in "
                          f"{args.a if va is None else args.b}")
                    return 1
                if bits(va) != bits(vb):
                    step_differs = True
                    if first is None:
                        first = (s, key, va, vb)
            differing += step_differs
        if first is not None:
            s, key, va, vb = first
            print(f"FAIL {name}: bitwise: step {s} {key} {va!r} vs {vb!r} "
                  f"(first difference; rel {rel_diff(va, vb):.3e}; {differing} of "
                  f"{len(wanted)} steps differ, max loss rel {max(diffs):.3e})")
            return 1
        print(f"PASS {name}: bitwise: steps {wanted[0]}-{wanted[-1]}, loss and grad_norm "
              f"identical")
        return 0
    worst = max(range(len(wanted)), key=lambda i: diffs[i])
    mean = sum(diffs) / len(diffs)
    figures = (f"max rel {diffs[worst]:.3e} at step {wanted[worst]}, mean rel {mean:.3e}, "
               f"first rel {diffs[0]:.3e}; final loss {a[wanted[-1]]['loss']:.6f} vs "
               f"{b[wanted[-1]]['loss']:.6f}")
    failed = []
    if args.max_rel is not None and diffs[worst] > args.max_rel:
        failed.append(f"max rel {diffs[worst]:.3e} > {args.max_rel:g}")
    if args.mean_rel is not None and mean > args.mean_rel:
        failed.append(f"mean rel {mean:.3e} > {args.mean_rel:g}")
    if args.first_rel is not None and diffs[0] > args.first_rel:
        failed.append(f"first rel {diffs[0]:.3e} > {args.first_rel:g}")
    if failed:
        print(f"FAIL {name}: {'; '.join(failed)} ({figures})")
        return 1
    print(f"PASS {name}: {figures}")
    return 0


def write_table(path, wanted, a, b, diffs):
    with open(path, "w", encoding="utf-8") as f:
        f.write("step\tloss_a\tloss_b\trel\tgrad_norm_a\tgrad_norm_b\n")
        for s, d in zip(wanted, diffs):
            f.write(f"{s}\t{a[s]['loss']!r}\t{b[s]['loss']!r}\t{d:.3e}\t"
                    f"{a[s].get('grad_norm')!r}\t{b[s].get('grad_norm')!r}\n")


def read_manifest(step_dir):
    path = f"{step_dir}/manifest.json"
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}")
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON: {e.msg}")
    tensors = manifest.get("tensors")
    if not isinstance(tensors, dict) or not tensors:
        raise InputError(f"{path}: no tensors")
    return {name: (t.get("dtype"), t.get("shape"),
                   [(tuple(b.get("start", [])), b.get("checksum")) for b in t.get("boxes", [])])
            for name, t in tensors.items()}


def ckpt(args):
    a, b = read_manifest(args.a), read_manifest(args.b)
    name = args.name or f"{args.a} vs {args.b}"
    if set(a) != set(b):
        only = sorted(set(a) ^ set(b))
        print(f"FAIL {name}: checkpoint tensors differ in names, e.g. {only[0]} "
              f"({len(only)} names in one only)")
        return 1
    for tensor in sorted(a):
        if a[tensor] != b[tensor]:
            print(f"FAIL {name}: checkpoint tensor {tensor} differs (dtype/shape/checksums "
                  f"{a[tensor][:2]} {a[tensor][2][:1]} vs {b[tensor][:2]} {b[tensor][2][:1]})")
            return 1
    print(f"PASS {name}: checkpoint: {len(a)} tensors bitwise identical")
    return 0


def perturb(args):
    try:
        with open(args.input, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise InputError(f"{args.input}: cannot read: {e.strerror}")
    done = False
    out = []
    for line in lines:
        record = json.loads(line) if line.strip() else None
        if isinstance(record, dict) and record.get("step") == args.step and "loss" in record:
            record["loss"] = record["loss"] * (1.0 + args.rel)
            line = json.dumps(record) + "\n"
            done = True
        out.append(line)
    if not done:
        raise InputError(f"{args.input}: no step {args.step} to perturb")
    with open(args.output, "w", encoding="utf-8") as f:
        f.writelines(out)
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--steps", required=True)
    c.add_argument("--name", default="")
    c.add_argument("--bitwise", action="store_true")
    c.add_argument("--max-rel", type=float)
    c.add_argument("--mean-rel", type=float)
    c.add_argument("--first-rel", type=float)
    c.add_argument("--table", default="")
    k = sub.add_parser("ckpt")
    k.add_argument("a")
    k.add_argument("b")
    k.add_argument("--name", default="")
    p = sub.add_parser("perturb")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--rel", type=float, required=True)
    args = ap.parse_args(argv)
    try:
        if args.command == "perturb":
            return perturb(args)
        if args.command == "ckpt":
            return ckpt(args)
        if not args.bitwise and args.max_rel is None and args.mean_rel is None \
                and args.first_rel is None:
            raise InputError("compare: give --bitwise or at least one of --max-rel, "
                             "--mean-rel, --first-rel")
        return compare(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
