"""Shared helpers of the compatibility-test client scripts.

Records travel as JSON: bytes are lowercase hex strings, null is null.
  record to produce: {"partition": int, "key": hex|null, "value": hex|null,
                      "headers": [[name, hex|null], ...], "timestamp": ms|null}
  record read:       {"partition", "offset", "key", "value", "headers", "timestamp"}
A script prints exactly one JSON document on stdout; diagnostics go to stderr.
"""

import argparse
import json
import sys


def unhex(v):
    return None if v is None else bytes.fromhex(v)


def hexed(v):
    return None if v is None else bytes(v).hex()


def parse_args(description):
    p = argparse.ArgumentParser(description=description)
    sub = p.add_subparsers(dest="command", required=True)
    prod = sub.add_parser("produce", help="produce the records given as JSON on stdin (acks=all)")
    prod.add_argument("--bootstrap", required=True)
    prod.add_argument("--topic", required=True)
    prod.add_argument("--timeout", type=float, default=60.0)
    prod.add_argument("--idempotence", choices=["off", "on", "default"], default="off",
                      help="off: the suite's usual settings with idempotence disabled (the default); "
                           "on: enable idempotence, every other producer setting at the library's "
                           "default; default: every producer setting at the library's default")
    prod.add_argument("--chunk", type=int, default=0,
                      help="pause --pause-ms after every CHUNK records (0: no pauses), so that the "
                           "records travel in many produce requests")
    prod.add_argument("--pause-ms", type=float, default=0.0)
    cons = sub.add_parser("consume", help="read partitions with assign/seek from --start to --ends")
    cons.add_argument("--bootstrap", required=True)
    cons.add_argument("--topic", required=True)
    cons.add_argument("--start", type=int, required=True, help="first offset of every partition")
    cons.add_argument("--ends", required=True,
                      help="partition=end_offset,... ; reads offsets start..end-1 of each")
    cons.add_argument("--timeout", type=float, default=60.0)
    return p.parse_args()


def parse_ends(text):
    ends = {}
    for item in text.split(","):
        if not item:
            continue
        p, e = item.split("=")
        ends[int(p)] = int(e)
    return ends


def maybe_pause(args, sent, serve):
    """After every args.chunk records, let the client work for args.pause_ms (serve(seconds))."""
    if args.chunk > 0 and sent % args.chunk == 0:
        serve(args.pause_ms / 1000.0)


def read_input():
    return json.load(sys.stdin)


def emit(doc):
    json.dump(doc, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def consumed(partition, offset, key, value, headers, timestamp):
    return {
        "partition": partition,
        "offset": offset,
        "key": hexed(key),
        "value": hexed(value),
        "headers": [[k, hexed(v)] for (k, v) in (headers or [])],
        "timestamp": timestamp,
    }
