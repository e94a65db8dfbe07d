//! Prometheus metrics. Handles are registered once and cached per shard, so the request path only
//! touches atomics (the registry's lock is taken when a label set is first seen).

use std::cell::RefCell;
use std::collections::HashMap;

use kafka_protocol::messages::ApiKey;
use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use strand_protocol::types::ShardId;
use strand_storage::fs_glommio::GlommioFs;
use strand_storage::{CheckpointStats, LogOffsets, RoundStats, ShardStore};

/// Bucket bounds (seconds) of every latency histogram: fine between 0.5 and 50 ms, where a
/// disk's `fdatasync` and a produce's stages lie, so their percentiles can be told apart (the
/// issue-7 latency target is 2 × the disk's fdatasync p99).
pub(crate) const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.000_75, 0.001, 0.001_5, 0.002, 0.003, 0.004, 0.005, 0.007_5,
    0.01, 0.015, 0.02, 0.025, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Registers descriptions (HELP lines).
pub(crate) fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "strand_kafka_requests_total",
        "Kafka requests received, by API and version."
    );
    describe_counter!(
        "strand_kafka_request_errors_total",
        "Error codes returned (top level or per partition), by API, version and error."
    );
    describe_histogram!(
        "strand_kafka_request_duration_seconds",
        Unit::Seconds,
        "Time from a request's arrival to its response being ready, by API."
    );
    describe_counter!(
        "strand_kafka_bytes_in_total",
        Unit::Bytes,
        "Record batch bytes appended."
    );
    describe_counter!(
        "strand_kafka_bytes_out_total",
        Unit::Bytes,
        "Record batch bytes served to fetches."
    );
    describe_counter!(
        "strand_bad_requests_total",
        "Requests refused as malformed, oversized or unknown (connection closed), by reason."
    );
    describe_counter!(
        "strand_partition_limit_refusals_total",
        "Topic creations and partition increases refused by a partition limit, by limit (node: strand.max.partitions, topic: .per.topic, request: .per.request)."
    );
    describe_counter!(
        "strand_replication_cut_off_refusals_total",
        "Produce and Fetch partitions refused NOT_LEADER_OR_FOLLOWER by a leader that has not heard a majority of the partition's replicas within the peer timeout, by request."
    );
    describe_gauge!("strand_connections", "Open Kafka connections, by shard.");
    describe_gauge!(
        "strand_replication_groups",
        "Partition Raft groups (replicas) running, by shard."
    );
    describe_gauge!(
        "strand_replication_groups_quiesced",
        "Partition Raft groups with their timers stopped while idle, by shard."
    );
    describe_gauge!(
        "strand_replication_groups_led",
        "Partition Raft groups this node leads, by shard."
    );
    describe_gauge!(
        "strand_replication_groups_leaderless",
        "Partition Raft groups that know no leader (an election is due or running), by shard."
    );
    describe_gauge!(
        "strand_replication_leaders_unrecorded",
        "Leaderships this node's replicas have seen that the cluster metadata does not record yet (Metadata answers with them), by shard."
    );
    describe_gauge!(
        "strand_under_replicated_partitions",
        "Partitions this node leads whose ISR is smaller than their replica set (Kafka's UnderReplicatedPartitions), by shard."
    );
    describe_histogram!(
        "strand_controller_round_decisions",
        "Decisions the active controller committed together in one round."
    );
    describe_histogram!(
        "strand_controller_round_seconds",
        "How long the active controller's decision rounds took (leadership check, decisions, commit)."
    );
    describe_counter!(
        "strand_http_requests_total",
        "HTTP queue API requests answered, by endpoint and status."
    );
    describe_histogram!(
        "strand_http_request_duration_seconds",
        Unit::Seconds,
        "Time from an HTTP request having been read to its answer being ready (a long poll's wait included), by endpoint."
    );
    describe_counter!(
        "strand_http_connections_closed_total",
        "HTTP queue API connections closed, by reason (bad request, request timeout, peer closed, ...)."
    );
    describe_counter!(
        "strand_http_requests_client_gone_total",
        "HTTP requests whose client went away while they were served (a long-polling lease among them ends at once, leasing nothing); counted when the connection closes."
    );
    describe_counter!(
        "strand_connections_refused_total",
        "Kafka client connections closed at their first request without an answer, by reason (a cluster node before it has the cluster metadata)."
    );
    describe_counter!(
        "strand_connections_closed_total",
        "Kafka client connections the broker closed after answering, by reason (a partition leader here cut off from its replicas refused a request on it)."
    );
    describe_counter!(
        "strand_connection_migrations_total",
        "Kafka connections handed to the shard that owns the partitions they produce to or fetch from, by the shard they left."
    );
    describe_gauge!("strand_log_end_offset", "Log end offset, by topic and partition.");
    describe_gauge!(
        "strand_log_start_offset",
        "Log start offset, by topic and partition."
    );
    describe_gauge!(
        "strand_high_watermark",
        "High watermark (durable end), by topic and partition."
    );
    describe_gauge!(
        "strand_log_size_bytes",
        Unit::Bytes,
        "Log size on disk, by topic and partition."
    );
    describe_counter!(
        "strand_flush_rounds_total",
        "Group-commit flush rounds, by shard."
    );
    describe_counter!(
        "strand_flush_direct_rounds_total",
        "Flush rounds that skipped the journal and synced their logs' own files, by shard."
    );
    describe_counter!(
        "strand_flush_syncfs_rounds_total",
        "Direct flush rounds of many logs, made durable by one file-system sync (syncfs), by shard."
    );
    describe_counter!(
        "strand_flush_overlapped_rounds_total",
        "Direct flush rounds whose writes ran under the previous round's fsyncs, by shard."
    );
    describe_counter!(
        "strand_flush_bytes_total",
        Unit::Bytes,
        "Journal bytes written by flush rounds."
    );
    describe_counter!(
        "strand_flush_segment_bytes_total",
        Unit::Bytes,
        "Segment bytes written by flush rounds."
    );
    describe_histogram!(
        "strand_flush_duration_seconds",
        Unit::Seconds,
        "Duration of a flush round."
    );
    describe_histogram!(
        "strand_flush_wait_seconds",
        Unit::Seconds,
        "How long the oldest write of a flush round had been staged when the round took it."
    );
    describe_histogram!(
        "strand_produce_stage_seconds",
        Unit::Seconds,
        "Stages of a Produce request, per owning shard: `staged` from the frame read to the \
         batches staged on the partitions' shard (decoding, checks, the shard crossing); `durable` \
         from staged to durable (waiting for a flush round and the round)."
    );
    describe_histogram!(
        "strand_journal_fsync_seconds",
        Unit::Seconds,
        "Duration of the journal fdatasync."
    );
    describe_histogram!(
        "strand_direct_fsync_seconds",
        Unit::Seconds,
        "Duration of a direct flush round's segment (and directory) syncs."
    );
    describe_counter!(
        "strand_flush_failures_total",
        "Flush rounds that failed (storage went offline)."
    );
    describe_gauge!(
        "strand_storage_offline",
        "1 when a shard's storage refuses writes after a failed write: until there is space again \
         after a full disk (see strand_storage_resumes_total), until a restart after an I/O error."
    );
    describe_counter!(
        "strand_storage_resumes_total",
        "Times a shard's storage took writes again by itself after a full disk, once space was free."
    );
    describe_counter!("strand_checkpoints_total", "Checkpoints completed, by shard.");
    describe_counter!(
        "strand_metadata_records_refused_total",
        "Cluster metadata records a broker-only node fetched and refused because they break the \
         state's invariants; each time it fetches a whole snapshot instead."
    );
    describe_counter!(
        "strand_journal_files_recycled_total",
        "Checkpointed journal files kept to be overwritten by a later rotation, by shard."
    );
    describe_counter!(
        "strand_retention_segments_deleted_total",
        "Segments deleted by retention."
    );
    describe_counter!(
        "strand_retention_bytes_deleted_total",
        Unit::Bytes,
        "Bytes deleted by retention."
    );
    describe_gauge!("strand_partitions", "Partitions owned, by shard.");
    describe_counter!(
        "strand_page_cache_dropped_bytes_total",
        Unit::Bytes,
        "Bytes of segment files the broker asked the kernel to drop from the page cache behind their written end (strand.log.drop.behind.bytes; a range may count once per open handle of its file), by shard."
    );
    describe_gauge!(
        "strand_recent_writes_bytes",
        Unit::Bytes,
        "Memory holding direct-written segments' recent writes to serve reads (strand.log.direct.writes): the buffers kept, not only their data, by shard."
    );
    describe_counter!(
        "strand_recent_writes_read_bytes_total",
        Unit::Bytes,
        "Bytes read of direct-written segments, from the recent writes in memory (source=memory) or from the file (source=file), by shard."
    );
    describe_counter!(
        "strand_near_end_page_cache_read_bytes_total",
        Unit::Bytes,
        "Bytes read from direct-written segments' files near their written end through the page cache (no write of the segment in flight), with what was read ahead, by shard."
    );
    describe_counter!(
        "strand_fetch_sendfile_bytes_total",
        Unit::Bytes,
        "Record bytes Fetch answers sent straight from segment files with sendfile(2), by shard (strand.fetch.sendfile)."
    );
    describe_counter!(
        "strand_fetch_sendfile_waits_total",
        "Times a file region's sendfile found the client's socket full and waited for room, by shard."
    );
    describe_counter!(
        "strand_fetch_sendfile_copied_bytes_total",
        Unit::Bytes,
        "Bytes of such file regions read and written like other bytes instead, because the client's socket was full and the region was not sent within a few tries, by shard."
    );
    describe_counter!(
        "strand_direct_write_bytes_total",
        Unit::Bytes,
        "Segment bytes written with O_DIRECT, by shard and by how: from where the log staged them (staged), or copied into an aligned buffer first (copied)."
    );
    describe_counter!(
        "strand_segment_reserved_bytes_total",
        Unit::Bytes,
        "Segment space reserved (fallocate) ahead of direct writes, so that they neither extend their file nor allocate blocks, by shard; a sealed segment gives back what it did not use."
    );
    describe_counter!(
        "strand_writes_beside_near_reads_total",
        "Segment writes that would have been direct and went through the page cache because a read near the segment's end was running, by shard."
    );
    describe_gauge!(
        "strand_journal_bytes",
        Unit::Bytes,
        "Size of the current journal file, by shard."
    );
    describe_gauge!(
        "strand_storage_heap_bytes",
        Unit::Bytes,
        "Heap memory of in-memory log state, by shard."
    );
    describe_gauge!(
        "strand_fetch_sessions",
        "Incremental fetch sessions cached, by shard."
    );
    describe_gauge!(
        "strand_queue_available_messages",
        "Queue messages leasable now or waiting in the log, by queue, group and partition."
    );
    describe_gauge!(
        "strand_queue_leased_messages",
        "Queue messages leased (in flight), by queue, group and partition."
    );
    describe_gauge!(
        "strand_queue_delayed_messages",
        "Queue messages waiting for a publish or retry delay, by queue, group and partition."
    );
    describe_gauge!(
        "strand_queue_dead_letter_pending_messages",
        "Queue messages being written to the dead-letter topic, by queue, group and partition."
    );
    describe_gauge!(
        "strand_queue_oldest_unacked_age_seconds",
        Unit::Seconds,
        "Age of the oldest message neither acknowledged nor dead-lettered, by queue, group and partition."
    );
    describe_counter!(
        "strand_queue_published_total",
        "Messages published to a queue, by queue and group."
    );
    describe_counter!(
        "strand_queue_duplicates_total",
        "Publishes answered with an earlier message (dedup token), by queue."
    );
    describe_counter!(
        "strand_queue_acked_total",
        "Messages acknowledged, by queue and group."
    );
    describe_counter!(
        "strand_queue_retries_total",
        "Failed attempts that will be retried (nacks, expiries), by queue and group."
    );
    describe_counter!(
        "strand_queue_lease_expiries_total",
        "Leases that expired (visibility timeout), by queue and group."
    );
    describe_counter!(
        "strand_queue_dead_lettered_total",
        "Messages dead-lettered (max attempts or reject), by queue and group."
    );
    describe_histogram!(
        "strand_queue_lease_to_ack_seconds",
        Unit::Seconds,
        "Time from a message's lease to its acknowledgement, by queue and group."
    );
}

pub(crate) fn api_name(key: i16) -> &'static str {
    match ApiKey::try_from(key) {
        Ok(k) => api_key_name(k),
        Err(_) => "Unknown",
    }
}

fn api_key_name(k: ApiKey) -> &'static str {
    match k {
        ApiKey::Produce => "Produce",
        ApiKey::Fetch => "Fetch",
        ApiKey::ListOffsets => "ListOffsets",
        ApiKey::Metadata => "Metadata",
        ApiKey::ApiVersions => "ApiVersions",
        ApiKey::CreateTopics => "CreateTopics",
        ApiKey::DeleteTopics => "DeleteTopics",
        ApiKey::DeleteRecords => "DeleteRecords",
        ApiKey::DescribeConfigs => "DescribeConfigs",
        ApiKey::AlterConfigs => "AlterConfigs",
        ApiKey::IncrementalAlterConfigs => "IncrementalAlterConfigs",
        ApiKey::CreatePartitions => "CreatePartitions",
        ApiKey::DescribeCluster => "DescribeCluster",
        ApiKey::OffsetForLeaderEpoch => "OffsetForLeaderEpoch",
        ApiKey::FindCoordinator => "FindCoordinator",
        ApiKey::OffsetCommit => "OffsetCommit",
        ApiKey::OffsetFetch => "OffsetFetch",
        ApiKey::JoinGroup => "JoinGroup",
        ApiKey::SyncGroup => "SyncGroup",
        ApiKey::Heartbeat => "Heartbeat",
        ApiKey::LeaveGroup => "LeaveGroup",
        ApiKey::ListGroups => "ListGroups",
        ApiKey::DescribeGroups => "DescribeGroups",
        ApiKey::DeleteGroups => "DeleteGroups",
        ApiKey::InitProducerId => "InitProducerId",
        _ => "Other",
    }
}

struct PartitionGauges {
    leo: Gauge,
    lso: Gauge,
    hw: Gauge,
    size: Gauge,
}

/// One shard's metric handles.
pub(crate) struct ShardMetrics {
    requests: RefCell<HashMap<(i16, i16), Counter>>,
    errors: RefCell<HashMap<(i16, i16, i16), Counter>>,
    durations: RefCell<HashMap<i16, Histogram>>,
    bad: RefCell<HashMap<&'static str, Counter>>,
    http_closed: RefCell<HashMap<&'static str, Counter>>,
    http_requests: RefCell<HashMap<(&'static str, u16), Counter>>,
    http_durations: RefCell<HashMap<&'static str, Histogram>>,
    http_client_gone: Counter,
    partitions: RefCell<HashMap<(String, i32), PartitionGauges>>,
    bytes_in: Counter,
    bytes_out: Counter,
    connections: Gauge,
    flush_rounds: Counter,
    flush_bytes: Counter,
    flush_direct_rounds: Counter,
    flush_syncfs_rounds: Counter,
    flush_overlapped_rounds: Counter,
    flush_segment_bytes: Counter,
    direct_fsync: Histogram,
    flush_duration: Histogram,
    journal_fsync: Histogram,
    flush_failures: Counter,
    offline: Gauge,
    resumes: Counter,
    checkpoints: Counter,
    journal_files_recycled: Counter,
    retention_segments: Counter,
    retention_bytes: Counter,
    partitions_owned: Gauge,
    journal_bytes: Gauge,
    heap_bytes: Gauge,
    fetch_sessions: Gauge,
    stall: Histogram,
    flush_wait: Histogram,
    produce_staged: Histogram,
    produce_durable: Histogram,
    dir_syncs: Counter,
    dropped_behind: Counter,
    recent_bytes: Gauge,
    recent_hit_bytes: Counter,
    recent_miss_bytes: Counter,
    near_read_bytes: Counter,
    writes_beside_near_reads: Counter,
    direct_uncopied_bytes: Counter,
    direct_copied_bytes: Counter,
    segment_reserved_bytes: Counter,
    migrations: Counter,
    sendfile_bytes: Counter,
    sendfile_copied_bytes: Counter,
    sendfile_waits: Counter,
}

impl ShardMetrics {
    pub(crate) fn new(id: ShardId) -> Self {
        let shard = id.0.to_string();
        let l = || [("shard", shard.clone())];
        ShardMetrics {
            requests: RefCell::default(),
            errors: RefCell::default(),
            durations: RefCell::default(),
            bad: RefCell::default(),
            http_closed: RefCell::default(),
            http_requests: RefCell::default(),
            http_durations: RefCell::default(),
            http_client_gone: counter!("strand_http_requests_client_gone_total", &l()),
            partitions: RefCell::default(),
            bytes_in: counter!("strand_kafka_bytes_in_total", &l()),
            bytes_out: counter!("strand_kafka_bytes_out_total", &l()),
            connections: gauge!("strand_connections", &l()),
            flush_rounds: counter!("strand_flush_rounds_total", &l()),
            flush_bytes: counter!("strand_flush_bytes_total", &l()),
            flush_direct_rounds: counter!("strand_flush_direct_rounds_total", &l()),
            flush_syncfs_rounds: counter!("strand_flush_syncfs_rounds_total", &l()),
            flush_overlapped_rounds: counter!("strand_flush_overlapped_rounds_total", &l()),
            flush_segment_bytes: counter!("strand_flush_segment_bytes_total", &l()),
            direct_fsync: histogram!("strand_direct_fsync_seconds", &l()),
            flush_duration: histogram!("strand_flush_duration_seconds", &l()),
            journal_fsync: histogram!("strand_journal_fsync_seconds", &l()),
            flush_failures: counter!("strand_flush_failures_total", &l()),
            offline: gauge!("strand_storage_offline", &l()),
            resumes: counter!("strand_storage_resumes_total", &l()),
            checkpoints: counter!("strand_checkpoints_total", &l()),
            journal_files_recycled: counter!("strand_journal_files_recycled_total", &l()),
            retention_segments: counter!("strand_retention_segments_deleted_total", &l()),
            retention_bytes: counter!("strand_retention_bytes_deleted_total", &l()),
            partitions_owned: gauge!("strand_partitions", &l()),
            journal_bytes: gauge!("strand_journal_bytes", &l()),
            heap_bytes: gauge!("strand_storage_heap_bytes", &l()),
            fetch_sessions: gauge!("strand_fetch_sessions", &l()),
            stall: histogram!("strand_shard_stall_seconds", &l()),
            flush_wait: histogram!("strand_flush_wait_seconds", &l()),
            produce_staged: histogram!("strand_produce_stage_seconds", "shard" => shard.clone(), "stage" => "staged"),
            produce_durable: histogram!("strand_produce_stage_seconds", "shard" => shard.clone(), "stage" => "durable"),
            dir_syncs: counter!("strand_flush_dir_syncs_total", &l()),
            dropped_behind: counter!("strand_page_cache_dropped_bytes_total", &l()),
            recent_bytes: gauge!("strand_recent_writes_bytes", &l()),
            recent_hit_bytes: counter!("strand_recent_writes_read_bytes_total", "shard" => shard.clone(), "source" => "memory"),
            recent_miss_bytes: counter!("strand_recent_writes_read_bytes_total", "shard" => shard.clone(), "source" => "file"),
            near_read_bytes: counter!("strand_near_end_page_cache_read_bytes_total", &l()),
            writes_beside_near_reads: counter!("strand_writes_beside_near_reads_total", &l()),
            direct_uncopied_bytes: counter!("strand_direct_write_bytes_total", "shard" => shard.clone(), "how" => "staged"),
            direct_copied_bytes: counter!("strand_direct_write_bytes_total", "shard" => shard.clone(), "how" => "copied"),
            segment_reserved_bytes: counter!("strand_segment_reserved_bytes_total", "shard" => shard.clone()),
            migrations: counter!("strand_connection_migrations_total", &l()),
            sendfile_bytes: counter!("strand_fetch_sendfile_bytes_total", &l()),
            sendfile_copied_bytes: counter!("strand_fetch_sendfile_copied_bytes_total", &l()),
            sendfile_waits: counter!("strand_fetch_sendfile_waits_total", &l()),
        }
    }

    /// A Produce request's batches were staged on this shard, `d` after its frame was read.
    pub(crate) fn produce_staged(&self, d: std::time::Duration) {
        self.produce_staged.record(d.as_secs_f64());
    }

    /// A Produce request's batches staged on this shard were durable `d` after being staged.
    pub(crate) fn produce_durable(&self, d: std::time::Duration) {
        self.produce_durable.record(d.as_secs_f64());
    }

    pub(crate) fn request(&self, api: i16, version: i16) {
        self.requests
            .borrow_mut()
            .entry((api, version))
            .or_insert_with(|| {
                counter!("strand_kafka_requests_total", "api" => api_name(api), "version" => version.to_string())
            })
            .increment(1);
    }

    /// Counts a non-zero error code returned by a request.
    pub(crate) fn error(&self, api: i16, version: i16, code: i16) {
        if code == 0 {
            return;
        }
        self.errors
            .borrow_mut()
            .entry((api, version, code))
            .or_insert_with(|| {
                let name = kafka_protocol::ResponseError::try_from_code(code)
                    .map(|e| format!("{e:?}"))
                    .unwrap_or_else(|| code.to_string());
                counter!("strand_kafka_request_errors_total",
                    "api" => api_name(api), "version" => version.to_string(), "error" => name)
            })
            .increment(1);
    }

    pub(crate) fn duration(&self, api: i16, seconds: f64) {
        self.durations
            .borrow_mut()
            .entry(api)
            .or_insert_with(|| histogram!("strand_kafka_request_duration_seconds", "api" => api_name(api)))
            .record(seconds);
    }

    pub(crate) fn bad_request(&self, reason: &'static str) {
        self.bad
            .borrow_mut()
            .entry(reason)
            .or_insert_with(|| counter!("strand_bad_requests_total", "reason" => reason))
            .increment(1);
    }

    /// An HTTP request answered: its endpoint label, status and duration.
    pub(crate) fn http_request(&self, endpoint: &'static str, status: u16, seconds: f64) {
        self.http_requests
            .borrow_mut()
            .entry((endpoint, status))
            .or_insert_with(|| {
                counter!("strand_http_requests_total", "endpoint" => endpoint, "status" => status.to_string())
            })
            .increment(1);
        self.http_durations
            .borrow_mut()
            .entry(endpoint)
            .or_insert_with(|| histogram!("strand_http_request_duration_seconds", "endpoint" => endpoint))
            .record(seconds);
    }

    /// An HTTP connection closed: why, and how many of its requests lost their client.
    pub(crate) fn http_closed(&self, reason: &'static str, client_gone: u64) {
        self.http_closed
            .borrow_mut()
            .entry(reason)
            .or_insert_with(|| counter!("strand_http_connections_closed_total", "reason" => reason))
            .increment(1);
        self.http_client_gone.increment(client_gone);
    }

    pub(crate) fn bytes_in(&self, n: usize) {
        self.bytes_in.increment(n as u64);
    }

    pub(crate) fn bytes_out(&self, n: usize) {
        self.bytes_out.increment(n as u64);
    }

    /// A file region's bytes went out: `sent` by sendfile, `copied` read and written instead,
    /// after `waits` waits for room on the socket.
    pub(crate) fn region_sent(&self, sent: usize, copied: usize, waits: u32) {
        self.sendfile_bytes.increment(sent as u64);
        self.sendfile_copied_bytes.increment(copied as u64);
        self.sendfile_waits.increment(u64::from(waits));
    }

    pub(crate) fn connection_opened(&self) {
        self.connections.increment(1.0);
    }

    pub(crate) fn connection_closed(&self) {
        self.connections.decrement(1.0);
    }

    /// A connection was handed to another shard.
    pub(crate) fn connection_migrated(&self) {
        self.migrations.increment(1);
    }

    /// Directory syncs made between rounds so that logs can go back to direct rounds.
    pub(crate) fn dir_syncs(&self, n: usize) {
        if n > 0 {
            self.dir_syncs.increment(n as u64);
        }
    }

    /// How late the shard's executor ran a timer: time it could serve nothing.
    pub(crate) fn stall(&self, lag: std::time::Duration) {
        self.stall.record(lag.as_secs_f64());
    }

    pub(crate) fn round(&self, stats: &RoundStats) {
        if stats.logs == 0 && stats.error.is_none() {
            return;
        }
        self.flush_rounds.increment(1);
        self.flush_bytes.increment(stats.journal_bytes as u64);
        self.flush_segment_bytes.increment(stats.segment_bytes as u64);
        self.flush_duration.record(stats.duration_us as f64 / 1e6);
        self.flush_wait.record(stats.wait_us as f64 / 1e6);
        if stats.direct {
            self.flush_direct_rounds.increment(1);
            if stats.syncfs {
                self.flush_syncfs_rounds.increment(1);
            }
            self.direct_fsync.record(stats.fsync_us as f64 / 1e6);
            if stats.overlapped {
                self.flush_overlapped_rounds.increment(1);
            }
        } else {
            self.journal_fsync.record(stats.fsync_us as f64 / 1e6);
        }
        if stats.error.is_some() {
            self.flush_failures.increment(1);
            self.offline.set(1.0);
        }
    }

    /// The storage took writes again after a full disk.
    pub(crate) fn storage_resumed(&self) {
        self.resumes.increment(1);
        self.offline.set(0.0);
    }

    pub(crate) fn checkpoint(&self, stats: &CheckpointStats) {
        self.checkpoints.increment(1);
        self.journal_files_recycled
            .increment(stats.journal_files_recycled as u64);
    }

    pub(crate) fn segments_deleted(&self, segments: usize, bytes: u64) {
        self.retention_segments.increment(segments as u64);
        self.retention_bytes.increment(bytes);
    }

    pub(crate) fn partition_gauges(&self, topic: &str, partition: i32, o: &LogOffsets) {
        let mut parts = self.partitions.borrow_mut();
        let g = parts.entry((topic.to_owned(), partition)).or_insert_with(|| {
            let labels = [("topic", topic.to_owned()), ("partition", partition.to_string())];
            PartitionGauges {
                leo: gauge!("strand_log_end_offset", &labels),
                lso: gauge!("strand_log_start_offset", &labels),
                hw: gauge!("strand_high_watermark", &labels),
                size: gauge!("strand_log_size_bytes", &labels),
            }
        });
        g.leo.set(o.log_end_offset as f64);
        g.lso.set(o.log_start_offset as f64);
        g.hw.set(o.high_watermark as f64);
        g.size.set(o.size_bytes as f64);
    }

    pub(crate) fn forget_partition(&self, topic: &str, partition: i32) {
        if let Some(g) = self
            .partitions
            .borrow_mut()
            .remove(&(topic.to_owned(), partition))
        {
            // The exporter keeps series until they are overwritten; zero them.
            g.leo.set(0.0);
            g.lso.set(0.0);
            g.hw.set(0.0);
            g.size.set(0.0);
        }
    }

    pub(crate) fn store_gauges(&self, store: &ShardStore<GlommioFs>, partitions: usize) {
        self.partitions_owned.set(partitions as f64);
        self.journal_bytes.set(store.journal_bytes() as f64);
        self.heap_bytes.set(store.heap_bytes() as f64);
        let fs = store.fs().stats();
        self.dropped_behind.absolute(fs.dropped_behind_bytes);
        self.recent_bytes.set(fs.recent_writes_bytes as f64);
        self.recent_hit_bytes.absolute(fs.recent_hit_bytes);
        self.recent_miss_bytes.absolute(fs.recent_miss_bytes);
        self.near_read_bytes.absolute(fs.near_cached_read_bytes);
        self.writes_beside_near_reads
            .absolute(fs.writes_beside_near_reads);
        self.direct_uncopied_bytes.absolute(fs.direct_uncopied_bytes);
        self.direct_copied_bytes.absolute(fs.direct_copied_bytes);
        self.segment_reserved_bytes.absolute(fs.reserved_bytes);
        self.offline.set(if store.offline_reason().is_some() {
            1.0
        } else {
            0.0
        });
    }

    pub(crate) fn fetch_sessions(&self, n: usize) {
        self.fetch_sessions.set(n as f64);
    }
}
