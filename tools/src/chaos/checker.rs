//! The checker: a pure function of what the clients saw and what the cluster holds afterwards.
//!
//! Inputs (all gathered by the harness, none read here):
//! - the history: every record a producer sent ([`Op`]), with its send time and its outcome
//!   (acknowledged at an offset, failed with an error, or never answered);
//! - the read-back ([`PartitionRead`]): every record of every partition from its log start to
//!   its high watermark, as a consumer fetched it after the run;
//! - the replicas ([`ReplicaLog`]): each node's batches of each partition, parsed from its
//!   segment files after the nodes stopped;
//! - the kills ([`Kill`]): when each leader was killed, which partitions it led, and until when
//!   its effect is measured.
//!
//! Per partition it reports: acknowledged records missing from the read-back (lost), records
//! read more than once (duplicated: the same payload id twice), a producer's sequence going
//! backwards in offset order (reordered), acknowledged records found at another offset than the
//! one acknowledged, records that are not the harness's or name another partition, and whether
//! every replica holds the same bytes below the high watermark and the records the read-back
//! returned. Over the kills it reports the client-visible unavailability: per kill, the longest
//! gap between acknowledged writes to the killed leader's partitions, from the last one before
//! the kill to the end of the kill's window; then the median and the maximum over the kills.
//!
//! Payloads describe themselves ([`PayloadId`]: producer, sequence, partition), so the checker
//! needs nothing but the bytes to know which send a record is.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Serialize;

/// Examples of each kind of violation kept verbatim per partition.
pub const MAX_EXAMPLES: usize = 5;

/// A producer of the harness (its own numbering, not Kafka's producer id: a producer recreated
/// after a fatal error is a new one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ProducerNo(pub u32);

/// A producer's sequence number: its n-th send, over all partitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Seq(pub u64);

/// A partition of the harness's topic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PartitionNo(pub i32);

/// A Kafka offset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Offset(pub i64);

/// A node of the cluster (its `node.id`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct NodeNo(pub u32);

/// Microseconds since the run started (the harness's clock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Micros(pub u64);

impl Micros {
    pub fn as_ms(self) -> f64 {
        self.0 as f64 / 1000.0
    }
}

/// What a record's payload says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PayloadId {
    pub producer: ProducerNo,
    pub seq: Seq,
    pub partition: PartitionNo,
}

impl fmt::Display for PayloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}/s{}/k{}", self.producer.0, self.seq.0, self.partition.0)
    }
}

const PAYLOAD_PREFIX: &str = "strand-chaos ";

/// The payload of `id`: `strand-chaos p=<producer> s=<seq> k=<partition>;` then `.` up to
/// `min_bytes`.
pub fn encode_payload(id: PayloadId, min_bytes: usize) -> Vec<u8> {
    let mut s = format!(
        "{PAYLOAD_PREFIX}p={} s={} k={};",
        id.producer.0, id.seq.0, id.partition.0
    );
    while s.len() < min_bytes {
        s.push('.');
    }
    s.into_bytes()
}

/// The id a payload carries, if it is one of [`encode_payload`]'s (the padding is checked too:
/// a record whose bytes changed is not recognised).
pub fn decode_payload(bytes: &[u8]) -> Option<PayloadId> {
    let text = std::str::from_utf8(bytes).ok()?;
    let rest = text.strip_prefix(PAYLOAD_PREFIX)?;
    let (fields, padding) = rest.split_once(';')?;
    if !padding.bytes().all(|b| b == b'.') {
        return None;
    }
    let mut it = fields.split(' ');
    let field = |part: Option<&str>, name: &str| -> Option<u64> { part?.strip_prefix(name)?.parse().ok() };
    let producer = field(it.next(), "p=")?;
    let seq = field(it.next(), "s=")?;
    let partition = field(it.next(), "k=")?;
    if it.next().is_some() {
        return None;
    }
    Some(PayloadId {
        producer: ProducerNo(u32::try_from(producer).ok()?),
        seq: Seq(seq),
        partition: PartitionNo(i32::try_from(partition).ok()?),
    })
}

/// How a send ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Outcome {
    /// No delivery report (the run ended first).
    Pending,
    /// Acknowledged: the broker said the record is at `offset`.
    Acked { offset: Offset, at: Micros },
    /// The delivery report was an error: the record may or may not be in the log.
    Failed { error: String, at: Micros },
}

/// One send and its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Op {
    pub id: PayloadId,
    pub sent_at: Micros,
    pub outcome: Outcome,
}

/// One record as the read-back fetched it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRecord {
    pub offset: Offset,
    pub value: Option<Vec<u8>>,
}

/// A partition read from its log start to its high watermark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRead {
    pub partition: PartitionNo,
    pub log_start: Offset,
    pub high_watermark: Offset,
    pub records: Vec<ReadRecord>,
}

/// One batch of a replica's segment files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaBatch {
    pub base_offset: Offset,
    /// The offset after its last record.
    pub next_offset: Offset,
    /// The whole batch as stored (header included).
    pub bytes: Vec<u8>,
    /// Its records' offsets and values.
    pub records: Vec<ReadRecord>,
}

/// What one node holds of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaLog {
    pub node: NodeNo,
    pub partition: PartitionNo,
    /// Batches in offset order, as far as they parsed.
    pub batches: Vec<ReplicaBatch>,
    /// Why reading stopped early, if it did (a missing directory, a corrupt batch).
    pub problem: Option<String>,
}

/// A leader killed with SIGKILL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kill {
    pub node: NodeNo,
    pub at: Micros,
    /// The partitions it led at the kill.
    pub partitions: Vec<PartitionNo>,
    /// Until when acknowledged writes count for this kill (the next fault, or the end of the
    /// load).
    pub window_end: Micros,
}

/// The verdict on one replica set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplicaVerdict {
    /// Replicas read (nodes holding the partition's directory).
    pub replicas: usize,
    /// Batches below the high watermark compared byte for byte between replicas (0 with one
    /// replica).
    pub batches_compared: u64,
    /// Whether every replica holds the same bytes below the high watermark (where each holds
    /// them: a replica short of it is reported under `short`).
    pub byte_identical: bool,
    /// Where replicas differ.
    pub divergences: Vec<String>,
    /// Replicas holding less than the high watermark: (node, the offset their batches end at).
    pub short: Vec<(NodeNo, Offset)>,
    /// Records below the high watermark where a replica's segment files do not hold what the
    /// read-back returned (offset or value).
    pub disagree_with_read: u64,
    /// Problems reading replicas.
    pub problems: Vec<String>,
}

/// The verdict on one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PartitionVerdict {
    pub partition: PartitionNo,
    pub log_start: Offset,
    pub high_watermark: Offset,
    pub records_read: u64,
    pub sent: u64,
    pub acked: u64,
    pub failed: u64,
    pub pending: u64,
    /// Acknowledged records the read-back did not return.
    pub lost: u64,
    /// Payload ids read more than once (each extra copy counts).
    pub duplicated: u64,
    /// Records whose producer sequence is below the previous one of the same producer.
    pub reordered: u64,
    /// Acknowledged records found, but at another offset than acknowledged.
    pub moved: u64,
    /// Records that are not the harness's, or name another partition.
    pub foreign: u64,
    /// Records read that were never sent (a payload id no send had).
    pub never_sent: u64,
    pub examples: Vec<String>,
    pub replicas: ReplicaVerdict,
}

impl PartitionVerdict {
    /// Whether anything here is a violation.
    pub fn violations(&self) -> u64 {
        self.lost
            + self.duplicated
            + self.reordered
            + self.moved
            + self.foreign
            + self.never_sent
            + self.replicas.divergences.len() as u64
            + self.replicas.disagree_with_read
    }

    fn example(&mut self, text: String) {
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(text);
        }
    }
}

/// One kill's unavailability.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KillGap {
    pub node: NodeNo,
    pub at_ms: f64,
    pub partitions: Vec<PartitionNo>,
    /// The longest gap between acknowledged writes to the partitions (the largest over them),
    /// in ms; `None` when some partition got no acknowledged write between the kill and the
    /// end of its window.
    pub longest_gap_ms: Option<f64>,
    /// The partition of the longest gap.
    pub worst_partition: Option<PartitionNo>,
}

/// Client-visible unavailability over the kills.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Unavailability {
    pub kills: Vec<KillGap>,
    /// Median and maximum of `longest_gap_ms` over the kills that recovered.
    pub median_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// Kills after which some partition got no acknowledged write before its window ended.
    pub never_recovered: usize,
}

/// The whole verdict.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Verdict {
    pub partitions: Vec<PartitionVerdict>,
    pub totals: Totals,
    pub unavailability: Unavailability,
}

/// Sums over the partitions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub sent: u64,
    pub acked: u64,
    pub failed: u64,
    pub pending: u64,
    pub records_read: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub moved: u64,
    pub foreign: u64,
    pub never_sent: u64,
    pub replica_divergences: u64,
    pub replica_disagreements_with_read: u64,
    pub replicas_short: u64,
    pub batches_compared: u64,
    /// Sends whose payload id was recorded twice in the history (a harness bug, not the
    /// broker's).
    pub history_duplicates: u64,
}

impl Verdict {
    /// Violations of any kind (0: the run passed).
    pub fn violations(&self) -> u64 {
        self.partitions
            .iter()
            .map(PartitionVerdict::violations)
            .sum::<u64>()
            + self.totals.history_duplicates
    }
}

/// Checks a run. `partitions` lists every partition of the topic (a partition missing from
/// `reads` is reported as read empty, so its acknowledged records count as lost).
pub fn check(
    partitions: &[PartitionNo],
    history: &[Op],
    reads: &[PartitionRead],
    replicas: &[ReplicaLog],
    kills: &[Kill],
) -> Verdict {
    let mut sends: HashMap<PayloadId, &Op> = HashMap::with_capacity(history.len());
    let mut totals = Totals::default();
    for op in history {
        if sends.insert(op.id, op).is_some() {
            totals.history_duplicates += 1;
        }
    }
    let mut out = Vec::with_capacity(partitions.len());
    for &p in partitions {
        let empty = PartitionRead {
            partition: p,
            log_start: Offset(0),
            high_watermark: Offset(0),
            records: Vec::new(),
        };
        let read = reads.iter().find(|r| r.partition == p).unwrap_or(&empty);
        let mut v = check_partition(p, history, &sends, read);
        let reps: Vec<&ReplicaLog> = replicas.iter().filter(|r| r.partition == p).collect();
        v.replicas = check_replicas(&reps, read);
        out.push(v);
    }
    for v in &out {
        totals.sent += v.sent;
        totals.acked += v.acked;
        totals.failed += v.failed;
        totals.pending += v.pending;
        totals.records_read += v.records_read;
        totals.lost += v.lost;
        totals.duplicated += v.duplicated;
        totals.reordered += v.reordered;
        totals.moved += v.moved;
        totals.foreign += v.foreign;
        totals.never_sent += v.never_sent;
        totals.replica_divergences += v.replicas.divergences.len() as u64;
        totals.replica_disagreements_with_read += v.replicas.disagree_with_read;
        totals.replicas_short += v.replicas.short.len() as u64;
        totals.batches_compared += v.replicas.batches_compared;
    }
    Verdict {
        partitions: out,
        totals,
        unavailability: unavailability(history, kills),
    }
}

fn check_partition(
    p: PartitionNo,
    history: &[Op],
    sends: &HashMap<PayloadId, &Op>,
    read: &PartitionRead,
) -> PartitionVerdict {
    let mut v = PartitionVerdict {
        partition: p,
        log_start: read.log_start,
        high_watermark: read.high_watermark,
        records_read: read.records.len() as u64,
        ..PartitionVerdict::default()
    };
    // Where each payload id was read (offsets in read order).
    let mut found: HashMap<PayloadId, Vec<Offset>> = HashMap::new();
    let mut last_seq: BTreeMap<ProducerNo, Seq> = BTreeMap::new();
    for r in &read.records {
        let Some(id) = r.value.as_deref().and_then(decode_payload) else {
            v.foreign += 1;
            v.example(format!("offset {}: not a harness record", r.offset.0));
            continue;
        };
        if id.partition != p {
            v.foreign += 1;
            v.example(format!(
                "offset {}: {id} belongs to another partition",
                r.offset.0
            ));
            continue;
        }
        if !sends.contains_key(&id) {
            v.never_sent += 1;
            v.example(format!("offset {}: {id} was never sent", r.offset.0));
        }
        let at = found.entry(id).or_default();
        at.push(r.offset);
        if at.len() > 1 {
            v.duplicated += 1;
            v.example(format!(
                "offset {}: {id} again (first at {})",
                r.offset.0, at[0].0
            ));
            continue;
        }
        if let Some(prev) = last_seq.get(&id.producer) {
            if id.seq < *prev {
                v.reordered += 1;
                v.example(format!(
                    "offset {}: {id} after s{} of the same producer",
                    r.offset.0, prev.0
                ));
            }
        }
        let e = last_seq.entry(id.producer).or_insert(id.seq);
        *e = (*e).max(id.seq);
    }
    for op in history.iter().filter(|op| op.id.partition == p) {
        v.sent += 1;
        match &op.outcome {
            Outcome::Pending => v.pending += 1,
            Outcome::Failed { .. } => v.failed += 1,
            Outcome::Acked { offset, .. } => {
                v.acked += 1;
                match found.get(&op.id) {
                    None => {
                        v.lost += 1;
                        v.example(format!("{} acknowledged at offset {} is gone", op.id, offset.0));
                    }
                    Some(at) if !at.contains(offset) => {
                        v.moved += 1;
                        v.example(format!(
                            "{} acknowledged at offset {} is at {}",
                            op.id, offset.0, at[0].0
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
    }
    v
}

fn check_replicas(reps: &[&ReplicaLog], read: &PartitionRead) -> ReplicaVerdict {
    let hw = read.high_watermark;
    let mut v = ReplicaVerdict {
        replicas: reps.len(),
        byte_identical: true,
        ..ReplicaVerdict::default()
    };
    let fetched: BTreeMap<Offset, &Option<Vec<u8>>> =
        read.records.iter().map(|r| (r.offset, &r.value)).collect();
    // Each replica's batches wholly below the high watermark, by base offset.
    let mut below: Vec<(NodeNo, BTreeMap<Offset, &ReplicaBatch>)> = Vec::new();
    for rep in reps {
        if let Some(problem) = &rep.problem {
            v.problems.push(format!("node {}: {problem}", rep.node.0));
        }
        let mut map = BTreeMap::new();
        let mut end = None;
        let mut checked = 0u64;
        for b in rep.batches.iter().filter(|b| b.next_offset <= hw) {
            end = Some(b.next_offset);
            map.insert(b.base_offset, b);
            for r in &b.records {
                if r.offset < read.log_start {
                    continue;
                }
                checked += 1;
                if fetched.get(&r.offset).copied() != Some(&r.value) {
                    v.disagree_with_read += 1;
                }
            }
        }
        // Records the read returned that this replica does not hold count too (unless the
        // replica is short: reported there).
        let held = end.unwrap_or(read.log_start);
        let expected = fetched.range(read.log_start..held).count() as u64;
        v.disagree_with_read += expected.saturating_sub(checked);
        if held < hw {
            v.short.push((rep.node, held));
        }
        below.push((rep.node, map));
    }
    // The reference is the replica holding the most below the high watermark (then the lowest
    // node id), so that a short replica does not hide where two longer ones differ.
    below.sort_by_key(|(node, map)| (std::cmp::Reverse(map.keys().next_back().copied()), *node));
    if let Some(((ref_node, reference), rest)) = below.split_first() {
        for (node, other) in rest {
            for (base, b) in reference {
                match other.get(base) {
                    Some(o) if o.bytes == b.bytes => v.batches_compared += 1,
                    Some(_) => {
                        v.batches_compared += 1;
                        v.byte_identical = false;
                        v.divergences.push(format!(
                            "batch at {}: node {} and node {} hold different bytes",
                            base.0, ref_node.0, node.0
                        ));
                    }
                    None => {
                        // Not there: either the replica is short (ends before it) or it holds
                        // other batch boundaries, which is a divergence.
                        let other_end = other.values().map(|b| b.next_offset).max();
                        if other_end.is_some_and(|e| e > *base) {
                            v.byte_identical = false;
                            v.divergences.push(format!(
                                "batch at {}: node {} has it, node {} has other batch boundaries",
                                base.0, ref_node.0, node.0
                            ));
                        }
                    }
                }
            }
            for base in other.keys() {
                let ref_end = reference.values().map(|b| b.next_offset).max();
                if !reference.contains_key(base) && ref_end.is_some_and(|e| e > *base) {
                    v.byte_identical = false;
                    v.divergences.push(format!(
                        "batch at {}: node {} has it, node {} has other batch boundaries",
                        base.0, node.0, ref_node.0
                    ));
                }
            }
        }
    }
    v
}

/// Per kill, the longest gap between acknowledged writes to its partitions: from the last
/// acknowledgement at or before the kill (the kill itself if there was none) through every
/// acknowledgement up to the window's end. A partition without any acknowledgement in
/// (kill, window end] has not recovered: the kill's gap is `None`.
pub fn unavailability(history: &[Op], kills: &[Kill]) -> Unavailability {
    let acks = history.iter().filter_map(|op| match op.outcome {
        Outcome::Acked { at, .. } => Some((op.id.partition, at)),
        _ => None,
    });
    unavailability_of(acks, kills)
}

/// [`unavailability`] over any acknowledgements: `(partition, when)` pairs in any order.
pub fn unavailability_of(
    acks: impl IntoIterator<Item = (PartitionNo, Micros)>,
    kills: &[Kill],
) -> Unavailability {
    let mut by_partition: BTreeMap<PartitionNo, Vec<Micros>> = BTreeMap::new();
    for (p, at) in acks {
        by_partition.entry(p).or_default().push(at);
    }
    let mut acks = by_partition;
    for times in acks.values_mut() {
        times.sort_unstable();
    }
    let mut out = Unavailability::default();
    for k in kills {
        let mut longest: Option<(u64, PartitionNo)> = None;
        let mut recovered = true;
        for &p in &k.partitions {
            let times = acks.get(&p).map(Vec::as_slice).unwrap_or(&[]);
            let split = times.partition_point(|t| *t <= k.at);
            let mut prev = if split > 0 { times[split - 1] } else { k.at };
            let after: Vec<Micros> = times[split..]
                .iter()
                .copied()
                .take_while(|t| *t <= k.window_end)
                .collect();
            if after.is_empty() {
                recovered = false;
                continue;
            }
            for t in after {
                let gap = t.0.saturating_sub(prev.0);
                if longest.is_none_or(|(g, _)| gap > g) {
                    longest = Some((gap, p));
                }
                prev = t;
            }
        }
        out.kills.push(KillGap {
            node: k.node,
            at_ms: k.at.as_ms(),
            partitions: k.partitions.clone(),
            longest_gap_ms: if recovered {
                longest.map(|(g, _)| g as f64 / 1000.0)
            } else {
                None
            },
            worst_partition: longest.map(|(_, p)| p),
        });
    }
    let mut gaps: Vec<f64> = out.kills.iter().filter_map(|k| k.longest_gap_ms).collect();
    // A victim that led nothing (a rolling restart reaches every node) has no gap to measure.
    out.never_recovered = out
        .kills
        .iter()
        .filter(|k| !k.partitions.is_empty() && k.longest_gap_ms.is_none())
        .count();
    gaps.sort_by(f64::total_cmp);
    out.median_ms = median(&gaps);
    out.max_ms = gaps.last().copied();
    out
}

/// The median of sorted values (the mean of the middle two for an even count).
pub fn median(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(producer: u32, seq: u64, partition: i32) -> PayloadId {
        PayloadId {
            producer: ProducerNo(producer),
            seq: Seq(seq),
            partition: PartitionNo(partition),
        }
    }

    fn acked(i: PayloadId, offset: i64, at_us: u64) -> Op {
        Op {
            id: i,
            sent_at: Micros(at_us.saturating_sub(100)),
            outcome: Outcome::Acked {
                offset: Offset(offset),
                at: Micros(at_us),
            },
        }
    }

    fn rec(offset: i64, i: PayloadId) -> ReadRecord {
        ReadRecord {
            offset: Offset(offset),
            value: Some(encode_payload(i, 40)),
        }
    }

    fn read(p: i32, records: Vec<ReadRecord>) -> PartitionRead {
        let hw = records.last().map_or(0, |r| r.offset.0 + 1);
        PartitionRead {
            partition: PartitionNo(p),
            log_start: Offset(0),
            high_watermark: Offset(hw),
            records,
        }
    }

    /// A replica holding `records` as one batch per record, with `tag` in the batch bytes.
    fn replica(node: u32, p: i32, records: &[ReadRecord], tag: u8) -> ReplicaLog {
        ReplicaLog {
            node: NodeNo(node),
            partition: PartitionNo(p),
            batches: records
                .iter()
                .map(|r| ReplicaBatch {
                    base_offset: r.offset,
                    next_offset: Offset(r.offset.0 + 1),
                    bytes: [r.value.clone().unwrap_or_default(), vec![tag]].concat(),
                    records: vec![r.clone()],
                })
                .collect(),
            problem: None,
        }
    }

    fn clean() -> (Vec<Op>, Vec<PartitionRead>) {
        let history = vec![
            acked(id(1, 0, 0), 0, 1000),
            acked(id(1, 1, 1), 0, 1100),
            acked(id(1, 2, 0), 1, 1200),
            acked(id(2, 0, 0), 2, 1300),
            Op {
                id: id(2, 1, 1),
                sent_at: Micros(1300),
                outcome: Outcome::Failed {
                    error: "timed out".into(),
                    at: Micros(9000),
                },
            },
            Op {
                id: id(2, 2, 1),
                sent_at: Micros(1400),
                outcome: Outcome::Pending,
            },
        ];
        // The failed send made it to the log; the pending one did not: both are allowed.
        let reads = vec![
            read(
                0,
                vec![rec(0, id(1, 0, 0)), rec(1, id(1, 2, 0)), rec(2, id(2, 0, 0))],
            ),
            read(1, vec![rec(0, id(1, 1, 1)), rec(1, id(2, 1, 1))]),
        ];
        (history, reads)
    }

    const PARTS: [PartitionNo; 2] = [PartitionNo(0), PartitionNo(1)];

    #[test]
    fn payloads_round_trip_and_reject_changed_bytes() {
        let i = id(7, 123_456, 3);
        let bytes = encode_payload(i, 100);
        assert_eq!(bytes.len(), 100);
        assert_eq!(decode_payload(&bytes), Some(i));
        assert_eq!(decode_payload(&encode_payload(i, 0)), Some(i));
        let mut changed = bytes.clone();
        changed[90] = b'x';
        assert_eq!(decode_payload(&changed), None);
        assert_eq!(decode_payload(b"strand-chaos p=1 s=2;"), None);
        assert_eq!(decode_payload(b"hello"), None);
        assert_eq!(decode_payload(b"strand-chaos p=1 s=2 k=3 x=4;"), None);
    }

    #[test]
    fn a_clean_history_passes() {
        let (history, reads) = clean();
        let reps: Vec<ReplicaLog> = reads
            .iter()
            .flat_map(|r| (1..=3).map(move |n| replica(n, r.partition.0, &r.records, 0)))
            .collect();
        let v = check(&PARTS, &history, &reads, &reps, &[]);
        assert_eq!(v.violations(), 0, "{v:#?}");
        assert_eq!(v.totals.acked, 4);
        assert_eq!((v.totals.failed, v.totals.pending), (1, 1));
        assert_eq!(v.totals.records_read, 5);
        // 5 batches, compared between node 1 and nodes 2 and 3.
        assert_eq!(v.totals.batches_compared, 10);
        assert!(v.partitions.iter().all(|p| p.replicas.byte_identical));
    }

    #[test]
    fn a_lost_acknowledged_record_fails() {
        let (history, mut reads) = clean();
        reads[0].records.remove(1);
        let v = check(&PARTS, &history, &reads, &[], &[]);
        assert_eq!(v.totals.lost, 1, "{v:#?}");
        assert_eq!(v.partitions[0].lost, 1);
        assert!(
            v.partitions[0].examples[0].contains("p1/s2/k0"),
            "{:?}",
            v.partitions[0].examples
        );
        assert!(v.violations() > 0);
    }

    #[test]
    fn a_missing_partition_loses_everything_it_acknowledged() {
        let (history, reads) = clean();
        let v = check(&PARTS, &history, &reads[1..], &[], &[]);
        assert_eq!(v.partitions[0].lost, 3);
    }

    #[test]
    fn a_duplicate_fails() {
        let (history, mut reads) = clean();
        reads[0].records.push(rec(3, id(1, 2, 0)));
        let v = check(&PARTS, &history, &reads, &[], &[]);
        assert_eq!((v.totals.duplicated, v.totals.reordered), (1, 0), "{v:#?}");
        assert!(v.violations() > 0);
    }

    #[test]
    fn a_sequence_going_backwards_fails() {
        let (history, mut reads) = clean();
        // Swap p1/s0 and p1/s2 in partition 0: the offsets acknowledged no longer match either.
        reads[0].records[0] = rec(0, id(1, 2, 0));
        reads[0].records[1] = rec(1, id(1, 0, 0));
        let v = check(&PARTS, &history, &reads, &[], &[]);
        assert_eq!(v.totals.reordered, 1, "{v:#?}");
        assert_eq!(v.totals.moved, 2);
        assert_eq!(v.totals.lost, 0);
    }

    #[test]
    fn foreign_and_unsent_records_fail() {
        let (history, mut reads) = clean();
        reads[1].records.push(ReadRecord {
            offset: Offset(2),
            value: Some(b"not ours".to_vec()),
        });
        reads[1].records.push(rec(3, id(1, 2, 0)));
        reads[1].records.push(rec(4, id(9, 9, 1)));
        let v = check(&PARTS, &history, &reads, &[], &[]);
        assert_eq!(v.totals.foreign, 2, "{v:#?}");
        assert_eq!(v.totals.never_sent, 1);
    }

    #[test]
    fn replicas_that_differ_fail() {
        let (history, reads) = clean();
        let mut reps = vec![
            replica(1, 0, &reads[0].records, 0),
            replica(2, 0, &reads[0].records, 0),
            replica(3, 0, &reads[0].records, 1),
        ];
        let v = check(&PARTS, &history, &reads, &reps, &[]);
        let r = &v.partitions[0].replicas;
        assert!(!r.byte_identical);
        assert_eq!(r.divergences.len(), 3, "{r:#?}");
        assert_eq!(r.batches_compared, 6);

        // A replica short of the high watermark is reported as such, not as a divergence.
        reps[2] = replica(3, 0, &reads[0].records[..1], 0);
        let v = check(&PARTS, &history, &reads, &reps, &[]);
        let r = &v.partitions[0].replicas;
        assert!(r.byte_identical && r.divergences.is_empty(), "{r:#?}");
        assert_eq!(r.short, vec![(NodeNo(3), Offset(1))]);
        assert_eq!(v.violations(), 0);

        // A short first node does not hide a difference between the other two.
        let reps = vec![
            replica(1, 0, &reads[0].records[..1], 0),
            replica(2, 0, &reads[0].records, 0),
            replica(3, 0, &reads[0].records, 1),
        ];
        let v = check(&PARTS, &history, &reads, &reps, &[]);
        let r = &v.partitions[0].replicas;
        assert!(!r.byte_identical, "{r:#?}");
        assert_eq!(r.short, vec![(NodeNo(1), Offset(1))]);
        assert_eq!(r.divergences.len(), 3, "{r:#?}");

        // Other batch boundaries over the same offsets are a divergence.
        let mut merged = replica(3, 0, &reads[0].records, 0);
        let first = merged.batches.remove(0);
        merged.batches[0].base_offset = first.base_offset;
        let v = check(&PARTS, &history, &reads, &[reps[0].clone(), merged], &[]);
        assert!(
            !v.partitions[0].replicas.byte_identical,
            "{:#?}",
            v.partitions[0].replicas
        );
    }

    #[test]
    fn one_replica_compares_nothing_but_must_hold_what_was_read() {
        let (history, reads) = clean();
        let one = vec![replica(1, 0, &reads[0].records, 0)];
        let v = check(&PARTS, &history, &reads, &one, &[]);
        let r = &v.partitions[0].replicas;
        assert_eq!((r.replicas, r.batches_compared, r.disagree_with_read), (1, 0, 0));
        assert!(r.byte_identical);

        let mut changed = one[0].clone();
        changed.batches[1].records[0].value = Some(b"other".to_vec());
        let v = check(&PARTS, &history, &reads, &[changed], &[]);
        assert_eq!(v.partitions[0].replicas.disagree_with_read, 1);
        assert!(v.violations() > 0);

        // A replica with a hole below the high watermark disagrees with the read.
        let mut holed = one[0].clone();
        holed.batches.remove(1);
        let v = check(&PARTS, &history, &reads, &[holed], &[]);
        assert_eq!(
            v.partitions[0].replicas.disagree_with_read, 1,
            "{:#?}",
            v.partitions[0].replicas
        );
    }

    #[test]
    fn unavailability_is_the_longest_gap_after_each_kill() {
        // Partition 0 acknowledged at 1, 2, 3 ms, killed at 3.5 ms, then acks at 10, 11 ms.
        // Partition 1 acknowledged at 3 ms and 7 ms.
        let mut history: Vec<Op> = [1000, 2000, 3000, 10_000, 11_000]
            .iter()
            .enumerate()
            .map(|(i, &t)| acked(id(1, i as u64, 0), i as i64, t))
            .collect();
        history.push(acked(id(1, 10, 1), 0, 3000));
        history.push(acked(id(1, 11, 1), 1, 7000));
        let kill = |at: u64, parts: &[i32], end: u64| Kill {
            node: NodeNo(1),
            at: Micros(at),
            partitions: parts.iter().map(|&p| PartitionNo(p)).collect(),
            window_end: Micros(end),
        };
        let u = unavailability(&history, &[kill(3500, &[0, 1], 20_000)]);
        assert_eq!(u.kills[0].longest_gap_ms, Some(7.0), "{u:#?}");
        assert_eq!(u.kills[0].worst_partition, Some(PartitionNo(0)));
        // A window that ends before partition 0's next ack: it never recovered.
        let u = unavailability(&history, &[kill(3500, &[0, 1], 8000)]);
        assert_eq!(u.kills[0].longest_gap_ms, None);
        assert_eq!(u.never_recovered, 1);
        assert_eq!(u.max_ms, None);
        // A victim that led no partition: no gap, and not "never recovered".
        let u = unavailability(&history, &[kill(3500, &[], 20_000)]);
        assert_eq!((u.kills[0].longest_gap_ms, u.never_recovered), (None, 0));
        // Three kills: median and max.
        let u = unavailability(
            &history,
            &[
                kill(1500, &[0], 2500),
                kill(3500, &[0], 20_000),
                kill(3500, &[1], 20_000),
            ],
        );
        let gaps: Vec<_> = u.kills.iter().map(|k| k.longest_gap_ms).collect();
        assert_eq!(gaps, vec![Some(1.0), Some(7.0), Some(4.0)]);
        assert_eq!((u.median_ms, u.max_ms), (Some(4.0), Some(7.0)));
        // A kill before any ack measures from the kill.
        let u = unavailability(&history, &[kill(0, &[0], 1500)]);
        assert_eq!(u.kills[0].longest_gap_ms, Some(1.0));
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[1.0, 2.0, 10.0, 11.0]), Some(6.0));
    }
}
