//! Kafka v2 record batches, handled as opaque bytes with a parsed header.
//!
//! Strand stores and serves batches exactly as producers sent them. The only bytes the broker
//! ever changes are `baseOffset` and `partitionLeaderEpoch`, which sit before the CRC-covered
//! region, so patching them never invalidates the CRC. Every batch is checked by CRC when it is
//! accepted and again whenever it is read back from disk for recovery.
//!
//! Layout (all big-endian):
//!
//! | bytes   | field                  |
//! |---------|------------------------|
//! | 0..8    | baseOffset             |
//! | 8..12   | batchLength (bytes after this field) |
//! | 12..16  | partitionLeaderEpoch   |
//! | 16      | magic (2)              |
//! | 17..21  | crc (CRC-32C of 21..)  |
//! | 21..23  | attributes             |
//! | 23..27  | lastOffsetDelta        |
//! | 27..35  | baseTimestamp          |
//! | 35..43  | maxTimestamp           |
//! | 43..51  | producerId             |
//! | 51..53  | producerEpoch          |
//! | 53..57  | baseSequence           |
//! | 57..61  | recordsCount           |
//! | 61..    | records                |

use kafka_protocol::ResponseError;

/// Size of the fixed batch header.
pub const BATCH_HEADER_BYTES: usize = 61;
/// `baseOffset` + `batchLength`: bytes before the length-counted part.
pub const LOG_OVERHEAD_BYTES: usize = 12;
/// The only record format Kafka 4 accepts.
pub const MAGIC_V2: i8 = 2;
const CRC_START: usize = 21;

/// Compression codec from the low three attribute bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("record batch is truncated: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    #[error("record batch length field {0} is invalid")]
    BadLength(i32),
    #[error("record batch magic {0} is not supported (only magic 2)")]
    BadMagic(i8),
    #[error("record batch CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("record batch uses unknown compression codec id {0}")]
    BadCompression(u8),
    #[error("record batch lastOffsetDelta {last_offset_delta} does not match recordsCount {records_count}")]
    RecordCountMismatch {
        last_offset_delta: i32,
        records_count: i32,
    },
    #[error("record batch of {size} bytes exceeds the limit of {max} bytes (message.max.bytes)")]
    TooLarge { size: usize, max: usize },
    #[error("produce request carries no record batch")]
    Empty,
    #[error("produce request must carry exactly one record batch per partition")]
    MultipleBatches,
}

impl BatchError {
    /// The Kafka error code a produce response carries for this problem.
    pub fn kafka_error(&self) -> ResponseError {
        match self {
            BatchError::Truncated { .. } | BatchError::BadLength(_) | BatchError::CrcMismatch { .. } => {
                ResponseError::CorruptMessage
            }
            BatchError::BadCompression(_) => ResponseError::UnsupportedCompressionType,
            BatchError::TooLarge { .. } => ResponseError::MessageTooLarge,
            BatchError::BadMagic(_)
            | BatchError::RecordCountMismatch { .. }
            | BatchError::Empty
            | BatchError::MultipleBatches => ResponseError::InvalidRecord,
        }
    }
}

/// The parsed fixed header of one v2 record batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

struct Reader<'a> {
    bytes: &'a [u8; BATCH_HEADER_BYTES],
    pos: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        // The header is a fixed-size array and every field read below stays inside it.
        for (i, b) in out.iter_mut().enumerate() {
            *b = self.bytes.get(self.pos + i).copied().unwrap_or(0);
        }
        self.pos += N;
        out
    }
    fn i8(&mut self) -> i8 {
        i8::from_be_bytes(self.take())
    }
    fn i16(&mut self) -> i16 {
        i16::from_be_bytes(self.take())
    }
    fn i32(&mut self) -> i32 {
        i32::from_be_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take())
    }
    fn i64(&mut self) -> i64 {
        i64::from_be_bytes(self.take())
    }
}

impl BatchHeader {
    /// Parses the header at the front of `bytes`. Checks the magic byte and that the length
    /// field is at least a full header; does not check the CRC or that the body is present.
    pub fn parse(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
        let fixed: &[u8; BATCH_HEADER_BYTES] =
            bytes
                .first_chunk::<BATCH_HEADER_BYTES>()
                .ok_or(BatchError::Truncated {
                    needed: BATCH_HEADER_BYTES,
                    available: bytes.len(),
                })?;
        let mut r = Reader { bytes: fixed, pos: 0 };
        let header = BatchHeader {
            base_offset: r.i64(),
            batch_length: r.i32(),
            partition_leader_epoch: r.i32(),
            magic: r.i8(),
            crc: r.u32(),
            attributes: r.i16(),
            last_offset_delta: r.i32(),
            base_timestamp: r.i64(),
            max_timestamp: r.i64(),
            producer_id: r.i64(),
            producer_epoch: r.i16(),
            base_sequence: r.i32(),
            records_count: r.i32(),
        };
        if header.magic != MAGIC_V2 {
            return Err(BatchError::BadMagic(header.magic));
        }
        if header.batch_length < (BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES) as i32 {
            return Err(BatchError::BadLength(header.batch_length));
        }
        Ok(header)
    }

    /// Total size of the batch on the wire and on disk, including offset and length fields.
    pub fn total_bytes(&self) -> usize {
        LOG_OVERHEAD_BYTES + self.batch_length.max(0) as usize
    }

    pub fn compression(&self) -> Result<Compression, BatchError> {
        match self.attributes & 0x07 {
            0 => Ok(Compression::None),
            1 => Ok(Compression::Gzip),
            2 => Ok(Compression::Snappy),
            3 => Ok(Compression::Lz4),
            4 => Ok(Compression::Zstd),
            other => Err(BatchError::BadCompression(other as u8)),
        }
    }

    /// Timestamp type bit: `true` for LogAppendTime, `false` for CreateTime.
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & 0x08 != 0
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & 0x10 != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & 0x20 != 0
    }

    /// Offset of the last record in the batch.
    pub fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta)
    }

    /// Offset after the last record in the batch.
    pub fn next_offset(&self) -> i64 {
        self.last_offset() + 1
    }

    /// Number of offsets the batch occupies.
    pub fn offset_count(&self) -> i64 {
        i64::from(self.last_offset_delta) + 1
    }

    /// Whether the batch was written by an idempotent or transactional producer.
    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }
}

/// CRC-32C of the CRC-covered region of a batch (attributes to end).
pub fn compute_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(batch.get(CRC_START..).unwrap_or(&[]))
}

/// Checks one complete batch that starts at the front of `bytes`: header, length, CRC.
/// Returns the header; the batch occupies `header.total_bytes()` bytes.
pub fn check_batch(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(bytes)?;
    let total = header.total_bytes();
    let batch = bytes.get(..total).ok_or(BatchError::Truncated {
        needed: total,
        available: bytes.len(),
    })?;
    let computed = compute_crc(batch);
    if computed != header.crc {
        return Err(BatchError::CrcMismatch {
            stored: header.crc,
            computed,
        });
    }
    header.compression()?;
    Ok(header)
}

/// Validates the `records` of one partition in a Produce request: exactly one v2 batch,
/// consistent lengths, known codec, matching CRC, offsets consistent with the record count,
/// and no larger than `max_batch_bytes`.
///
/// Compressed batches are not decompressed: they are stored and served as received.
pub fn validate_produce_batch(records: &[u8], max_batch_bytes: usize) -> Result<BatchHeader, BatchError> {
    if records.is_empty() {
        return Err(BatchError::Empty);
    }
    let header = BatchHeader::parse(records)?;
    let total = header.total_bytes();
    if total > max_batch_bytes {
        return Err(BatchError::TooLarge {
            size: total,
            max: max_batch_bytes,
        });
    }
    if total < records.len() {
        return Err(BatchError::MultipleBatches);
    }
    let header = check_batch(records)?;
    if header.records_count <= 0 || header.last_offset_delta != header.records_count - 1 {
        return Err(BatchError::RecordCountMismatch {
            last_offset_delta: header.last_offset_delta,
            records_count: header.records_count,
        });
    }
    Ok(header)
}

/// Rewrites `baseOffset` and `partitionLeaderEpoch` of the batch at the front of `batch`.
/// Both lie outside the CRC-covered region, so the stored CRC stays valid.
pub fn patch_batch(batch: &mut [u8], base_offset: i64, leader_epoch: i32) {
    if let Some(dst) = batch.get_mut(0..8) {
        dst.copy_from_slice(&base_offset.to_be_bytes());
    }
    if let Some(dst) = batch.get_mut(12..16) {
        dst.copy_from_slice(&leader_epoch.to_be_bytes());
    }
}

/// Turns a batch into a LogAppendTime batch stamped `timestamp_ms` (topics with
/// `message.timestamp.type=LogAppendTime`): sets the timestamp-type attribute and the max
/// timestamp, which consumers then report for every record, and recomputes the CRC.
pub fn set_log_append_time(batch: &mut [u8], timestamp_ms: i64) {
    if batch.len() < BATCH_HEADER_BYTES {
        return;
    }
    if let Some(attr) = batch.get_mut(21..23).and_then(|a| a.first_chunk_mut::<2>()) {
        let a = i16::from_be_bytes(*attr) | 0x08;
        *attr = a.to_be_bytes();
    }
    if let Some(dst) = batch.get_mut(35..43) {
        dst.copy_from_slice(&timestamp_ms.to_be_bytes());
    }
    let crc = compute_crc(batch);
    if let Some(dst) = batch.get_mut(17..21) {
        dst.copy_from_slice(&crc.to_be_bytes());
    }
}

/// Where one batch lies in a buffer of consecutive batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPosition {
    /// Byte position of the batch in the scanned buffer.
    pub position: usize,
    pub header: BatchHeader,
}

/// Why a scan of consecutive batches stopped before the end of its buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanStop {
    /// The buffer ended exactly after a whole batch.
    Clean,
    /// The buffer ends inside a batch (a torn write, or a read window that cut it).
    Incomplete { position: usize },
    /// A batch at `position` is corrupt.
    Corrupt { position: usize, error: BatchError },
}

/// Iterates consecutive batches in `buf`, checking each one's CRC when `verify_crc` is set.
/// Yields complete, valid batches; [`BatchScanner::stop`] tells why iteration ended.
pub struct BatchScanner<'a> {
    buf: &'a [u8],
    pos: usize,
    verify_crc: bool,
    stop: Option<ScanStop>,
}

impl<'a> BatchScanner<'a> {
    pub fn new(buf: &'a [u8], verify_crc: bool) -> Self {
        BatchScanner {
            buf,
            pos: 0,
            verify_crc,
            stop: None,
        }
    }

    /// Byte position after the last batch yielded.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Why the scan ended; `None` until the iterator has returned `None`.
    pub fn stop(&self) -> Option<&ScanStop> {
        self.stop.as_ref()
    }
}

impl Iterator for BatchScanner<'_> {
    type Item = BatchPosition;

    fn next(&mut self) -> Option<BatchPosition> {
        if self.stop.is_some() {
            return None;
        }
        let rest = self.buf.get(self.pos..).unwrap_or(&[]);
        if rest.is_empty() {
            self.stop = Some(ScanStop::Clean);
            return None;
        }
        let parsed = if self.verify_crc {
            check_batch(rest)
        } else {
            BatchHeader::parse(rest).and_then(|h| {
                if h.total_bytes() > rest.len() {
                    Err(BatchError::Truncated {
                        needed: h.total_bytes(),
                        available: rest.len(),
                    })
                } else {
                    Ok(h)
                }
            })
        };
        match parsed {
            Ok(header) => {
                let position = self.pos;
                self.pos += header.total_bytes();
                Some(BatchPosition { position, header })
            }
            Err(BatchError::Truncated { .. }) => {
                self.stop = Some(ScanStop::Incomplete { position: self.pos });
                None
            }
            Err(error) => {
                self.stop = Some(ScanStop::Corrupt {
                    position: self.pos,
                    error,
                });
                None
            }
        }
    }
}

/// Builds an uncompressed v2 batch. For tests, tools and internal topics; never used on the
/// produce or fetch path.
pub mod build {
    use super::*;

    /// One record to put in a batch built by [`batch`].
    #[derive(Debug, Clone, Default)]
    pub struct TestRecord<'a> {
        pub key: Option<&'a [u8]>,
        pub value: Option<&'a [u8]>,
        pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
        pub timestamp_delta: i64,
    }

    fn put_varint(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            if z < 0x80 {
                out.push(z as u8);
                return;
            }
            out.push((z as u8 & 0x7f) | 0x80);
            z >>= 7;
        }
    }

    fn put_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
        match b {
            None => put_varint(out, -1),
            Some(b) => {
                put_varint(out, b.len() as i64);
                out.extend_from_slice(b);
            }
        }
    }

    /// Encodes `records` as one uncompressed batch with the given base timestamp.
    pub fn batch(records: &[TestRecord<'_>], base_timestamp: i64) -> Vec<u8> {
        batch_with_producer(records, base_timestamp, -1, -1, -1)
    }

    /// Like [`batch`], with idempotent-producer fields.
    pub fn batch_with_producer(
        records: &[TestRecord<'_>],
        base_timestamp: i64,
        producer_id: i64,
        producer_epoch: i16,
        base_sequence: i32,
    ) -> Vec<u8> {
        let mut body = Vec::new();
        let mut max_ts = base_timestamp;
        for (i, r) in records.iter().enumerate() {
            let mut rec = Vec::new();
            rec.push(0u8);
            put_varint(&mut rec, r.timestamp_delta);
            put_varint(&mut rec, i as i64);
            put_bytes(&mut rec, r.key);
            put_bytes(&mut rec, r.value);
            put_varint(&mut rec, r.headers.len() as i64);
            for (k, v) in &r.headers {
                put_bytes(&mut rec, Some(k.as_bytes()));
                put_bytes(&mut rec, *v);
            }
            put_varint(&mut body, rec.len() as i64);
            body.extend_from_slice(&rec);
            max_ts = max_ts.max(base_timestamp + r.timestamp_delta);
        }
        let mut out = Vec::with_capacity(BATCH_HEADER_BYTES + body.len());
        out.extend_from_slice(&0i64.to_be_bytes());
        let batch_length = (BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES + body.len()) as i32;
        out.extend_from_slice(&batch_length.to_be_bytes());
        out.extend_from_slice(&(-1i32).to_be_bytes());
        out.push(MAGIC_V2 as u8);
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&0i16.to_be_bytes());
        let last_delta = records.len() as i32 - 1;
        out.extend_from_slice(&last_delta.to_be_bytes());
        out.extend_from_slice(&base_timestamp.to_be_bytes());
        out.extend_from_slice(&max_ts.to_be_bytes());
        out.extend_from_slice(&producer_id.to_be_bytes());
        out.extend_from_slice(&producer_epoch.to_be_bytes());
        out.extend_from_slice(&base_sequence.to_be_bytes());
        out.extend_from_slice(&(records.len() as i32).to_be_bytes());
        out.extend_from_slice(&body);
        let crc = compute_crc(&out);
        if let Some(dst) = out.get_mut(17..21) {
            dst.copy_from_slice(&crc.to_be_bytes());
        }
        out
    }

    /// A batch of `n` records with small distinct values.
    pub fn simple(n: usize, base_timestamp: i64) -> Vec<u8> {
        let values: Vec<Vec<u8>> = (0..n).map(|i| format!("value-{i}").into_bytes()).collect();
        let recs: Vec<TestRecord<'_>> = values
            .iter()
            .enumerate()
            .map(|(i, v)| TestRecord {
                key: None,
                value: Some(v),
                headers: vec![],
                timestamp_delta: i as i64,
            })
            .collect();
        batch(&recs, base_timestamp)
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    #[test]
    fn built_batch_validates() {
        let b = simple(3, 1_000);
        let h = validate_produce_batch(&b, 1 << 20).unwrap();
        assert_eq!(h.records_count, 3);
        assert_eq!(h.last_offset_delta, 2);
        assert_eq!(h.max_timestamp, 1_002);
        assert_eq!(h.total_bytes(), b.len());
        assert_eq!(h.compression().unwrap(), Compression::None);
    }

    #[test]
    fn patch_keeps_crc_valid() {
        let mut b = simple(2, 5);
        patch_batch(&mut b, 1234, 7);
        let h = check_batch(&b).unwrap();
        assert_eq!(
            (h.base_offset, h.partition_leader_epoch, h.last_offset()),
            (1234, 7, 1235)
        );
    }

    #[test]
    fn log_append_time_rewrite_keeps_batch_valid() {
        let mut b = simple(2, 5);
        set_log_append_time(&mut b, 99_000);
        let h = check_batch(&b).unwrap();
        assert!(h.is_log_append_time());
        assert_eq!((h.base_timestamp, h.max_timestamp), (5, 99_000));
    }

    #[test]
    fn rejects_each_kind_of_bad_batch() {
        let good = simple(2, 5);
        let mut bad_crc = good.clone();
        *bad_crc.last_mut().unwrap() ^= 1;
        assert!(matches!(
            validate_produce_batch(&bad_crc, 1 << 20),
            Err(BatchError::CrcMismatch { .. })
        ));
        assert_eq!(
            validate_produce_batch(&bad_crc, 1 << 20)
                .unwrap_err()
                .kafka_error(),
            ResponseError::CorruptMessage
        );

        let mut bad_magic = good.clone();
        bad_magic[16] = 1;
        assert_eq!(
            validate_produce_batch(&bad_magic, 1 << 20),
            Err(BatchError::BadMagic(1))
        );

        assert!(matches!(
            validate_produce_batch(&good[..40], 1 << 20),
            Err(BatchError::Truncated { .. })
        ));
        assert!(matches!(
            validate_produce_batch(&good[..good.len() - 1], 1 << 20),
            Err(BatchError::Truncated { .. })
        ));
        assert!(matches!(
            validate_produce_batch(&good, 10),
            Err(BatchError::TooLarge { .. })
        ));
        let mut two = good.clone();
        two.extend_from_slice(&good);
        assert_eq!(
            validate_produce_batch(&two, 1 << 20),
            Err(BatchError::MultipleBatches)
        );
        assert_eq!(validate_produce_batch(&[], 1 << 20), Err(BatchError::Empty));

        let mut bad_codec = good.clone();
        bad_codec[22] |= 0x07;
        let crc = compute_crc(&bad_codec);
        bad_codec[17..21].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(
            validate_produce_batch(&bad_codec, 1 << 20),
            Err(BatchError::BadCompression(7))
        );

        let mut bad_count = good.clone();
        bad_count[57..61].copy_from_slice(&5i32.to_be_bytes());
        let crc = compute_crc(&bad_count);
        bad_count[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            validate_produce_batch(&bad_count, 1 << 20),
            Err(BatchError::RecordCountMismatch { .. })
        ));
    }

    #[test]
    fn scanner_reports_torn_and_corrupt_tails() {
        let a = simple(1, 1);
        let b = simple(2, 2);
        let mut buf = a.clone();
        buf.extend_from_slice(&b);
        let all: Vec<_> = BatchScanner::new(&buf, true).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].position, a.len());

        let torn = &buf[..buf.len() - 3];
        let mut s = BatchScanner::new(torn, true);
        assert_eq!(s.by_ref().count(), 1);
        assert_eq!(s.stop(), Some(&ScanStop::Incomplete { position: a.len() }));

        let mut corrupt = buf.clone();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        let mut s = BatchScanner::new(&corrupt, true);
        assert_eq!(s.by_ref().count(), 1);
        assert!(matches!(s.stop(), Some(ScanStop::Corrupt { position, .. }) if *position == a.len()));
    }
}
