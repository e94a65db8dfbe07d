//! The raw Kafka client of the exact-protocol and bad-input tests (shared with the tools, see
//! [`strand_tools::kafka_wire`]), and a walk over the record batches of a log segment file.
//!
//! [`RawConn::request`] sends one typed request (any version the `kafka-protocol` crate
//! knows) and decodes the answer, checking the correlation id and that the whole frame was
//! consumed. [`RawConn::raw_request`] sends any encodable body under any API key and
//! returns the answer undecoded; [`RawConn::send_frame`] / [`RawConn::send_bytes`] put
//! arbitrary bytes on the wire and [`RawConn::expect_closed`] checks that the broker closed
//! the connection.

pub use strand_tools::kafka_wire::{
    encode_batch, encode_batch_at, encode_idempotent_batch, record, request_frame, RawConn, ResponseBytes,
    DEFAULT_CLIENT_ID as CLIENT_ID,
};

/// One record batch's position in a log segment file, as walked by [`walk_batches`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPos {
    /// Byte position of the batch in the file.
    pub position: u64,
    /// Total size (12-byte prefix + length).
    pub size: u64,
    /// Base offset.
    pub base_offset: i64,
    /// Last offset (base offset + last offset delta).
    pub last_offset: i64,
}

/// Walks the complete v2 record batches at the start of a segment file (8-byte base
/// offset, 4-byte length, ..., CRC-32C over attributes..end). Stops at the first incomplete,
/// implausible or CRC-failing batch (a torn tail, zero pre-allocation); returns the valid
/// batches and the byte length they cover.
pub fn walk_batches(file: &[u8]) -> (Vec<BatchPos>, u64) {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + 61 <= file.len() {
        let b = &file[pos..];
        let base_offset = i64::from_be_bytes(b[0..8].try_into().expect("8 bytes"));
        let length = i32::from_be_bytes(b[8..12].try_into().expect("4 bytes"));
        let magic = b[16];
        if length < 49 || magic != 2 || base_offset < 0 {
            break;
        }
        let size = 12 + length as usize;
        if pos + size > file.len() {
            break;
        }
        let crc = u32::from_be_bytes(b[17..21].try_into().expect("4 bytes"));
        if crc32c::crc32c(&b[21..size]) != crc {
            break;
        }
        let last_delta = i32::from_be_bytes(b[23..27].try_into().expect("4 bytes"));
        out.push(BatchPos {
            position: pos as u64,
            size: size as u64,
            base_offset,
            last_offset: base_offset + i64::from(last_delta),
        });
        pos += size;
    }
    (out, pos as u64)
}
