"""kafka-python (pure Python) client for the compatibility tests; see common.py for the I/O."""

import json
import sys
import time

import kafka
from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

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
    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
    )
    todo = common.partitions_to_read(args)
    tps = {p: TopicPartition(args.topic, p) for p in todo}
    consumer.assign(list(tps.values()))
    for tp in tps.values():
        consumer.seek(tp, args.start)

    def poll():
        batch = consumer.poll(timeout_ms=200)
        return [common.consumed(m.partition, m.offset, m.key, m.value, m.headers, m.timestamp)
                for _, recs in sorted(batch.items(), key=lambda kv: kv[0].partition) for m in recs]

    return common.consume_to_ends(args, todo, poll, consumer.close, client_name())


ASSIGNORS = {
    "range": RangePartitionAssignor,
    "roundrobin": RoundRobinPartitionAssignor,
    "sticky": StickyPartitionAssignor,
}


def _kwarg(name, value):
    if name == "partition_assignment_strategy":
        return [ASSIGNORS[n.strip()] for n in value.split(",")]
    try:
        return int(value)
    except ValueError:
        return value


def group(args):
    """A group member (see common.GroupMember): subscribe, poll, commit, close at EOF on stdin."""
    spec = json.loads(args.spec)
    member = common.GroupMember(spec)
    kwargs = {k: _kwarg(k, v) for k, v in spec.get("config", {}).items()}
    consumer = KafkaConsumer(
        bootstrap_servers=spec["bootstrap"],
        group_id=spec["group"],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **kwargs,
    )

    def commit_offsets(offsets):
        consumer.commit({TopicPartition(member.topic, p): OffsetAndMetadata(o, "", -1)
                         for p, o in offsets.items()})
    member.commit_offsets = commit_offsets

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            member.revoked(tp.partition for tp in revoked)

        def on_partitions_assigned(self, assigned):
            member.assigned(tp.partition for tp in assigned)

    consumer.subscribe([member.topic], listener=Listener())
    while not member.stop.is_set():
        batch = consumer.poll(timeout_ms=50)
        for tp, recs in sorted(batch.items(), key=lambda kv: kv[0].partition):
            for m in recs:
                member.record(m.partition, m.offset, m.value)
        member.tick()
    member.commit()
    consumer.close(autocommit=False)
    member.emit({"ev": "closed"})
    return 0


def _error_name(err):
    """None for NoError, else the error class's name (e.g. GroupSubscribedToTopicError)."""
    if err is None:
        return None
    cls = err if isinstance(err, type) else type(err)
    return None if cls.__name__ == "NoError" else cls.__name__


def groups_admin(args):
    """KafkaAdminClient: {"bootstrap", "topic", "delete_offsets": [[group, partition], ...],
    "delete_groups": [group, ...]} on stdin; answers {"delete_offsets": [{"group", "error"}],
    "delete_groups": {group: error}} with error = null or the error class's name."""
    req = common.read_input()
    admin = KafkaAdminClient(bootstrap_servers=req["bootstrap"])
    out = {"client": client_name(), "delete_offsets": [], "delete_groups": {}}
    for group_id, partition in req.get("delete_offsets", []):
        tp = TopicPartition(req["topic"], partition)
        try:
            res = admin.delete_group_offsets(group_id, [tp])
            err = _error_name(res.get(tp))
        except Exception as e:  # a top-level error
            err = type(e).__name__
        out["delete_offsets"].append({"group": group_id, "error": err})
    if req.get("delete_groups"):
        # kafka-python 3.0 answers {group_id: "OK" or the error class's name}.
        for group_id, res in admin.delete_groups(req["delete_groups"]).items():
            out["delete_groups"][group_id] = None if res == "OK" else res
    admin.close()
    common.emit(out)
    return 0


def _plain(v):
    """A kafka-python answer as JSON: protocol objects and named tuples become dicts."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)) and not hasattr(v, "_asdict"):
        return [_plain(x) for x in v]
    if hasattr(v, "_asdict"):
        return _plain(v._asdict())
    if hasattr(v, "to_dict"):
        return _plain(v.to_dict())
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def cluster_admin(args):
    """KafkaAdminClient's cluster views: {"bootstrap", "topics": [...], "page": n, "node": id,
    "moves": [[topic, partition, dir], ...]} on stdin; answers {"pages": [DescribeTopicPartitions
    pages of at most n partitions, following the cursor], "log_dirs", "reassignments",
    "quorum", "config_resources", "moves": [error class name or null per move]} (an API the
    broker refuses answers {"error": its class name})."""
    req = common.read_input()
    admin = KafkaAdminClient(bootstrap_servers=req["bootstrap"])
    out = {"client": client_name(), "pages": []}
    cursor = None
    for _ in range(100):
        page = admin.describe_topic_partitions(req["topics"], response_partition_limit=req["page"], cursor=cursor)
        out["pages"].append(_plain(page))
        cursor = page.get("next_cursor")
        if not cursor:
            break
        cursor = _plain(cursor)
    for key, call in [
        ("log_dirs", lambda: admin.describe_log_dirs()),
        ("reassignments", lambda: admin.list_partition_reassignments()),
        ("quorum", lambda: admin.describe_metadata_quorum()),
        ("config_resources", lambda: admin.list_config_resources()),
        ("moves", lambda: [
            [_error_name(e) for e in admin.alter_replica_log_dirs({(t, p, req["node"]): d}).values()]
            for t, p, d in req.get("moves", [])]),
    ]:
        try:
            out[key] = _plain(call())
        except Exception as e:  # noqa: BLE001 - reported to the test
            out[key] = {"error": type(e).__name__, "message": str(e)}
    admin.close()
    common.emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(common.main(__doc__, globals()))
