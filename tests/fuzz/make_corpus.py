#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/ (checked in; rerun after a format change).

Each seed is a well-formed input of its fuzzer's script format (see the comment at the top of
fuzz_store.cpp and fuzz_net_descriptor.cpp), so fuzzing starts from messages that pass the
parsers' checks and mutates from there.
Usage: make_corpus.py [OUT_DIR]   (default: tests/fuzz/corpus next to this file)
"""

import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

# --- store: steps 0 open, 1 open+hello, 2 feed, 3 hang up ------------------------------------
SET, GET, TRYGET, WAIT, ADD, CAS, DEL, LIST, DELPREFIX = range(1, 10)


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<I", len(b)) + b


def frame(payload):
    return struct.pack("<I", len(payload)) + payload


def req(op, seq, body=b""):
    return frame(struct.pack("<BQ", op, seq) + body)


def open_auth(conn_id_byte=1):
    return bytes([1, conn_id_byte])


def feed(conn, data):
    assert len(data) < 65536
    return bytes([2, conn]) + struct.pack("<H", len(data)) + data


def i64(v):
    return struct.pack("<q", v)


store = {
    "all_ops": open_auth()
    + feed(0, req(SET, 1, s("k") + s("v")) + req(GET, 2, s("k") + i64(0)) + req(TRYGET, 3, s("k"))
           + req(TRYGET, 4, s("missing")) + req(ADD, 5, s("n") + i64(3)) + req(ADD, 6, s("k") + i64(1))
           + req(CAS, 7, s("k") + s("v") + s("w")) + req(CAS, 8, s("new") + s("") + s("x"))
           + req(WAIT, 9, struct.pack("<I", 2) + s("k") + s("n") + i64(0)) + req(LIST, 10, s(""))
           + req(DEL, 11, s("k")) + req(DELPREFIX, 12, s("n"))),
    "park_and_wake": open_auth(1) + open_auth(2)
    + feed(0, req(GET, 1, s("a") + i64(100000)) + req(SET, 2, s("after") + s("1")))
    + feed(1, req(SET, 1, s("a") + s("x")))
    + feed(0, req(WAIT, 3, struct.pack("<I", 2) + s("b") + s("c") + i64(100000)))
    + feed(1, req(SET, 2, s("b") + s("")) + req(DEL, 3, s("b")) + req(SET, 4, s("c") + s("")))
    + bytes([3, 0]),
    "replay_same_seq": open_auth(7)
    + feed(0, req(ADD, 5, s("ctr") + i64(1)) + req(ADD, 5, s("ctr") + i64(1)) + req(SET, 6, s("x") + s("y"))),
    "timeout_zero": open_auth() + feed(0, req(GET, 1, s("never") + i64(0)) + req(WAIT, 2, struct.pack("<I", 1) + s("z") + i64(-5))),
    "http_probe": bytes([0]) + feed(0, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
    "hello_bad_version": bytes([0]) + feed(0, frame(struct.pack("<III", 0x31525453, 1, 0) + s(b"n" * 32) + s(b"p" * 32))),
    "hello_wrong_proof": bytes([0]) + feed(0, frame(struct.pack("<II", 0x31525453, 2) + struct.pack("<Q", 9)
                                                    + s(b"c" * 32) + s(b"x" * 32))),
    "oversized_frame": open_auth() + feed(0, struct.pack("<I", 0xFFFFFFF0) + b"abc"),
    "pending_flood": bytes([0, 0, 0, 0, 0, 1, 3]) + feed(5, req(SET, 1, s("k") + s("v"))),
    "malformed_request": open_auth() + feed(0, frame(b"\x01") + req(77, 1)),
}

# --- net descriptor: mode byte, then this rank's call, then the peer's bytes ------------------
KINDS = ["AllReduce", "Reduce", "Broadcast", "AllGather", "AllGatherV", "ReduceScatter", "ReduceScatterV",
         "AllToAll", "AllToAllV", "Gather", "Scatter", "Barrier"]
OPKIND = {"AllReduce": 0, "Reduce": 1, "Broadcast": 2, "AllGather": 3, "AllGatherV": 4, "ReduceScatter": 5,
          "ReduceScatterV": 6, "AllToAll": 7, "AllToAllV": 8, "Gather": 9, "Scatter": 10, "Barrier": 11}
HAS_COUNT = lambda k: k not in ("AllGatherV", "ReduceScatterV", "AllToAllV", "Barrier")
ESZ = [1, 1, 4, 4, 8, 8, 2, 2, 4, 8]


def first_message(kind, n=2, me=0, r=1, dtype=8, rop=0, root=0, count=4, counts=None, algo=5, eager=False,
                  flags=0, out_off=0, vec=None, peer_count=None):
    counts = counts or [1] * n
    call = bytes([0, KINDS.index(kind), dtype, rop, n - 2, me, r, root, count])
    for c in counts:
        call += bytes([c, c])  # counts[j], rcounts[j]
    call += bytes([algo, 1 if eager else 0, 1])  # algo, eager flag, length = bytes that follow (+ eager)
    desc = struct.pack("<IBBBBiIQIIQQ", 7, OPKIND[kind], dtype, rop, algo, root, flags,
                       (count if peer_count is None else peer_count) if HAS_COUNT(kind) else 0, 0, 1, 0, out_off)
    if vec is not None:
        desc += b"".join(struct.pack("<Q", v) for v in vec)
    return call + desc


def rkey_record(base, key):
    return (struct.pack("<QI", base, len(key)) + key).hex().encode()


net = {
    "all_reduce_eager": first_message("AllReduce", algo=4, eager=True),
    "all_reduce_direct_heap": first_message("AllReduce", algo=5, flags=2 | 16, out_off=4096),
    "broadcast_root": first_message("Broadcast", n=4, me=2, r=0, root=0, algo=6),
    # The root's input offered for reading on its host (kInHeap), and the same flag from a rank
    # that is not the root (refused).
    "broadcast_root_in_heap": first_message("Broadcast", n=4, me=2, r=0, root=0, algo=6, flags=1 | 512),
    "broadcast_in_heap_not_root": first_message("Broadcast", n=4, me=0, r=2, root=0, algo=6, flags=1 | 512),
    # A rank that found the previous operation mismatched (kLateMismatch).
    "late_mismatch": first_message("AllReduce", algo=4, eager=True, flags=256),
    "all_gather_v": first_message("AllGatherV", n=3, me=1, r=2, counts=[1, 2, 3], vec=[1, 2, 3]),
    "all_to_all_v": first_message("AllToAllV", n=2, counts=[2, 3], vec=[2, 2]),
    "barrier": first_message("Barrier", n=5, me=4, r=1, algo=5),
    "mismatch_count": first_message("ReduceScatter", count=9, peer_count=8),
    "p2p_header": bytes([1]) + struct.pack("<qQQ", 5, 8, 1024),
    "p2p_header_huge": bytes([1]) + struct.pack("<qQQ", 5, 4, 1 << 62),
    "rkey_ok": bytes([2]) + rkey_record(0x7F0000001000, bytes(range(40))),
    "rkey_truncated": bytes([2]) + rkey_record(0x1000, bytes(40))[:-8],
    "rkey_long_length": bytes([2]) + (struct.pack("<QI", 0, 1 << 30) + b"abcd").hex().encode(),
    "worker_address": bytes([3]) + bytes(range(64)).hex().encode(),
}

for name, seeds in (("store", store), ("net_descriptor", net)):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    for k, v in seeds.items():
        with open(os.path.join(d, k), "wb") as f:
            f.write(v)
    print(f"{d}: {len(seeds)} seeds")
