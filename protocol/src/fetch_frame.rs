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

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{ApiKey, FetchResponse, ResponseHeader};
use kafka_protocol::protocol::Encodable;

use crate::header::{encode_response, EncodeError};

/// First version with compact lengths and tagged fields.
const FIRST_FLEXIBLE: i16 = 12;

fn err(msg: String) -> EncodeError {
    EncodeError(anyhow::anyhow!(msg))
}

/// Whether every level's tagged fields are absent (then each level ends in its last field).
fn splittable(resp: &FetchResponse) -> bool {
    resp.node_endpoints.is_empty()
        && resp.unknown_tagged_fields.is_empty()
        && resp.responses.iter().all(|t| {
            t.unknown_tagged_fields.is_empty()
                && t.partitions.iter().all(|p| {
                    p.unknown_tagged_fields.is_empty()
                        && p.diverging_epoch == Default::default()
                        && p.current_leader == Default::default()
                        && p.snapshot_id == Default::default()
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

/// Segments being built: finished ones, and the buffer the next one is encoded into.
struct Segments {
    done: Vec<Bytes>,
    cur: BytesMut,
    flexible: bool,
}

impl Segments {
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

    /// Appends `shared` as its own segment.
    fn share(&mut self, shared: Bytes) {
        if shared.is_empty() {
            return;
        }
        if !self.cur.is_empty() {
            self.done.push(self.cur.split().freeze());
        }
        self.done.push(shared);
    }

    fn finish(mut self) -> Vec<Bytes> {
        if !self.cur.is_empty() {
            self.done.push(self.cur.freeze());
        }
        self.done
    }
}

fn put_unsigned_varint(buf: &mut BytesMut, mut n: u32) {
    while n >= 0x80 {
        buf.put_u8((n as u8) | 0x80);
        n >>= 7;
    }
    buf.put_u8(n as u8);
}

/// Encodes a complete Fetch response frame (size prefix, header, body) as segments whose
/// concatenation is the frame. Records of at least `min_shared_bytes` are not copied.
pub fn encode_fetch_response(
    correlation_id: i32,
    version: i16,
    mut resp: FetchResponse,
    min_shared_bytes: usize,
) -> Result<Vec<Bytes>, EncodeError> {
    if !splittable(&resp) || !shares_any(&resp, min_shared_bytes) {
        return encode_response(correlation_id, ApiKey::Fetch, version, &resp).map(|b| vec![b]);
    }
    let header_version = ApiKey::Fetch.response_header_version(version);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let size = header.compute_size(header_version).map_err(EncodeError)?
        + resp.compute_size(version).map_err(EncodeError)?;
    let size_i32 = i32::try_from(size).map_err(|_| err(format!("response of {size} bytes is too large")))?;

    let mut out = Segments {
        done: Vec::new(),
        cur: BytesMut::with_capacity(4096),
        flexible: version >= FIRST_FLEXIBLE,
    };
    out.cur.put_i32(size_i32);
    header.encode(&mut out.cur, header_version).map_err(EncodeError)?;

    let topics = std::mem::take(&mut resp.responses);
    out.open(&resp, version, "the response")?;
    out.length(topics.len())?;
    for mut topic in topics {
        let partitions = std::mem::take(&mut topic.partitions);
        out.open::<FetchableTopicResponse>(&topic, version, "a topic")?;
        out.length(partitions.len())?;
        for mut p in partitions {
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

    let parts = out.finish();
    let written: usize = parts.iter().map(Bytes::len).sum();
    if written != 4 + size {
        return Err(err(format!(
            "segmented Fetch response is {written} bytes, expected {}",
            4 + size
        )));
    }
    Ok(parts)
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
        }
    }
}
