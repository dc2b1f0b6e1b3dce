#!/usr/bin/env python3
"""Normalises a cuDNN API log (CUDNN_LOGLEVEL_DBG=3) to the operation descriptors it
finalized: one block per cudnnBackendFinalize of an OPERATION_* descriptor (not the
operation graph), in call order, without times and pids, with tensor uids renamed U0, U1,
... by first appearance. tests/kernels/cuda/cudnn_graph_trace_test.cpp applies the same rules to
what Trident's graph builder makes and compares with the golden files this writes.

  normalize.py cudnn.log > golden.trace
"""
import re
import sys


def normalize(text):
    blocks = [b.strip("\n") for b in text.split("\n\n")]
    uids = {}
    out = []
    for b in blocks:
        lines = [re.sub(r"^[A-Za-z]! ", "", l).rstrip() for l in b.split("\n")]
        if len(lines) < 2 or "function cudnnBackendFinalize() called:" not in lines[0]:
            continue
        head = lines[1].strip()
        if not head.startswith("descriptor: type=CUDNN_BACKEND_OPERATION_"):
            continue
        if head.startswith("descriptor: type=CUDNN_BACKEND_OPERATIONGRAPH"):
            continue
        kept = []
        for l in lines[1:]:
            if "Time:" in l or "Process=" in l:
                continue
            m = re.search(r"uid: type=int64_t; val=(-?\d+);", l)
            if m:
                u = m.group(1)
                uids.setdefault(u, "U%d" % len(uids))
                l = l.replace("val=%s;" % u, "val=%s;" % uids[u])
            kept.append(l)
        out.append("\n".join(kept))
    return "=====\n".join(b + "\n" for b in out)


if __name__ == "__main__":
    sys.stdout.write(normalize(open(sys.argv[1]).read()))
