#!/usr/bin/python3
"""Independent writer of Megatron-LM indexed datasets (.bin/.idx) for Trident's tests.

Follows the layout of megatron/core/datasets/indexed_dataset.py (_IndexWriter), with
the standard library only (struct), no Trident code:
  .idx: b"MMIDIDX\\x00\\x00", <Q version 1, <B dtype code (DType: uint16 = 8, int32 = 4),
        <Q sequence count, <Q document count (len(document_indices)),
        int32 sequence lengths, int64 sequence pointers (byte offsets, accumulated
        from the lengths times the item size), int64 document indices (0, then the
        sequence count after each document).
  .bin: the tokens of every sequence, back to back.

Usage: megatron_writer.py TOKENS PREFIX [--dtype uint16|int32] [--seq-len N]
                          [--corrupt magic|version|dtype|truncate|pointer]
TOKENS is a file of little-endian uint32 token ids. The stream is cut into sequences of
--seq-len tokens (the last one shorter), two sequences per document (as
--split-sentences would). --corrupt writes a broken index on purpose:
  magic: the first byte of the magic is wrong; version: version 2; dtype: code 7
  (float32); truncate: the index loses its last 8 bytes; pointer: the last pointer
  points past the end of the .bin.
"""
import argparse
import struct

CODES = {"uint16": (8, "H", 2), "int32": (4, "i", 4)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokens")
    ap.add_argument("prefix")
    ap.add_argument("--dtype", default="uint16", choices=sorted(CODES))
    ap.add_argument("--seq-len", type=int, default=100)
    ap.add_argument("--corrupt", choices=["magic", "version", "dtype", "truncate", "pointer"])
    a = ap.parse_args()

    raw = open(a.tokens, "rb").read()
    ids = list(struct.unpack("<%dI" % (len(raw) // 4), raw))
    code, fmt, size = CODES[a.dtype]

    lengths = [len(ids[i:i + a.seq_len]) for i in range(0, len(ids), a.seq_len)]
    pointers, at = [], 0
    for n in lengths:
        pointers.append(at)
        at += n * size
    documents = [0] + [min(i + 2, len(lengths)) for i in range(0, len(lengths), 2)]

    with open(a.prefix + ".bin", "wb") as f:
        f.write(struct.pack("<%d%s" % (len(ids), fmt), *ids))

    if a.corrupt == "pointer":
        pointers[-1] = at + 1000
    idx = bytearray()
    idx += b"MMIDIDX\x00\x00" if a.corrupt != "magic" else b"XMIDIDX\x00\x00"
    idx += struct.pack("<Q", 2 if a.corrupt == "version" else 1)
    idx += struct.pack("<B", 7 if a.corrupt == "dtype" else code)
    idx += struct.pack("<Q", len(lengths))
    idx += struct.pack("<Q", len(documents))
    idx += struct.pack("<%di" % len(lengths), *lengths)
    idx += struct.pack("<%dq" % len(pointers), *pointers)
    idx += struct.pack("<%dq" % len(documents), *documents)
    if a.corrupt == "truncate":
        idx = idx[:-8]
    with open(a.prefix + ".idx", "wb") as f:
        f.write(bytes(idx))


if __name__ == "__main__":
    main()
