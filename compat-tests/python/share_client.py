"""A confluent-kafka ShareConsumer (KIP-932 share group member) for the compatibility tests.

    share_client.py member --spec '<JSON>'

It subscribes, polls and acknowledges as the spec says, and streams what happens as JSON lines
on stdout (one object per line, flushed at once), until EOF on stdin; then it commits what it
acknowledged, closes the consumer (which leaves the group) and exits. The test may instead kill
it with SIGKILL: a crash, no acknowledgement and no leave is sent. Diagnostics go to stderr.
The protocol of strand_compat_tests::share (compat-tests/src/lib.rs):

  {"ev": "subscribed", "t": ms, "client": "confluent-kafka ... (librdkafka ...)"}
  {"ev": "acquired", "t": ms, "records": [[partition, offset, delivery_count, "value"], ...]}
        a poll returned these records (t: just after it returned)
  {"ev": "acks_sent", "t": ms, "acks": [[partition, offset, "accept"|"release"|"reject"], ...]}
        just before the call that sends them (commit_sync; in implicit mode the next poll)
  {"ev": "ack_result", "t": ms, "partition": p, "offsets": [...], "error": null|"..."}
        the broker's answer, from the acknowledgement commit callback
  {"ev": "commit", "t": ms, "results": [[partition, null|"error"], ...]}   commit_sync returned
  {"ev": "holding", "t": ms, "records": [[partition, offset], ...]}
        records it keeps without acknowledging; it stops polling
  {"ev": "step_done", "t": ms, "records": n}   (stepped mode) a "poll" line was served
  {"ev": "error", "error": "..."}   {"ev": "note", "note": "..."}
  {"ev": "closed", "t": ms}          close() returned

Times are milliseconds since the Unix epoch (time.time()), the clock the test process uses too.

The spec (JSON object):
  bootstrap, group, topics: [names]
  config: {librdkafka property: value}, applied last
  mode: "explicit" (default) or "implicit" (share.acknowledgement.mode)
  actions: {"<partition>:<offset>": ["release", "accept", ...]}  (explicit mode) what to do with
        a record at its n-th delivery (delivery count n, 1-based); the last entry repeats
  default_action: "accept" (default), "release", "reject" or "hold" (never acknowledge)
  hold_from: {"<partition>": offset}  records at or after that offset default to "hold"
  commit: "sync" (default: commit_sync after acknowledging each poll's records) or "none"
        (acknowledge only; the acknowledgements go with the next poll or at close)
  max_polls: stop polling after this many polls that returned records (null: no limit)
  work_ms_per_record: sleep this long per record returned before acknowledging (default 0)
  poll_timeout_ms: poll timeout (default 100)
  stepped: false (default: poll continuously) or true: poll only when the test writes a line
        "poll" on stdin, until a poll returns records or step_timeout_ms (default 10000) passed
"""

import argparse
import json
import queue
import sys
import threading
import time

import confluent_kafka
from confluent_kafka import AcknowledgeType, ShareConsumer

ACK_TYPES = {"accept": AcknowledgeType.ACCEPT, "release": AcknowledgeType.RELEASE,
             "reject": AcknowledgeType.REJECT}


def _first(v):
    return v[0] if isinstance(v, tuple) else v


def client_name():
    return "confluent-kafka %s (librdkafka %s)" % (_first(confluent_kafka.version()),
                                                   _first(confluent_kafka.libversion()))


def now_ms():
    return time.time() * 1000.0


class Out:
    def __init__(self):
        self.lock = threading.Lock()

    def emit(self, doc):
        with self.lock:
            sys.stdout.write(json.dumps(doc) + "\n")
            sys.stdout.flush()


def member(args):
    spec = json.loads(args.spec)
    out = Out()
    stop = threading.Event()
    steps = queue.Queue()

    def read_stdin():
        for line in sys.stdin:
            steps.put(line.strip())
        stop.set()
        steps.put(None)
    threading.Thread(target=read_stdin, daemon=True).start()

    mode = spec.get("mode", "explicit")
    actions = spec.get("actions", {})
    default_action = spec.get("default_action", "accept")
    commit = spec.get("commit", "sync")
    max_polls = spec.get("max_polls")
    work_s = spec.get("work_ms_per_record", 0) / 1000.0
    poll_timeout = spec.get("poll_timeout_ms", 100) / 1000.0
    hold_from = {int(p): o for p, o in spec.get("hold_from", {}).items()}
    stepped = spec.get("stepped", False)
    step_timeout = spec.get("step_timeout_ms", 10000) / 1000.0
    if mode not in ("explicit", "implicit"):
        raise SystemExit("bad mode %r" % mode)
    if mode == "implicit" and (actions or default_action != "accept"):
        raise SystemExit("actions need explicit mode")

    config = {
        "bootstrap.servers": spec["bootstrap"],
        "group.id": spec["group"],
        "share.acknowledgement.mode": mode,
        "broker.address.family": "v4",
        "error_cb": lambda e: out.emit({"ev": "error", "error": str(e)}),
    }
    config.update(spec.get("config", {}))
    consumer = ShareConsumer(config)

    def on_ack(offsets, exc):
        t = now_ms()
        for tp, offs in offsets.items():
            out.emit({"ev": "ack_result", "t": t, "partition": tp.partition,
                      "offsets": sorted(offs), "error": None if exc is None else str(exc)})
    consumer.set_acknowledgement_commit_callback(on_ack)
    consumer.subscribe(spec["topics"])
    out.emit({"ev": "subscribed", "t": now_ms(), "client": client_name()})

    def action_for(m):
        todo = actions.get("%d:%d" % (m.partition(), m.offset()))
        if not todo:
            start = hold_from.get(m.partition())
            return "hold" if start is not None and m.offset() >= start else default_action
        dc = m.delivery_count() or 1
        return todo[min(dc, len(todo)) - 1]

    def commit_sync():
        res = consumer.commit_sync(30.0)
        out.emit({"ev": "commit", "t": now_ms(),
                  "results": [[tp.partition, None if e is None else str(e)] for tp, e in res.items()]})

    polls = 0
    implicit_pending = []
    step_deadline = None
    while not stop.is_set() and (max_polls is None or polls < max_polls):
        if stepped and step_deadline is None:
            cmd = steps.get()
            if cmd is None:
                break
            if cmd != "poll":
                out.emit({"ev": "error", "error": "unknown step %r" % cmd})
                continue
            step_deadline = time.time() + step_timeout
        if implicit_pending:
            out.emit({"ev": "acks_sent", "t": now_ms(),
                      "acks": [[p, o, "accept"] for p, o in implicit_pending]})
            implicit_pending = []
        try:
            msgs = consumer.poll(poll_timeout)
        except Exception as e:  # reported; the test decides
            out.emit({"ev": "error", "error": "poll: %r" % e})
            time.sleep(0.1)
            continue
        t = now_ms()
        records = []
        for m in msgs:
            if m.error():
                out.emit({"ev": "error", "error": "message: %s" % m.error()})
            else:
                records.append(m)
        if not records:
            if step_deadline is not None and time.time() > step_deadline:
                out.emit({"ev": "step_done", "t": now_ms(), "records": 0})
                step_deadline = None
            continue
        polls += 1
        out.emit({"ev": "acquired", "t": t, "records": [
            [m.partition(), m.offset(), m.delivery_count(), (m.value() or b"").decode("utf-8", "replace")]
            for m in records]})
        if work_s > 0:
            time.sleep(work_s * len(records))
        if mode == "implicit":
            implicit_pending = [(m.partition(), m.offset()) for m in records]
            if step_deadline is not None:
                out.emit({"ev": "step_done", "t": now_ms(), "records": len(records)})
                step_deadline = None
            continue
        acks, held = [], []
        for m in records:
            a = action_for(m)
            if a == "hold":
                held.append([m.partition(), m.offset()])
            else:
                consumer.acknowledge(m, ACK_TYPES[a])
                acks.append([m.partition(), m.offset(), a])
        if acks:
            out.emit({"ev": "acks_sent", "t": now_ms(), "acks": acks})
            if commit == "sync":
                commit_sync()
        if step_deadline is not None:
            out.emit({"ev": "step_done", "t": now_ms(), "records": len(records)})
            step_deadline = None
        if held:
            out.emit({"ev": "holding", "t": now_ms(), "records": held})
            break
    if not stop.is_set():
        out.emit({"ev": "note", "note": "stopped polling"})
        stop.wait()
    if implicit_pending:
        out.emit({"ev": "acks_sent", "t": now_ms(),
                  "acks": [[p, o, "accept"] for p, o in implicit_pending]})
    if commit == "sync" or mode == "implicit":
        commit_sync()
    consumer.close()
    out.emit({"ev": "closed", "t": now_ms()})
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("member", help="a share group member streaming JSON-line events until EOF on stdin")
    m.add_argument("--spec", required=True, help="the member spec as JSON (see the module docstring)")
    args = p.parse_args()
    return member(args)


if __name__ == "__main__":
    sys.exit(main())
