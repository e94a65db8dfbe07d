"""kafka-python (pure Python) client for the compatibility tests; see common.py for the I/O."""

import sys
import time

import kafka
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

import common


def client_name():
    return "kafka-python %s" % kafka.__version__


def produce(args):
    records = common.read_input()["records"]
    if args.idempotence == "off":
        config = dict(
            acks="all",
            enable_idempotence=False,
            linger_ms=5,
            retries=5,
            max_in_flight_requests_per_connection=1,
            request_timeout_ms=int(args.timeout * 1000),
        )
    elif args.idempotence == "on":
        config = dict(enable_idempotence=True)
    else:
        # kafka-python 3.0 enables idempotence by default (acks=all, retries unbounded, 5 in flight).
        config = {}
    producer = KafkaProducer(bootstrap_servers=args.bootstrap, **config)
    futures = []
    for i, r in enumerate(records):
        futures.append(producer.send(
            args.topic,
            value=common.unhex(r["value"]),
            key=common.unhex(r["key"]),
            headers=[(k, common.unhex(v)) for k, v in r["headers"]],
            partition=r["partition"],
            timestamp_ms=r.get("timestamp"),
        ))
        common.maybe_pause(args, i + 1, time.sleep)
    producer.flush(timeout=args.timeout)
    results = []
    for f in futures:
        try:
            md = f.get(timeout=args.timeout)
            results.append({"partition": md.partition, "offset": md.offset})
        except Exception as e:  # reported per record; the caller fails the test
            results.append({"error": repr(e)})
    idempotent = bool(producer.config["enable_idempotence"])
    producer_id = None
    tm = getattr(producer, "_transaction_manager", None)
    if tm is not None:
        producer_id = tm.producer_id_and_epoch.producer_id
    producer.close()
    common.emit({"client": client_name(), "results": results,
                 "enable_idempotence": idempotent, "producer_id": producer_id})
    return 0


def consume(args):
    ends = common.parse_ends(args.ends)
    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
    )
    todo = {p: e for p, e in ends.items() if e > args.start}
    tps = {p: TopicPartition(args.topic, p) for p in todo}
    consumer.assign(list(tps.values()))
    for tp in tps.values():
        consumer.seek(tp, args.start)
    messages = []
    deadline = time.time() + args.timeout
    while todo:
        if time.time() > deadline:
            common.log("timed out; still expecting", todo, "read", len(messages))
            return 1
        batch = consumer.poll(timeout_ms=200)
        for tp, recs in sorted(batch.items(), key=lambda kv: kv[0].partition):
            for m in recs:
                messages.append(common.consumed(m.partition, m.offset, m.key, m.value, m.headers, m.timestamp))
                if m.partition in todo and m.offset + 1 >= todo[m.partition]:
                    del todo[m.partition]
    consumer.close()
    common.emit({"client": client_name(), "messages": messages})
    return 0


def main():
    args = common.parse_args(__doc__)
    return produce(args) if args.command == "produce" else consume(args)


if __name__ == "__main__":
    sys.exit(main())
