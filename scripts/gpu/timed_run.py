#!/usr/bin/env python3
"""Runs one command for scripts/gpu_check.sh with a time limit, and writes its output
(stdout and stderr together) to a log with the seconds since the start on every line, so
a log shows where the time of a run went (CUDA context, communicators, first step).

    timed_run.py --log L.log [--timeout S] [--json R.json] [--mark NAME=REGEX ...]
                 [--maps M.txt --maps-at REGEX] -- CMD ARGS...

--mark NAME=REGEX   the time of the first output line matching REGEX, in R.json's "marks"
                    (null when no line matched)
--maps M.txt        the shared libraries the process has mapped (/proc/PID/maps), read
                    when a line first matches --maps-at (else just before it ends): which
                    libcudnn, libnccl, libcublasLt the run actually loaded
--timeout S         SIGTERM to the command's process group after S seconds, SIGKILL 5 s
                    later; the exit status is then 124, as coreutils' timeout gives

R.json: {"rc", "wall_s", "timed_out", "marks": {NAME: seconds or null}, "tail": [the
last lines]}. Exit status: the command's (128 + N when a signal N ended it), 124 on a
timeout, 127 when it cannot be started.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time


def mapped_libraries(pid):
    """Sorted paths of the shared objects mapped into process PID ([] when gone)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return []
    paths = set()
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and ".so" in parts[5]:
            paths.add(parts[5].strip())
    return sorted(paths)


def run(args):
    marks = {}
    for m in args.mark:
        name, sep, pattern = m.partition("=")
        if not sep or not name:
            print(f"timed_run: --mark {m}: expected NAME=REGEX", file=sys.stderr)
            return 2
        marks[name] = re.compile(pattern)
    maps_at = re.compile(args.maps_at) if args.maps_at else None
    found = {name: None for name in marks}
    tail = []
    start = time.monotonic()
    with open(args.log, "a", encoding="utf-8", errors="replace") as log:
        log.write(f"[{0.0:8.3f}] $ {' '.join(args.cmd)}\n")
        log.flush()
        try:
            proc = subprocess.Popen(args.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            log.write(f"[{0.0:8.3f}] timed_run: cannot start {args.cmd[0]}: {e.strerror}\n")
            result = {"rc": 127, "wall_s": 0.0, "timed_out": False, "marks": found,
                      "tail": [f"cannot start {args.cmd[0]}: {e.strerror}"]}
            write_json(args.json, result)
            return 127
        timed_out = threading.Event()

        def stop():
            timed_out.set()
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, None)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    return
                if wait is not None:
                    try:
                        proc.wait(wait)
                        return
                    except subprocess.TimeoutExpired:
                        pass

        timer = threading.Timer(args.timeout, stop) if args.timeout > 0 else None
        if timer:
            timer.daemon = True
            timer.start()
        maps_done = not args.maps
        for raw in proc.stdout:
            now = time.monotonic() - start
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            log.write(f"[{now:8.3f}] {line}\n")
            log.flush()
            tail = (tail + [line])[-args.tail:]
            for name, pattern in marks.items():
                if found[name] is None and pattern.search(line):
                    found[name] = round(now, 3)
            if not maps_done and maps_at and maps_at.search(line):
                write_maps(args.maps, proc.pid)
                maps_done = True
        if not maps_done:  # no matching line: what is mapped as the output ends
            write_maps(args.maps, proc.pid)
        proc.stdout.close()
        rc = proc.wait()
        if timer:
            timer.cancel()
        wall = time.monotonic() - start
        if timed_out.is_set():
            rc = 124
            log.write(f"[{wall:8.3f}] timed_run: TIMEOUT after {args.timeout:g} s\n")
        elif rc < 0:
            rc = 128 - rc
        log.write(f"[{wall:8.3f}] timed_run: exit {rc}\n")
    write_json(args.json, {"rc": rc, "wall_s": round(wall, 3), "timed_out": timed_out.is_set(),
                           "marks": found, "tail": tail})
    return rc


def write_maps(path, pid):
    libs = mapped_libraries(pid)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(p + "\n" for p in libs)


def write_json(path, result):
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


def main(argv):
    if "--" not in argv:
        print("timed_run: expected -- CMD ARGS...", file=sys.stderr)
        return 2
    split = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log", required=True)
    ap.add_argument("--timeout", type=float, default=0)
    ap.add_argument("--json", default="")
    ap.add_argument("--mark", action="append", default=[])
    ap.add_argument("--maps", default="")
    ap.add_argument("--maps-at", default="")
    ap.add_argument("--tail", type=int, default=5)
    args = ap.parse_args(argv[:split])
    args.cmd = argv[split + 1:]
    if not args.cmd:
        print("timed_run: no command after --", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
