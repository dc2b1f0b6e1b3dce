#!/usr/bin/env python3
"""The one-way layering of the source folders, checked from #include lines.

Every folder is one library, and a folder may include headers only from itself and from the
folders below it:

    core < kernels < comm < parallel < model < {checkpoint, data} < config < plan < trainer < cli

checkpoint and data are siblings: neither may include the other. tests/ may include anything;
bench/ anything but tests/ (a benchmark builds from the libraries alone). Backend subfolders are private to their folder: a header in kernels/cpu/ or
kernels/cuda/ is included only from kernels/ (and bench/, tests/), one in comm/mpi/ or
comm/nccl/ only from comm/, and a backend never includes a sibling backend (kernels/cuda sees
core and kernels only). System headers of a backend (<mpi.h>, <cuda_runtime.h>, <nccl.h>, ...)
appear only in that backend's folder and in tests/.

No folder (a backend subfolder counts as its own) holds more than MAX_SHARE (20%) of the
non-test C++ lines (.h/.cpp/.cu/.cuh of the library folders and bench/): a folder that grows
past it is split. The report prints every folder's share.

Usage:
    check_layering.py [--root DIR]   print the include-edge table and the line shares; exit 1
                                     naming file:line and the edge of every violation and each
                                     folder over its share, 0 when there is none
    check_layering.py --self-test    check a small fake tree with known bad edges (proves the
                                     check can fail); exit 0 when every one is reported
"""

import argparse
import io
import os
import re
import sys
import tempfile

# Folder -> rank; a folder may include a folder of lower rank. Equal ranks are siblings.
RANKS = {
    "core": 0,
    "kernels": 1,
    "comm": 2,
    "parallel": 3,
    "model": 4,
    "checkpoint": 5,
    "data": 5,
    "config": 6,
    "plan": 7,
    "trainer": 8,
    "cli": 9,
}
UNRESTRICTED = ("bench", "tests")
# Backend subfolders, private to their parent folder.
BACKENDS = ("kernels/cpu", "kernels/cuda", "comm/mpi", "comm/nccl")
# System headers only a backend (and tests) may include: regex -> allowed folder prefixes.
SYSTEM_HEADERS = [
    (re.compile(r"^mpi\.h$"), ("comm/mpi",)),
    (re.compile(r"^(cuda|cublas|cudnn|curand|cuda_runtime|cuda_bf16|cuda_fp16)\w*\.h$"),
     ("kernels/cuda", "comm/nccl")),
    (re.compile(r"^nccl\.h$"), ("comm/nccl",)),
]
SOURCE_EXTENSIONS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
# The line-share rule: the files it counts, and the most of them one folder may hold.
SHARE_EXTENSIONS = (".h", ".cpp", ".cu", ".cuh")
MAX_SHARE = 0.20
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def part_of(path):
    """The layer a repository-relative path belongs to: a folder, or a backend subfolder."""
    for backend in BACKENDS:
        if path.startswith(backend + "/"):
            return backend
    return path.split("/", 1)[0]


def folder_of(part):
    return part.split("/", 1)[0]


def edge_problem(src_part, dst_part):
    """Why src_part may not include a header of dst_part, or None when it may."""
    src, dst = folder_of(src_part), folder_of(dst_part)
    if src == "bench" and dst == "tests":
        return "bench/ may not include tests/ (move the helper to a library or into bench/)"
    if src in UNRESTRICTED:
        return None
    if dst_part in BACKENDS and src_part != dst_part:
        if src != dst:
            return f"{dst_part}/ is private to {dst}/ (use the {dst}/ interface)"
        if src_part in BACKENDS:
            return f"backend {src_part}/ may not include sibling backend {dst_part}/"
    if src == dst:
        return None
    if dst in UNRESTRICTED:
        return f"{dst}/ is not a library"
    if RANKS[dst] == RANKS[src]:
        return f"{src}/ and {dst}/ are siblings"
    if RANKS[dst] > RANKS[src]:
        return f"{dst}/ is above {src}/"
    return None


def scan(root):
    """Yields (file, line number, source part, include kind, included path)."""
    top = set(RANKS) | set(UNRESTRICTED)
    for folder in sorted(top):
        base = os.path.join(root, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCE_EXTENSIONS):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                with open(full, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE_RE.match(line)
                        if m:
                            yield rel, number, part_of(rel), m.group(1), m.group(2)


def check(root):
    """Returns (edges {(src part, dst part): count}, violations [(file, line, message)])."""
    edges = {}
    violations = []
    for rel, number, src_part, kind, included in scan(root):
        edges.setdefault((src_part, src_part), 0)  # every part gets a row in the table
        if kind == "<":
            for pattern, allowed in SYSTEM_HEADERS:
                if pattern.match(included) and folder_of(src_part) not in UNRESTRICTED and \
                        not any(src_part == a for a in allowed):
                    violations.append((rel, number, f"{src_part} -> <{included}>: only "
                                       f"{', '.join(a + '/' for a in allowed)} may include it"))
            continue
        first = included.split("/", 1)[0]
        if "/" not in included or first not in RANKS and first not in UNRESTRICTED:
            continue  # a header of the same folder by bare name, or a third-party one
        dst_part = part_of(included)
        key = (src_part, dst_part)
        edges[key] = edges.get(key, 0) + 1
        problem = edge_problem(src_part, dst_part)
        if problem:
            violations.append((rel, number, f"{src_part} -> {dst_part} ({included}): {problem}"))
    return edges, violations


def line_shares(root):
    """{part: lines} of the non-test C++ files (SHARE_EXTENSIONS) of every library folder and
    bench/, a backend subfolder counted as its own part."""
    lines = {}
    for folder in sorted(set(RANKS) | {"bench"}):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SHARE_EXTENSIONS):
                    continue
                full = os.path.join(dirpath, name)
                part = part_of(os.path.relpath(full, root).replace(os.sep, "/"))
                with open(full, encoding="utf-8", errors="replace") as f:
                    lines[part] = lines.get(part, 0) + sum(1 for _ in f)
    return lines


def share_violations(lines):
    """[(part, share)] of every part holding more than MAX_SHARE of the lines."""
    total = sum(lines.values())
    if total == 0:
        return []
    return [(part, n / total) for part, n in sorted(lines.items()) if n / total > MAX_SHARE]


def print_shares(lines, out=sys.stdout):
    total = sum(lines.values())
    print(f"non-test C++ lines per folder ({total} in all; at most {MAX_SHARE:.0%} each)", file=out)
    for part, n in sorted(lines.items(), key=lambda e: (-e[1], e[0])):
        share = n / total if total else 0.0
        mark = " !" if share > MAX_SHARE else ""
        print(f"  {part:13} {n:6d} {share:6.1%}{mark}", file=out)
    over = share_violations(lines)
    for part, share in over:
        print(f"  {part}/ holds {share:.1%} of the non-test C++ lines, more than "
              f"{MAX_SHARE:.0%}: split it", file=out)
    return over


def print_report(edges, violations, out=sys.stdout):
    order = list(RANKS) + list(UNRESTRICTED)

    def sort_key(part):
        folder = folder_of(part)
        return (order.index(folder) if folder in order else len(order), part)

    print("include edges between layers (from -> to: #include lines)", file=out)
    for src in sorted({s for s, _ in edges}, key=sort_key):
        if folder_of(src) in UNRESTRICTED:
            continue
        row = []
        for (s, d), n in sorted(edges.items(), key=lambda e: sort_key(e[0][1])):
            if s == src and d != src:
                mark = "" if edge_problem(s, d) is None else " !"
                row.append(f"{d}({n}){mark}")
        print(f"  {src:13} -> {' '.join(row) if row else '(nothing)'}", file=out)
    if violations:
        print(f"{len(violations)} layering violation(s):", file=out)
        for rel, number, message in violations:
            print(f"  {rel}:{number}: {message}", file=out)
    else:
        print("layering: ok (core < kernels < comm < parallel < model < {checkpoint, data} "
              "< config < plan < trainer < cli)", file=out)


def self_test():
    """A fake tree with one file per rule; every bad edge must be reported, no good one."""
    files = {
        "core/status.h": "",
        "kernels/ops.h": '#include "core/status.h"\n',
        "kernels/cpu/cpu_kernels.h": '#include "kernels/ops.h"\n',
        "kernels/cuda/attention.cu": '#include "kernels/ops.h"\n'
                                     '#include "comm/communicator.h"\n'  # bad: above
                                     '#include "kernels/cpu/cpu_kernels.h"\n'  # bad: sibling
                                     '#include <cuda_runtime.h>\n',
        "comm/communicator.h": '#include "core/status.h"\n',
        "comm/mpi/mpi_communicator.cpp": '#include "comm/communicator.h"\n#include <mpi.h>\n',
        "parallel/data_parallel.h": '#include "comm/communicator.h"\n'
                                    '#include "model/param_store.h"\n',  # bad: above
        "model/param_store.h": '#include "parallel/data_parallel.h"\n'
                               '#include "kernels/ops.h"\n',
        "model/transformer.cpp": "#include <mpi.h>\n",  # bad: MPI outside comm/mpi
        "checkpoint/writer.h": '#include "data/loader.h"\n',  # bad: siblings
        "data/loader.h": '#include "core/status.h"\n',
        "trainer/trainer.cpp": '#include "checkpoint/writer.h"\n#include "data/loader.h"\n'
                               '#include "kernels/cpu/cpu_kernels.h"\n'  # bad: backend
                               '#include "comm/mpi/mpi_communicator.h"\n',  # bad: backend
        "config/config.h": '#include "model/param_store.h"\n'
                           '#include "plan/plan.h"\n',  # bad: above
        "plan/plan.h": '#include "config/config.h"\n',
        "cli/main.cpp": '#include "trainer/trainer.h"\n#include "plan/plan.h"\n',
        "tests/common/mpi_main.cpp": '#include "comm/mpi/mpi_communicator.h"\n#include <mpi.h>\n',
        "bench/bench_model.cpp": '#include "kernels/cpu/cpu_kernels.h"\n'
                                 '#include "trainer/trainer.h"\n'
                                 '#include "tests/kernels/forwarding_ops.h"\n',  # bad: tests
    }
    expected = {
        ("kernels/cuda/attention.cu", 2),
        ("kernels/cuda/attention.cu", 3),
        ("parallel/data_parallel.h", 2),
        ("model/transformer.cpp", 1),
        ("checkpoint/writer.h", 1),
        ("trainer/trainer.cpp", 3),
        ("trainer/trainer.cpp", 4),
        ("config/config.h", 2),
        ("bench/bench_model.cpp", 3),
    }
    with tempfile.TemporaryDirectory() as root:
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        edges, violations = check(root)
        print_report(edges, violations)
        found = {(rel, number) for rel, number, _ in violations}
        ok = found == expected
        for missing in sorted(expected - found):
            print(f"self-test: NOT reported: {missing[0]}:{missing[1]}")
        for extra in sorted(found - expected):
            print(f"self-test: wrongly reported: {extra[0]}:{extra[1]}")
        # Each message names the edge.
        for rel, number, message in violations:
            if " -> " not in message:
                print(f"self-test: message for {rel}:{number} does not name the edge")
                ok = False
        # A tree with only good edges passes.
        for rel, number in expected:
            path = os.path.join(root, rel)
            with open(path) as f:
                lines = f.readlines()
            lines[number - 1] = "\n"
            with open(path, "w") as f:
                f.writelines(lines)
        _, after = check(root)
        if after:
            print(f"self-test: the cleaned tree still has {len(after)} violation(s)")
            ok = False
        ok = share_self_test(root) and ok
    print("self-test: " + ("ok, every bad edge and share reported" if ok else "FAILED"))
    return 0 if ok else 1


def share_self_test(root):
    """On the fake tree: even shares pass; a folder grown past MAX_SHARE is named, with its
    share, and a backend subfolder is a folder of its own."""
    ok = True

    def write(rel, lines):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("// line\n" * lines)

    # Ten parts of 10 lines each (10% apiece), beside the fake tree's few lines.
    for part in ("core", "kernels", "kernels/cuda", "comm", "parallel", "model", "data",
                 "config", "plan", "trainer"):
        write(f"{part}/filler.h", 10)
    write("tests/core/huge_test.cpp", 1000)  # tests do not count
    write("data/readme.txt", 1000)           # nor do other files
    lines = line_shares(root)
    if lines.get("kernels/cuda", 0) < 10 or lines.get("data", 0) > 100 or "tests" in lines:
        print(f"self-test: wrong line counts {lines}")
        ok = False
    if share_violations(lines):
        print(f"self-test: even shares wrongly reported: {share_violations(lines)}")
        ok = False
    write("plan/filler.cpp", 40)  # plan/: 50 of the ~150 lines
    out = io.StringIO()
    over = print_shares(line_shares(root), out)
    print(out.getvalue(), end="")
    if [part for part, _ in over] != ["plan"]:
        print(f"self-test: plan/ over its share not reported alone: {over}")
        ok = False
    if not re.search(r"plan/ holds \d+\.\d% of the non-test C\+\+ lines", out.getvalue()):
        print("self-test: the share message does not name the folder and its share")
        ok = False
    os.remove(os.path.join(root, "plan/filler.cpp"))
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."),
                        help="repository root (default: the one holding this script)")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    root = os.path.abspath(args.root)
    edges, violations = check(root)
    print_report(edges, violations)
    over = print_shares(line_shares(root))
    return 1 if violations or over else 0


if __name__ == "__main__":
    sys.exit(main())
