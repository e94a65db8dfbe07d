//! Record-level view of a batch: offsets and timestamps of the records inside.
//!
//! Only slow paths need this (ListOffsets by timestamp, max-timestamp bookkeeping). The produce
//! and fetch paths never look inside a batch. Decompression is bounded, so a compression bomb
//! stored by a producer cannot exhaust memory when the broker looks inside it.

use std::io::Read;

use bytes::Bytes;

use crate::batch::{check_batch, BatchError, BatchHeader, Compression, BATCH_HEADER_BYTES};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error("records decompress to more than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("cannot decompress {codec} records: {message}")]
    Decompress { codec: &'static str, message: String },
    #[error("malformed record at byte {position} of the records section")]
    Malformed { position: usize },
}

/// Offset and timestamp of one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordMeta {
    pub offset: i64,
    pub timestamp: i64,
}

/// One record of a batch, fully decoded. Key, value and header values share the batch's buffer
/// when the batch is uncompressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(Bytes, Option<Bytes>)>,
}

/// Decodes every record of the batch at the front of `batch` (internal topics, the queue
/// engine, tools — never the produce or fetch path). Checks the CRC; decompresses at most
/// `max_decompressed_bytes`.
pub fn decode_records(batch: &Bytes, max_decompressed_bytes: usize) -> Result<Vec<Record>, RecordError> {
    let header = check_batch(batch)?;
    let body = batch
        .get(BATCH_HEADER_BYTES..header.total_bytes())
        .map(|_| batch.slice(BATCH_HEADER_BYTES..header.total_bytes()))
        .ok_or(BatchError::Truncated {
            needed: header.total_bytes(),
            available: batch.len(),
        })?;
    let records = match header.compression()? {
        Compression::None => body,
        codec => Bytes::from(decompress(codec, &body, max_decompressed_bytes)?),
    };
    let count = usize::try_from(header.records_count).unwrap_or(0);
    let mut out = Vec::with_capacity(count.min(records.len()));
    let mut pos = 0usize;
    for _ in 0..count {
        let bad = || RecordError::Malformed { position: pos };
        let mut cur = records.get(pos..).ok_or_else(bad)?;
        let before = cur.len();
        let len = usize::try_from(read_varint(&mut cur).ok_or_else(bad)?).map_err(|_| bad())?;
        let start = pos + (before - cur.len());
        let end = start
            .checked_add(len)
            .filter(|e| *e <= records.len())
            .ok_or_else(bad)?;
        let rec = records.slice(start..end);
        out.push(decode_one(&header, &rec).ok_or(RecordError::Malformed { position: start })?);
        pos = end;
    }
    Ok(out)
}

fn decode_one(header: &BatchHeader, rec: &Bytes) -> Option<Record> {
    let mut cur: &[u8] = rec;
    let (_attributes, rest) = cur.split_first()?;
    cur = rest;
    let ts_delta = read_varint(&mut cur)?;
    let offset_delta = read_varint(&mut cur)?;
    let take = |cur: &mut &[u8]| -> Option<Option<Bytes>> {
        let len = read_varint(cur)?;
        if len < 0 {
            return Some(None);
        }
        let len = usize::try_from(len).ok()?;
        let at = rec.len() - cur.len();
        let bytes = rec
            .get(at..at.checked_add(len)?)
            .map(|_| rec.slice(at..at + len))?;
        *cur = cur.get(len..)?;
        Some(Some(bytes))
    };
    let key = take(&mut cur)?;
    let value = take(&mut cur)?;
    let n = usize::try_from(read_varint(&mut cur)?).ok()?;
    let mut headers = Vec::with_capacity(n.min(cur.len()));
    for _ in 0..n {
        let k = take(&mut cur)??;
        let v = take(&mut cur)?;
        headers.push((k, v));
    }
    Some(Record {
        offset: header.base_offset.wrapping_add(offset_delta),
        timestamp: if header.is_log_append_time() {
            header.max_timestamp
        } else {
            header.base_timestamp.wrapping_add(ts_delta)
        },
        key,
        value,
        headers,
    })
}

/// Offsets and timestamps of all records of the batch at the front of `batch`, in order.
/// Checks the CRC; decompresses at most `max_decompressed_bytes`.
pub fn record_metas(batch: &[u8], max_decompressed_bytes: usize) -> Result<Vec<RecordMeta>, RecordError> {
    let header = check_batch(batch)?;
    let body = batch
        .get(BATCH_HEADER_BYTES..header.total_bytes())
        .ok_or(BatchError::Truncated {
            needed: header.total_bytes(),
            available: batch.len(),
        })?;
    let codec = header.compression()?;
    let owned;
    let records: &[u8] = if codec == Compression::None {
        body
    } else {
        owned = decompress(codec, body, max_decompressed_bytes)?;
        &owned
    };
    parse_metas(&header, records)
}

fn parse_metas(header: &BatchHeader, mut records: &[u8]) -> Result<Vec<RecordMeta>, RecordError> {
    let count = usize::try_from(header.records_count).unwrap_or(0);
    let mut out = Vec::with_capacity(count.min(records.len()));
    let total = records.len();
    for _ in 0..count {
        let position = total - records.len();
        let bad = || RecordError::Malformed { position };
        let len = read_varint(&mut records).ok_or_else(bad)?;
        let len = usize::try_from(len).map_err(|_| bad())?;
        let mut rec = records.get(..len).ok_or_else(bad)?;
        records = records.get(len..).ok_or_else(bad)?;
        let (_attributes, rest) = rec.split_first().ok_or_else(bad)?;
        rec = rest;
        let ts_delta = read_varint(&mut rec).ok_or_else(bad)?;
        let offset_delta = read_varint(&mut rec).ok_or_else(bad)?;
        let timestamp = if header.is_log_append_time() {
            header.max_timestamp
        } else {
            header.base_timestamp.wrapping_add(ts_delta)
        };
        out.push(RecordMeta {
            offset: header.base_offset.wrapping_add(offset_delta),
            timestamp,
        });
    }
    Ok(out)
}

/// Zig-zag varint (up to 64 bits) as used inside records.
fn read_varint(buf: &mut &[u8]) -> Option<i64> {
    let mut value: u64 = 0;
    for i in 0..10 {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    None
}

const XERIAL_MAGIC: &[u8] = &[0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];

/// Decompresses a records section with an output limit.
pub fn decompress(codec: Compression, input: &[u8], limit: usize) -> Result<Vec<u8>, RecordError> {
    let err = |message: String| RecordError::Decompress {
        codec: codec.name(),
        message,
    };
    match codec {
        Compression::None => Ok(input.to_vec()),
        Compression::Gzip => {
            read_bounded(flate2::read::GzDecoder::new(input), limit).map_err(|e| map_io(e, limit, err))
        }
        Compression::Zstd => {
            let dec = zstd::stream::read::Decoder::new(input).map_err(|e| err(e.to_string()))?;
            read_bounded(dec, limit).map_err(|e| map_io(e, limit, err))
        }
        Compression::Lz4 => {
            let dec = lz4::Decoder::new(input).map_err(|e| err(e.to_string()))?;
            read_bounded(dec, limit).map_err(|e| map_io(e, limit, err))
        }
        Compression::Snappy => {
            if input.starts_with(XERIAL_MAGIC) {
                snappy_xerial(input, limit).map_err(|m| match m {
                    SnappyFail::TooLarge => RecordError::TooLarge { limit },
                    SnappyFail::Bad(m) => err(m),
                })
            } else {
                snappy_block(input, limit).map_err(|m| match m {
                    SnappyFail::TooLarge => RecordError::TooLarge { limit },
                    SnappyFail::Bad(m) => err(m),
                })
            }
        }
    }
}

enum SnappyFail {
    TooLarge,
    Bad(String),
}

fn snappy_block(input: &[u8], limit: usize) -> Result<Vec<u8>, SnappyFail> {
    let len = snap::raw::decompress_len(input).map_err(|e| SnappyFail::Bad(e.to_string()))?;
    if len > limit {
        return Err(SnappyFail::TooLarge);
    }
    snap::raw::Decoder::new()
        .decompress_vec(input)
        .map_err(|e| SnappyFail::Bad(e.to_string()))
}

/// Snappy in the framing of the Java `xerial` library: a 16-byte header, then blocks of
/// `[u32 compressed length][raw snappy block]`.
fn snappy_xerial(input: &[u8], limit: usize) -> Result<Vec<u8>, SnappyFail> {
    let mut rest = input
        .get(16..)
        .ok_or_else(|| SnappyFail::Bad("short xerial header".into()))?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len_bytes = rest
            .first_chunk::<4>()
            .ok_or_else(|| SnappyFail::Bad("short xerial block length".into()))?;
        let len = u32::from_be_bytes(*len_bytes) as usize;
        let block = rest
            .get(4..4 + len)
            .ok_or_else(|| SnappyFail::Bad("xerial block runs past the input".into()))?;
        let part = snappy_block(block, limit.saturating_sub(out.len()))?;
        out.extend_from_slice(&part);
        rest = rest.get(4 + len..).unwrap_or(&[]);
    }
    Ok(out)
}

fn read_bounded<R: Read>(reader: R, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    reader.take(limit as u64 + 1).read_to_end(&mut out)?;
    if out.len() > limit {
        return Err(std::io::Error::new(std::io::ErrorKind::OutOfMemory, "limit"));
    }
    Ok(out)
}

fn map_io(e: std::io::Error, limit: usize, err: impl Fn(String) -> RecordError) -> RecordError {
    if e.kind() == std::io::ErrorKind::OutOfMemory {
        RecordError::TooLarge { limit }
    } else {
        err(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::build;

    #[test]
    fn metas_of_uncompressed_batch() {
        let mut b = build::simple(3, 100);
        crate::batch::patch_batch(&mut b, 40, 0);
        let metas = record_metas(&b, 1 << 20).unwrap();
        assert_eq!(
            metas,
            vec![
                RecordMeta {
                    offset: 40,
                    timestamp: 100
                },
                RecordMeta {
                    offset: 41,
                    timestamp: 101
                },
                RecordMeta {
                    offset: 42,
                    timestamp: 102
                },
            ]
        );
    }

    #[test]
    fn records_decode_with_keys_values_and_headers() {
        let recs = [
            build::TestRecord {
                key: Some(b"k1"),
                value: Some(b"v1"),
                headers: vec![("h", Some(b"x")), ("n", None)],
                timestamp_delta: 0,
            },
            build::TestRecord {
                key: None,
                value: None,
                headers: vec![],
                timestamp_delta: 5,
            },
        ];
        let mut b = build::batch(&recs, 1_000);
        crate::batch::patch_batch(&mut b, 10, 0);
        let got = decode_records(&Bytes::from(b), 1 << 20).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].offset, 10);
        assert_eq!(got[0].key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(got[0].value.as_deref(), Some(&b"v1"[..]));
        assert_eq!(got[0].headers[0].0.as_ref(), b"h");
        assert_eq!(got[0].headers[1].1, None);
        assert_eq!(
            (got[1].offset, got[1].timestamp, got[1].key.clone()),
            (11, 1_005, None)
        );
    }

    #[test]
    fn varints() {
        for v in [
            0i64,
            1,
            -1,
            63,
            -64,
            64,
            300,
            -300,
            i32::MAX as i64,
            i64::MAX,
            i64::MIN,
        ] {
            let mut buf = Vec::new();
            let mut z = ((v << 1) ^ (v >> 63)) as u64;
            loop {
                if z < 0x80 {
                    buf.push(z as u8);
                    break;
                }
                buf.push((z as u8 & 0x7f) | 0x80);
                z >>= 7;
            }
            let mut s = &buf[..];
            assert_eq!(read_varint(&mut s), Some(v));
            assert!(s.is_empty());
        }
        assert_eq!(read_varint(&mut &[0x80u8; 11][..]), None);
    }

    #[test]
    fn decompression_is_bounded() {
        let big = vec![0u8; 1 << 20];
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &big).unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(
            decompress(Compression::Gzip, &gz, 1 << 20).unwrap().len(),
            1 << 20
        );
        assert_eq!(
            decompress(Compression::Gzip, &gz, 1000),
            Err(RecordError::TooLarge { limit: 1000 })
        );
        let z = zstd::encode_all(&big[..], 1).unwrap();
        assert_eq!(
            decompress(Compression::Zstd, &z, 1000),
            Err(RecordError::TooLarge { limit: 1000 })
        );
        let s = snap::raw::Encoder::new().compress_vec(&big).unwrap();
        assert_eq!(
            decompress(Compression::Snappy, &s, 1000),
            Err(RecordError::TooLarge { limit: 1000 })
        );
        assert_eq!(decompress(Compression::Snappy, &s, 1 << 20).unwrap(), big);
    }
}
