//! Fetch responses as a list of byte segments.
//!
//! A Fetch response is mostly record data read from the log. Encoding it into one buffer copies
//! every fetched byte once more before the socket copies it again. [`encode_fetch_response`]
//! instead returns the frame as segments: the encoded fields in small buffers, and each
//! partition's records (at least `min_shared_bytes` of them) as the very `Bytes` the read
//! returned, to be written one after the other.
//!
//! All fields are still encoded by `kafka-protocol`. Each level (response, topic, partition) is
//! encoded with its last field emptied: the list of topics, the list of partitions, the records.
//! That field is followed only by the level's tagged fields, which must be absent, so the
//! encoding ends in the empty field's length and one zero byte (flexible versions). Those ending
//! bytes are checked, replaced by the real length, and the content follows. Responses this
//! cannot express (tagged fields set, nothing large enough to share) are encoded whole.
//! Concatenated, the segments are byte for byte what [`encode_response`] produces; the tests
//! check that for every version.
//!
//! [`encode_fetch_response_with`] also leaves holes: a partition's records may be
//! [`ExternalRecords`], bytes the caller sends itself (a file region, with sendfile(2)). The
//! partition is encoded with empty records, its length field says `len`, and a
//! [`Piece::External`] stands where the records go. The frame size is computed without the bytes:
//! the response with empty records, plus each hole's `len` and the growth of its length field.

use std::convert::Infallible;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{
    EpochEndOffset, FetchableTopicResponse, LeaderIdAndEpoch, PartitionData, SnapshotId,
};
use kafka_protocol::messages::{ApiKey, FetchResponse, ResponseHeader};
use kafka_protocol::protocol::Encodable;

use crate::header::{encode_response, EncodeError};

/// First version with compact lengths and tagged fields.
const FIRST_FLEXIBLE: i16 = 12;

/// A piece of an encoded Fetch frame: encoded bytes, or records the caller sends itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<R> {
    Bytes(Bytes),
    External(R),
}

/// Records of one partition that are not in the response: `len` bytes the caller supplies
/// (a file region, say) where the partition's records go.
#[derive(Debug)]
pub struct ExternalRecords<R> {
    /// Index of the topic in `resp.responses`, and of the partition in that topic's `partitions`.
    pub topic: usize,
    pub partition: usize,
    pub len: usize,
    pub item: R,
}

fn err(msg: String) -> EncodeError {
    EncodeError(anyhow::anyhow!(msg))
}

/// Whether every level's tagged fields are absent (then each level ends in its last field).
fn splittable(resp: &FetchResponse) -> bool {
    // Built once, not once per partition.
    let (epoch, leader, snapshot) = (
        EpochEndOffset::default(),
        LeaderIdAndEpoch::default(),
        SnapshotId::default(),
    );
    resp.node_endpoints.is_empty()
        && resp.unknown_tagged_fields.is_empty()
        && resp.responses.iter().all(|t| {
            t.unknown_tagged_fields.is_empty()
                && t.partitions.iter().all(|p| {
                    p.unknown_tagged_fields.is_empty()
                        && p.diverging_epoch == epoch
                        && p.current_leader == leader
                        && p.snapshot_id == snapshot
                })
        })
}

fn shares_any(resp: &FetchResponse, min_shared_bytes: usize) -> bool {
    resp.responses.iter().any(|t| {
        t.partitions
            .iter()
            .any(|p| p.records.as_ref().is_some_and(|r| r.len() >= min_shared_bytes))
    })
}

/// Pieces being built: finished ones, and the buffer the next one is encoded into.
struct Segments<R> {
    done: Vec<Piece<R>>,
    cur: BytesMut,
    flexible: bool,
    /// Bytes of the frame that are in no buffer: the `len`s of the holes left so far.
    external_bytes: usize,
}

impl<R> Segments<R> {
    /// Encodes `shell`, whose last field is empty, and leaves the buffer just before that
    /// field's length. The caller then writes the real length, the content and [`Self::end`].
    fn open<T: Encodable>(&mut self, shell: &T, version: i16, what: &str) -> Result<(), EncodeError> {
        shell.encode(&mut self.cur, version).map_err(EncodeError)?;
        // An empty array or byte string, then no tagged fields.
        let ending: &[u8] = if self.flexible { &[1, 0] } else { &[0, 0, 0, 0] };
        if !self.cur.ends_with(ending) {
            return Err(err(format!("{what} does not end in an empty last field")));
        }
        self.cur.truncate(self.cur.len() - ending.len());
        Ok(())
    }

    /// The length of an array or byte string of `n` elements.
    fn length(&mut self, n: usize) -> Result<(), EncodeError> {
        if self.flexible {
            let n = u32::try_from(n)
                .ok()
                .and_then(|n| n.checked_add(1))
                .ok_or_else(|| err(format!("{n} elements are too many to encode")))?;
            put_unsigned_varint(&mut self.cur, n);
        } else {
            let n = i32::try_from(n).map_err(|_| err(format!("{n} elements are too many to encode")))?;
            self.cur.put_i32(n);
        }
        Ok(())
    }

    /// Closes a level opened with [`Self::open`]: its (empty) tagged fields.
    fn end(&mut self) {
        if self.flexible {
            self.cur.put_u8(0);
        }
    }

    /// Ends the buffer being encoded as a piece of its own, if it holds anything.
    fn flush(&mut self) {
        if !self.cur.is_empty() {
            self.done.push(Piece::Bytes(self.cur.split().freeze()));
        }
    }

    /// Appends `shared` as its own segment.
    fn share(&mut self, shared: Bytes) {
        if shared.is_empty() {
            return;
        }
        self.flush();
        self.done.push(Piece::Bytes(shared));
    }

    /// Leaves a hole of `len` bytes that `item` fills.
    fn hole(&mut self, item: R, len: usize) {
        self.flush();
        self.done.push(Piece::External(item));
        self.external_bytes += len;
    }

    fn finish(mut self) -> (Vec<Piece<R>>, usize) {
        self.flush();
        (self.done, self.external_bytes)
    }
}

fn put_unsigned_varint(buf: &mut BytesMut, mut n: u32) {
    while n >= 0x80 {
        buf.put_u8((n as u8) | 0x80);
        n >>= 7;
    }
    buf.put_u8(n as u8);
}

/// The encoded size of a byte string's length field for `n` bytes.
fn varint_len(mut n: u32) -> usize {
    let mut len = 1;
    while n >= 0x80 {
        n >>= 7;
        len += 1;
    }
    len
}

/// How much larger the frame is with `len` records in place of empty ones: the records, and
/// what their length field grows by (compact lengths only; an `i32` stays four bytes).
fn external_growth(len: usize, flexible: bool) -> Result<usize, EncodeError> {
    let too_long = || err(format!("external records of {len} bytes are too long to encode"));
    if flexible {
        let n = u32::try_from(len)
            .ok()
            .and_then(|n| n.checked_add(1))
            .ok_or_else(too_long)?;
        len.checked_add(varint_len(n) - varint_len(1))
            .ok_or_else(too_long)
    } else {
        i32::try_from(len).map_err(|_| too_long())?;
        Ok(len)
    }
}

/// Checks that each entry names a distinct partition of `resp` whose records are empty, and
/// that its `len` is not zero. Sorts `external` into response order.
fn check_external<R>(resp: &FetchResponse, external: &mut [ExternalRecords<R>]) -> Result<(), EncodeError> {
    external.sort_by_key(|e| (e.topic, e.partition));
    for e in external.iter() {
        let (t, i) = (e.topic, e.partition);
        let p = resp
            .responses
            .get(t)
            .and_then(|topic| topic.partitions.get(i))
            .ok_or_else(|| {
                err(format!(
                    "external records for topic {t} partition {i}, not in the response"
                ))
            })?;
        if !p.records.as_ref().is_some_and(Bytes::is_empty) {
            return Err(err(format!(
                "external records for topic {t} partition {i}, whose records are null or not empty"
            )));
        }
        if e.len == 0 {
            return Err(err(format!(
                "external records of 0 bytes for topic {t} partition {i}"
            )));
        }
    }
    for pair in external.windows(2) {
        if let [a, b] = pair {
            if (a.topic, a.partition) == (b.topic, b.partition) {
                return Err(err(format!(
                    "two external records for topic {} partition {}",
                    a.topic, a.partition
                )));
            }
        }
    }
    Ok(())
}

/// Encodes a complete Fetch response frame (size prefix, header, body) as segments whose
/// concatenation is the frame. Records of at least `min_shared_bytes` are not copied.
pub fn encode_fetch_response(
    correlation_id: i32,
    version: i16,
    resp: FetchResponse,
    min_shared_bytes: usize,
) -> Result<Vec<Bytes>, EncodeError> {
    let pieces = encode_fetch_response_with::<Infallible>(
        correlation_id,
        version,
        resp,
        min_shared_bytes,
        Vec::new(),
    )?;
    Ok(pieces
        .into_iter()
        .map(|piece| match piece {
            Piece::Bytes(bytes) => bytes,
            Piece::External(never) => match never {},
        })
        .collect())
}

/// Like [`encode_fetch_response`], with the records of the partitions named in `external` left
/// out: each such partition's records must be empty in `resp`, and a [`Piece::External`] holding
/// its `item` stands for its `len` bytes. The frame (size prefix and records' length included)
/// is the one `resp` encodes to with those bytes as the partition's records. Entries may come in
/// any order; pieces follow the response. Without entries, this is [`encode_fetch_response`].
pub fn encode_fetch_response_with<R>(
    correlation_id: i32,
    version: i16,
    mut resp: FetchResponse,
    min_shared_bytes: usize,
    mut external: Vec<ExternalRecords<R>>,
) -> Result<Vec<Piece<R>>, EncodeError> {
    if external.is_empty() {
        if !splittable(&resp) || !shares_any(&resp, min_shared_bytes) {
            return encode_response(correlation_id, ApiKey::Fetch, version, &resp)
                .map(|b| vec![Piece::Bytes(b)]);
        }
    } else if !splittable(&resp) {
        return Err(err(
            "external records in a Fetch response with tagged fields, which is encoded whole".to_owned(),
        ));
    }
    check_external(&resp, &mut external)?;
    let flexible = version >= FIRST_FLEXIBLE;

    let header_version = ApiKey::Fetch.response_header_version(version);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let mut size = header.compute_size(header_version).map_err(EncodeError)?
        + resp.compute_size(version).map_err(EncodeError)?;
    for e in &external {
        size = size
            .checked_add(external_growth(e.len, flexible)?)
            .ok_or_else(|| err("response size overflows".to_owned()))?;
    }
    let size_i32 = i32::try_from(size).map_err(|_| err(format!("response of {size} bytes is too large")))?;

    let mut out = Segments {
        done: Vec::new(),
        cur: BytesMut::with_capacity(4096),
        flexible,
        external_bytes: 0,
    };
    out.cur.put_i32(size_i32);
    header.encode(&mut out.cur, header_version).map_err(EncodeError)?;

    let mut external = external.into_iter().peekable();
    let topics = std::mem::take(&mut resp.responses);
    out.open(&resp, version, "the response")?;
    out.length(topics.len())?;
    for (ti, mut topic) in topics.into_iter().enumerate() {
        let partitions = std::mem::take(&mut topic.partitions);
        out.open::<FetchableTopicResponse>(&topic, version, "a topic")?;
        out.length(partitions.len())?;
        for (pi, mut p) in partitions.into_iter().enumerate() {
            if let Some(e) = external.next_if(|e| (e.topic, e.partition) == (ti, pi)) {
                // Its records are empty (checked above).
                out.open::<PartitionData>(&p, version, "a partition")?;
                out.length(e.len)?;
                out.hole(e.item, e.len);
                out.end();
                continue;
            }
            match p.records.take() {
                Some(records) if records.len() >= min_shared_bytes => {
                    p.records = Some(Bytes::new());
                    out.open::<PartitionData>(&p, version, "a partition")?;
                    out.length(records.len())?;
                    out.share(records);
                    out.end();
                }
                records => {
                    p.records = records;
                    p.encode(&mut out.cur, version).map_err(EncodeError)?;
                }
            }
        }
        out.end();
    }
    out.end();
    if external.next().is_some() {
        return Err(err("external records left over after the response".to_owned()));
    }

    let (pieces, external_bytes) = out.finish();
    let written = pieces
        .iter()
        .map(|piece| match piece {
            Piece::Bytes(bytes) => bytes.len(),
            Piece::External(_) => 0,
        })
        .sum::<usize>()
        + external_bytes;
    if written != 4 + size {
        return Err(err(format!(
            "segmented Fetch response is {written} bytes, expected {}",
            4 + size
        )));
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{AbortedTransaction, EpochEndOffset};
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;
    use proptest::prelude::*;

    fn concat(parts: &[Bytes]) -> Vec<u8> {
        parts.iter().flat_map(|b| b.iter().copied()).collect()
    }

    /// The frame `pieces` stand for, each external piece being the records it names.
    fn fill(pieces: &[Piece<Bytes>]) -> Vec<u8> {
        pieces
            .iter()
            .flat_map(|p| match p {
                Piece::Bytes(b) | Piece::External(b) => b.iter().copied(),
            })
            .collect()
    }

    fn externals(pieces: &[Piece<Bytes>]) -> usize {
        pieces.iter().filter(|p| matches!(p, Piece::External(_))).count()
    }

    /// `n` bytes that differ from those of any other `seed`, so misplaced records show.
    fn records(n: usize, seed: usize) -> Bytes {
        Bytes::from((0..n).map(|i| ((i + 7 * seed) % 251) as u8).collect::<Vec<u8>>())
    }

    /// Takes the records of the partitions at `at` out of `full`: the response to encode, with
    /// empty records there, and the entries holding the records taken out.
    fn take_out(full: &FetchResponse, at: &[(usize, usize)]) -> (FetchResponse, Vec<ExternalRecords<Bytes>>) {
        let mut resp = full.clone();
        let external = at
            .iter()
            .map(|&(topic, partition)| {
                let p = &mut resp.responses[topic].partitions[partition];
                let item = p.records.replace(Bytes::new()).unwrap();
                ExternalRecords {
                    topic,
                    partition,
                    len: item.len(),
                    item,
                }
            })
            .collect();
        (resp, external)
    }

    fn partition(index: i32, records: Option<usize>, aborted: bool) -> PartitionData {
        PartitionData::default()
            .with_partition_index(index)
            .with_high_watermark(1000 + i64::from(index))
            .with_last_stable_offset(999)
            .with_log_start_offset(7)
            .with_aborted_transactions(aborted.then(|| {
                vec![AbortedTransaction::default()
                    .with_producer_id(kafka_protocol::messages::ProducerId(5))
                    .with_first_offset(9)]
            }))
            .with_records(records.map(|n| Bytes::from((0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>())))
    }

    fn response(topics: Vec<Vec<PartitionData>>, session_id: i32) -> FetchResponse {
        FetchResponse::default()
            .with_throttle_time_ms(3)
            .with_session_id(session_id)
            .with_responses(
                topics
                    .into_iter()
                    .enumerate()
                    .map(|(i, partitions)| {
                        FetchableTopicResponse::default()
                            .with_topic(TopicName(StrBytes::from_string(format!("topic-{i}"))))
                            .with_topic_id(uuid::Uuid::from_u128(i as u128 + 1))
                            .with_partitions(partitions)
                    })
                    .collect(),
            )
    }

    /// What the library encodes for `resp` at `version` (topic names or ids as the version has).
    fn whole(resp: &FetchResponse, version: i16) -> Vec<u8> {
        encode_response(11, ApiKey::Fetch, version, resp)
            .unwrap()
            .to_vec()
    }

    fn for_version(mut resp: FetchResponse, version: i16) -> FetchResponse {
        if version < 7 {
            resp.session_id = 0;
        }
        for t in &mut resp.responses {
            if version >= 13 {
                t.topic = TopicName::default();
            } else {
                t.topic_id = uuid::Uuid::nil();
            }
        }
        resp
    }

    #[test]
    fn large_records_are_shared_not_copied_and_the_frame_is_unchanged() {
        for version in 4..=18 {
            let resp = for_version(
                response(
                    vec![vec![
                        partition(0, Some(100_000), false),
                        partition(1, Some(10), true),
                    ]],
                    9,
                ),
                version,
            );
            let shared = resp.responses[0].partitions[0].records.clone().unwrap();
            let parts = encode_fetch_response(11, version, resp.clone(), 4096).unwrap();
            assert_eq!(concat(&parts), whole(&resp, version), "v{version}");
            // The records segment is the read's own buffer.
            assert!(
                parts
                    .iter()
                    .any(|p| p.as_ptr() == shared.as_ptr() && p.len() == shared.len()),
                "v{version}: records were copied"
            );
            assert_eq!(parts.len(), 3, "v{version}: head, records, rest");
        }
    }

    #[test]
    fn responses_with_tagged_fields_or_only_small_records_are_one_segment() {
        let mut tagged = response(vec![vec![partition(0, Some(100_000), false)]], 1);
        tagged.responses[0].partitions[0].diverging_epoch = EpochEndOffset::default().with_epoch(4);
        let small = response(vec![vec![partition(0, Some(100), false)]], 1);
        for resp in [tagged, small] {
            let parts = encode_fetch_response(11, 17, resp.clone(), 4096).unwrap();
            assert_eq!(parts.len(), 1);
            assert_eq!(concat(&parts), whole(&resp, 17));
        }
    }

    proptest! {
        #[test]
        fn segments_concatenate_to_the_library_encoding(
            version in 4i16..=18,
            topics in prop::collection::vec(
                prop::collection::vec((prop::option::of(0usize..3000), any::<bool>()), 0..5),
                0..4,
            ),
            tagged in any::<bool>(),
            min_shared_bytes in 0usize..2000,
        ) {
            let mut resp = response(
                topics
                    .iter()
                    .map(|ps| ps.iter().enumerate().map(|(i, (r, a))| partition(i as i32, *r, *a)).collect())
                    .collect(),
                77,
            );
            if tagged && version >= 12 {
                if let Some(p) = resp.responses.first_mut().and_then(|t| t.partitions.first_mut()) {
                    p.snapshot_id.epoch = 3;
                }
            }
            let resp = for_version(resp, version);
            let parts = encode_fetch_response(11, version, resp.clone(), min_shared_bytes).unwrap();
            prop_assert_eq!(concat(&parts), whole(&resp, version));
            // Without external records, the general encoder gives the very same segments.
            let pieces = encode_fetch_response_with::<Bytes>(11, version, resp, min_shared_bytes, Vec::new());
            let pieces: Vec<Piece<Bytes>> = pieces.unwrap();
            prop_assert_eq!(pieces, parts.into_iter().map(Piece::Bytes).collect::<Vec<_>>());
        }

        #[test]
        fn pieces_with_external_records_fill_to_the_library_encoding(
            version in 4i16..=18,
            topics in prop::collection::vec(
                // Records (if any), aborted transactions, whether the records are external.
                prop::collection::vec((prop::option::of(0usize..3000), any::<bool>(), any::<bool>()), 0..5),
                0..4,
            ),
            tagged in any::<bool>(),
            min_shared_bytes in 0usize..2000,
            shuffle in any::<u64>(),
        ) {
            let mut full = response(
                topics
                    .iter()
                    .map(|ps| ps.iter().enumerate().map(|(i, (_, a, _))| partition(i as i32, None, *a)).collect())
                    .collect(),
                77,
            );
            let mut at = Vec::new();
            for (t, ps) in topics.iter().enumerate() {
                for (i, (r, _, ext)) in ps.iter().enumerate() {
                    full.responses[t].partitions[i].records = r.map(|n| records(n, 5 * t + i));
                    if *ext && r.is_some_and(|n| n > 0) {
                        at.push((t, i));
                    }
                }
            }
            let tagged = tagged && version >= 12 && !full.responses.is_empty() && !full.responses[0].partitions.is_empty();
            if tagged {
                full.responses[0].partitions[0].snapshot_id.epoch = 3;
            }
            let full = for_version(full, version);
            let (resp, mut external) = take_out(&full, &at);
            // Any order of entries (Fisher-Yates with a xorshift generator).
            let mut x = shuffle | 1;
            for i in (1..external.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                external.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let result = encode_fetch_response_with(11, version, resp, min_shared_bytes, external);
            if tagged && !at.is_empty() {
                prop_assert!(result.is_err());
            } else {
                let pieces = result.unwrap();
                prop_assert_eq!(externals(&pieces), at.len());
                prop_assert_eq!(fill(&pieces), whole(&full, version));
            }
        }
    }

    #[test]
    fn external_records_leave_one_hole_between_two_segments() {
        for version in 4..=18 {
            let full = for_version(
                response(
                    vec![vec![
                        partition(0, Some(100_000), false),
                        partition(1, Some(10), true),
                    ]],
                    9,
                ),
                version,
            );
            let (resp, external) = take_out(&full, &[(0, 0)]);
            let pieces = encode_fetch_response_with(11, version, resp, 4096, external).unwrap();
            assert_eq!(fill(&pieces), whole(&full, version), "v{version}");
            assert!(
                matches!(
                    &pieces[..],
                    [Piece::Bytes(_), Piece::External(r), Piece::Bytes(_)] if r.len() == 100_000
                ),
                "v{version}: head, hole, rest"
            );
        }
    }

    #[test]
    fn external_lengths_around_varint_boundaries_are_counted() {
        // n + 1 changes varint width at 127/128, 16383/16384 and 2097151/2097152.
        let lens = [1, 2, 126, 127, 128, 16_382, 16_383, 16_384, 2_097_150, 2_097_151];
        for version in 4..=18 {
            for len in lens {
                let full = for_version(
                    response(
                        vec![
                            vec![partition(0, Some(len), true), partition(1, Some(3), false)],
                            vec![partition(0, Some(5000), false), partition(1, Some(len), false)],
                        ],
                        4,
                    ),
                    version,
                );
                // Two holes, entries out of order; shared records between them.
                let (resp, external) = take_out(&full, &[(1, 1), (0, 0)]);
                let pieces = encode_fetch_response_with(11, version, resp, 1000, external).unwrap();
                assert_eq!(externals(&pieces), 2);
                assert_eq!(fill(&pieces), whole(&full, version), "v{version} len {len}");
            }
        }
    }

    #[test]
    fn external_records_that_do_not_fit_the_response_are_errors() {
        let entry = |topic, partition, len| ExternalRecords {
            topic,
            partition,
            len,
            item: (),
        };
        for version in 4..=18 {
            let resp = for_version(
                response(
                    vec![
                        vec![partition(0, Some(0), false), partition(1, Some(10), false)],
                        vec![partition(0, None, false), partition(1, Some(0), false)],
                    ],
                    2,
                ),
                version,
            );
            let encode = |resp: &FetchResponse, external| {
                encode_fetch_response_with(11, version, resp.clone(), 4096, external)
            };
            // The valid case, which each error case changes in one way.
            let ok = encode(&resp, vec![entry(1, 1, 20), entry(0, 0, 10)]).unwrap();
            assert_eq!(ok.iter().filter(|p| matches!(p, Piece::External(()))).count(), 2);

            let mut tagged = resp.clone();
            tagged.responses[1].partitions[0].diverging_epoch = EpochEndOffset::default().with_epoch(4);
            assert!(encode(&tagged, vec![]).is_ok(), "v{version}");
            // Each error says what is wrong (not just that a later consistency check failed).
            let cases = [
                ("not empty", &resp, vec![entry(1, 1, 20), entry(0, 1, 10)]),
                ("null or not empty", &resp, vec![entry(1, 0, 20), entry(0, 0, 10)]),
                (
                    "not in the response",
                    &resp,
                    vec![entry(1, 1, 20), entry(2, 0, 10)],
                ),
                (
                    "not in the response",
                    &resp,
                    vec![entry(1, 2, 20), entry(0, 0, 10)],
                ),
                (
                    "two external records",
                    &resp,
                    vec![entry(1, 1, 20), entry(0, 0, 10), entry(1, 1, 20)],
                ),
                ("0 bytes", &resp, vec![entry(1, 1, 0), entry(0, 0, 10)]),
                (
                    "too large",
                    &resp,
                    vec![entry(1, 1, i32::MAX as usize), entry(0, 0, 10)],
                ),
                ("tagged fields", &tagged, vec![entry(1, 1, 20), entry(0, 0, 10)]),
            ];
            for (what, resp, external) in cases {
                let e = encode(resp, external).unwrap_err();
                assert!(
                    format!("{e}").contains(what),
                    "v{version}: expected {what:?}, got {e}"
                );
            }
        }
    }
}
