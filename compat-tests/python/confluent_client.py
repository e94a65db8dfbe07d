"""confluent-kafka (librdkafka) client for the compatibility tests; see common.py for the I/O."""

import json
import sys

import confluent_kafka
from confluent_kafka import (ConsumerGroupState, ConsumerGroupTopicPartitions, ConsumerGroupType, Consumer,
                             KafkaError, Producer, TopicCollection, TopicPartition)
from confluent_kafka.admin import AdminClient

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
    todo = common.partitions_to_read(args)
    consumer.assign([TopicPartition(args.topic, p, args.start) for p in sorted(todo)])

    def poll():
        msg = consumer.poll(0.2)
        if msg is None:
            return []
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                return []
            common.log("consume error:", msg.error())
            if msg.error().fatal() or msg.topic() == args.topic:
                return None
            return []
        ts_type, ts = msg.timestamp()
        return [common.consumed(msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers(),
                                ts if ts_type != confluent_kafka.TIMESTAMP_NOT_AVAILABLE else None)]

    return common.consume_to_ends(args, todo, poll, consumer.close, client_name())


def group(args):
    """A group member (see common.GroupMember): subscribe, poll, commit, close at EOF on stdin."""
    spec = json.loads(args.spec)
    member = common.GroupMember(spec)
    config = {
        "bootstrap.servers": spec["bootstrap"],
        "group.id": spec["group"],
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "broker.address.family": "v4",
        "error_cb": lambda e: member.emit({"ev": "error", "error": str(e)}),
    }
    config.update(spec.get("config", {}))
    consumer = Consumer(config)

    def commit_offsets(offsets):
        consumer.commit(offsets=[TopicPartition(member.topic, p, o) for p, o in sorted(offsets.items())],
                        asynchronous=False)
    member.commit_offsets = commit_offsets

    def numbers(partitions):
        return [tp.partition for tp in partitions]
    consumer.subscribe([member.topic],
                       on_assign=lambda c, ps: member.assigned(numbers(ps)),
                       on_revoke=lambda c, ps: member.revoked(numbers(ps)),
                       on_lost=lambda c, ps: member.lost(numbers(ps)))
    while not member.stop.is_set():
        msg = consumer.poll(0.05)
        if msg is not None:
            if msg.error():
                member.emit({"ev": "error", "error": str(msg.error())})
            else:
                member.record(msg.partition(), msg.offset(), msg.value())
        member.tick()
    member.commit()
    consumer.close()
    member.emit({"ev": "closed"})
    return 0


def _name(enum_value):
    return enum_value.name if enum_value is not None else None


def groups_admin(args):
    """The AdminClient's view of groups. Input (stdin): {"bootstrap", "topic",
    "list": [{"states": [ConsumerGroupState names], "types": [ConsumerGroupType names]}, ...],
    "describe": [group ids], "offsets": [group ids]}. Output: {"list": [{"groups": [{"group_id",
    "state", "type", "is_simple"}], "errors": [...]}], "describe": {group: {"error", "state", "type",
    "partition_assignor", "is_simple", "members": [{"member_id", "client_id", "host",
    "assignment": [[topic, partition]...]}]}}, "offsets": {group: [[partition, offset]...]}}."""
    req = common.read_input()
    admin = AdminClient({"bootstrap.servers": req["bootstrap"], "broker.address.family": "v4"})
    out = {"client": client_name(), "list": [], "describe": {}, "offsets": {}}
    for f in req.get("list", []):
        kwargs = {"request_timeout": 15}
        if f.get("states"):
            kwargs["states"] = {ConsumerGroupState[x] for x in f["states"]}
        if f.get("types"):
            kwargs["types"] = {ConsumerGroupType[x] for x in f["types"]}
        res = admin.list_consumer_groups(**kwargs).result()
        out["list"].append({
            "groups": [{"group_id": g.group_id, "state": _name(g.state), "type": _name(g.type),
                        "is_simple": g.is_simple_consumer_group} for g in res.valid],
            "errors": [str(e) for e in res.errors],
        })
    if req.get("describe"):
        futures = admin.describe_consumer_groups(req["describe"], request_timeout=15)
        for group_id, fut in futures.items():
            try:
                d = fut.result()
            except Exception as e:  # reported per group
                out["describe"][group_id] = {"error": str(e)}
                continue
            out["describe"][group_id] = {
                "error": None,
                "state": _name(d.state),
                "type": _name(d.type),
                "partition_assignor": d.partition_assignor,
                "is_simple": d.is_simple_consumer_group,
                "members": [{
                    "member_id": m.member_id, "client_id": m.client_id, "host": m.host,
                    "assignment": sorted([tp.topic, tp.partition] for tp in m.assignment.topic_partitions),
                } for m in d.members],
            }
    for group_id in req.get("offsets", []):
        futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)], request_timeout=15)
        res = futures[group_id].result()
        # Not the metadata: confluent-kafka reads librdkafka's (unterminated) metadata as a C string
        # and may return bytes beyond its end (librdkafka issue #4649).
        out["offsets"][group_id] = sorted([tp.partition, tp.offset]
                                          for tp in res.topic_partitions if tp.topic == req["topic"])
    common.emit(out)
    return 0


def authorized_operations(args):
    """AdminClient describes with include_authorized_operations: {"bootstrap", "topic"} on
    stdin; answers {"topic": [operation names], "cluster": [operation names]}."""
    req = common.read_input()
    admin = AdminClient({"bootstrap.servers": req["bootstrap"]})
    topic = admin.describe_topics(TopicCollection([req["topic"]]), include_authorized_operations=True)
    described = topic[req["topic"]].result(timeout=30)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(timeout=30)
    common.emit({
        "client": client_name(),
        "topic": sorted(_name(o) for o in (described.authorized_operations or [])),
        "cluster": sorted(_name(o) for o in (cluster.authorized_operations or [])),
    })
    return 0


if __name__ == "__main__":
    sys.exit(common.main(__doc__, globals()))
