"""confluent-kafka (librdkafka) client for the compatibility tests; see common.py for the I/O."""

import sys
import time

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

import common


def _first(v):
    return v[0] if isinstance(v, tuple) else v


def client_name():
    return "confluent-kafka %s (librdkafka %s)" % (_first(confluent_kafka.version()), _first(confluent_kafka.libversion()))


def produce(args):
    records = common.read_input()["records"]
    if args.idempotence == "off":
        config = {
            "acks": "all",
            "enable.idempotence": False,
            "linger.ms": 5,
            "message.timeout.ms": int(args.timeout * 1000),
        }
    elif args.idempotence == "on":
        # librdkafka's default is enable.idempotence=false; everything else stays at its default.
        config = {"enable.idempotence": True}
    else:
        config = {}
    config.update({
        "bootstrap.servers": args.bootstrap,
        "broker.address.family": "v4",
        "error_cb": lambda e: common.log("producer error:", e),
    })
    producer = Producer(config)
    results = [None] * len(records)

    def on_delivery(index):
        def cb(err, msg):
            if err is not None:
                results[index] = {"error": str(err)}
            else:
                results[index] = {"partition": msg.partition(), "offset": msg.offset()}
        return cb

    for i, r in enumerate(records):
        kwargs = {
            "value": common.unhex(r["value"]),
            "key": common.unhex(r["key"]),
            "partition": r["partition"],
            "headers": [(k, common.unhex(v)) for k, v in r["headers"]],
            "on_delivery": on_delivery(i),
        }
        if r.get("timestamp") is not None:
            kwargs["timestamp"] = r["timestamp"]
        while True:
            try:
                producer.produce(args.topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        common.maybe_pause(args, i + 1, producer.poll)
    left = producer.flush(args.timeout)
    if left:
        common.log("%d messages still undelivered after %.0fs" % (left, args.timeout))
        return 1
    common.emit({"client": client_name(), "results": results,
                 "enable_idempotence": bool(config.get("enable.idempotence", False))})
    return 0


def consume(args):
    ends = common.parse_ends(args.ends)
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        # Required by confluent-kafka; no group protocol is used (assign only, no commits).
        "group.id": "strand-compat-assign-only",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "broker.address.family": "v4",
        "error_cb": lambda e: common.log("consumer error:", e),
    })
    todo = {p: e for p, e in ends.items() if e > args.start}
    consumer.assign([TopicPartition(args.topic, p, args.start) for p in sorted(todo)])
    messages = []
    deadline = time.time() + args.timeout
    while todo:
        if time.time() > deadline:
            common.log("timed out; still expecting", todo, "read", len(messages))
            return 1
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            common.log("consume error:", msg.error())
            if msg.error().fatal() or msg.topic() == args.topic:
                return 1
            continue
        p, o = msg.partition(), msg.offset()
        ts_type, ts = msg.timestamp()
        messages.append(common.consumed(p, o, msg.key(), msg.value(), msg.headers(),
                                        ts if ts_type != confluent_kafka.TIMESTAMP_NOT_AVAILABLE else None))
        if p in todo and o + 1 >= todo[p]:
            del todo[p]
    consumer.close()
    common.emit({"client": client_name(), "messages": messages})
    return 0


def main():
    args = common.parse_args(__doc__)
    return produce(args) if args.command == "produce" else consume(args)


if __name__ == "__main__":
    sys.exit(main())
