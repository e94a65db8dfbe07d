"""Shared helpers of the compatibility-test client scripts.

Records travel as JSON: bytes are lowercase hex strings, null is null.
  record to produce: {"partition": int, "key": hex|null, "value": hex|null,
                      "headers": [[name, hex|null], ...], "timestamp": ms|null}
  record read:       {"partition", "offset", "key", "value", "headers", "timestamp"}
A script prints exactly one JSON document on stdout; diagnostics go to stderr.

Except the `group` command: a consumer-group member that streams events as JSON lines on stdout
and stops at EOF on stdin (the protocol of strand_compat_tests::group, see GroupMember below):
  {"ev": "assigned", "partitions": [...]}          whole current assignment, after each change
  {"ev": "records", "records": [[p, offset, "value"], ...]}
  {"ev": "committed", "offsets": [[p, next_offset], ...]}
  {"ev": "commit_failed", "offsets": [...], "error": "..."}
  {"ev": "error", "error": "..."}   {"ev": "note", "note": "..."}   {"ev": "closed"}
Its --spec is a JSON object: {"bootstrap", "group", "topic", "config": {name: value},
"commit_interval_ms", "freeze_commits_after": int|null}.
"""

import argparse
import json
import sys
import threading
import time


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
    grp = sub.add_parser("group", help="a consumer-group member streaming JSON-line events until EOF on stdin")
    grp.add_argument("--spec", required=True, help="the member spec as JSON (see the module docstring)")
    sub.add_parser("groups-admin", help="group administration through the client's admin API; the "
                                        "operations come as JSON on stdin (see the client script)")
    sub.add_parser("cluster-admin", help="kafka-python: the admin client's cluster views (JSON on stdin)")
    sub.add_parser("authorized-operations", help="confluent-kafka: describes with authorized operations "
                                                 "(JSON on stdin)")
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


def partitions_to_read(args):
    """The `consume` command's partitions with records to read: partition -> end offset."""
    return {p: e for p, e in parse_ends(args.ends).items() if e > args.start}


def consume_to_ends(args, todo, poll, close, client):
    """The `consume` command once the partitions of `todo` (partition -> end offset) are assigned:
    reads until each reached its end, closes the consumer and prints the records with the
    `client` name. `poll()` returns the records read since its last call (consumed() documents),
    or None after an error that ends the read. Returns the exit code: 1 on such an error or
    after args.timeout (the consumer is not closed then)."""
    messages = []
    deadline = time.time() + args.timeout
    while todo:
        if time.time() > deadline:
            log("timed out; still expecting", todo, "read", len(messages))
            return 1
        got = poll()
        if got is None:
            return 1
        for m in got:
            messages.append(m)
            p = m["partition"]
            if p in todo and m["offset"] + 1 >= todo[p]:
                del todo[p]
    close()
    emit({"client": client, "messages": messages})
    return 0


def main(description, script):
    """Runs the command the command line names: the function of that name (`-` read as `_`) in
    `script`, a script's globals(); it takes the parsed arguments and returns the exit code."""
    args = parse_args(description)
    return script[args.command.replace("-", "_")](args)


def consumed(partition, offset, key, value, headers, timestamp):
    return {
        "partition": partition,
        "offset": offset,
        "key": hexed(key),
        "value": hexed(value),
        "headers": [[k, hexed(v)] for (k, v) in (headers or [])],
        "timestamp": timestamp,
    }


class GroupMember:
    """What both clients' group members share: the event stream, the stop signal (EOF on stdin),
    the bookkeeping of consumed-but-uncommitted offsets and the commit discipline of
    strand_compat_tests::group (commit every commit_interval_ms, on revocation, and on stop;
    nothing once freeze_commits_after records were consumed). A client supplies
    commit_offsets(dict partition -> next offset), raising on failure."""

    def __init__(self, spec):
        self.spec = spec
        self.topic = spec["topic"]
        self.pending = {}
        self.buffered = []
        self.consumed = 0
        self.frozen = False
        self.assignment = None
        self.out_lock = threading.Lock()
        self.stop = threading.Event()
        self.last_commit = time.time()
        self.last_flush = time.time()

        def wait_eof():
            sys.stdin.read()
            self.stop.set()
        threading.Thread(target=wait_eof, daemon=True).start()

    def emit(self, doc):
        with self.out_lock:
            sys.stdout.write(json.dumps(doc) + "\n")
            sys.stdout.flush()

    def flush_records(self):
        if self.buffered:
            self.emit({"ev": "records", "records": self.buffered})
            self.buffered = []

    def record(self, partition, offset, value):
        self.buffered.append([partition, offset, (value or b"").decode("utf-8", "replace")])
        self.pending[partition] = offset + 1
        self.consumed += 1
        limit = self.spec.get("freeze_commits_after")
        if limit is not None and self.consumed >= limit and not self.frozen:
            self.frozen = True
            self.flush_records()
            self.emit({"ev": "note", "note": "commits frozen"})

    def set_assignment(self, partitions):
        partitions = sorted(set(partitions))
        if partitions != self.assignment:
            self.flush_records()
            self.assignment = partitions
            self.emit({"ev": "assigned", "partitions": partitions})

    def assigned(self, partitions):
        """A rebalance callback: `partitions` (numbers) were added to the assignment."""
        self.set_assignment(set(self.assignment or []) | set(partitions))

    def revoked(self, partitions):
        """A rebalance callback: `partitions` (numbers) are given up; what was consumed of them
        is committed first."""
        gone = set(partitions)
        self.commit(gone)
        self.set_assignment(set(self.assignment or []) - gone)

    def lost(self, partitions):
        """A rebalance callback: `partitions` (numbers) were lost; nothing can be committed."""
        gone = set(partitions)
        for p in gone:
            self.pending.pop(p, None)
        self.set_assignment(set(self.assignment or []) - gone)

    def commit(self, only=None):
        self.flush_records()
        chosen = {p: o for p, o in self.pending.items() if only is None or p in only}
        if only is not None:
            for p in only:
                self.pending.pop(p, None)
        if self.frozen or not chosen:
            return
        pairs = [[p, o] for p, o in sorted(chosen.items())]
        try:
            self.commit_offsets(chosen)
        except Exception as e:  # reported; the test decides
            self.emit({"ev": "commit_failed", "offsets": pairs, "error": repr(e)})
            return
        for p, o in chosen.items():
            if self.pending.get(p) == o:
                del self.pending[p]
        self.emit({"ev": "committed", "offsets": pairs})

    def tick(self):
        """Called after every poll: flushes records every 20 ms, commits every interval."""
        now = time.time()
        if now - self.last_flush >= 0.02 or len(self.buffered) >= 500:
            self.flush_records()
            self.last_flush = now
        interval = self.spec.get("commit_interval_ms", 0) / 1000.0
        if interval > 0 and now - self.last_commit >= interval:
            self.commit()
            self.last_commit = time.time()

    def commit_offsets(self, offsets):
        raise NotImplementedError
