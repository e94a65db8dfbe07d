//! Request headers and response framing.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};

/// The fixed-position start of every request header, readable before anything else is known:
/// enough to route a request, and to answer or log one that cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawHeader {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
}

impl RawHeader {
    pub fn peek(frame: &[u8]) -> Option<RawHeader> {
        let head: &[u8; 8] = frame.first_chunk::<8>()?;
        let [k0, k1, v0, v1, c0, c1, c2, c3] = *head;
        Some(RawHeader {
            api_key: i16::from_be_bytes([k0, k1]),
            api_version: i16::from_be_bytes([v0, v1]),
            correlation_id: i32::from_be_bytes([c0, c1, c2, c3]),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("frame is shorter than a request header")]
    Short,
    #[error("cannot decode request header: {0:#}")]
    Header(anyhow::Error),
    #[error("cannot decode {api:?} v{version} request body: {source:#}")]
    Body {
        api: ApiKey,
        version: i16,
        source: anyhow::Error,
    },
}

/// Decodes the request header of `frame` (whose api key is already known to be `api`)
/// and returns it with the remaining body bytes. Zero-copy: the body shares `frame`'s buffer.
pub fn decode_request_header(frame: Bytes, api: ApiKey) -> Result<(RequestHeader, Bytes), DecodeError> {
    let raw = RawHeader::peek(&frame).ok_or(DecodeError::Short)?;
    let header_version = api.request_header_version(raw.api_version);
    let mut buf = frame;
    let header = RequestHeader::decode(&mut buf, header_version).map_err(DecodeError::Header)?;
    Ok((header, buf))
}

/// Decodes a request body at `version`. Trailing bytes are tolerated, as Kafka does.
pub fn decode_body<T: Decodable>(mut body: Bytes, api: ApiKey, version: i16) -> Result<T, DecodeError> {
    T::decode(&mut body, version).map_err(|source| DecodeError::Body { api, version, source })
}

#[derive(Debug, thiserror::Error)]
#[error("cannot encode response: {0:#}")]
pub struct EncodeError(pub anyhow::Error);

/// Encodes a complete response frame: size prefix, response header, body.
pub fn encode_response<T: Encodable>(
    correlation_id: i32,
    api: ApiKey,
    version: i16,
    body: &T,
) -> Result<Bytes, EncodeError> {
    encode_response_with_header_version(
        correlation_id,
        api.response_header_version(version),
        version,
        body,
    )
}

/// Like [`encode_response`] with an explicit header version (the ApiVersions fallback answers
/// with header v0 whatever the request's version was).
pub fn encode_response_with_header_version<T: Encodable>(
    correlation_id: i32,
    header_version: i16,
    version: i16,
    body: &T,
) -> Result<Bytes, EncodeError> {
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let size = header.compute_size(header_version).map_err(EncodeError)?
        + body.compute_size(version).map_err(EncodeError)?;
    let size_i32 = i32::try_from(size)
        .map_err(|_| EncodeError(anyhow::anyhow!("response of {size} bytes is too large")))?;
    let mut out = BytesMut::with_capacity(4 + size);
    out.put_i32(size_i32);
    header.encode(&mut out, header_version).map_err(EncodeError)?;
    body.encode(&mut out, version).map_err(EncodeError)?;
    debug_assert_eq!(out.len(), 4 + size);
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::MetadataRequest;

    #[test]
    fn header_round_trip_leaves_body() {
        let mut frame = BytesMut::new();
        let header = RequestHeader::default()
            .with_request_api_key(ApiKey::Metadata as i16)
            .with_request_api_version(12)
            .with_correlation_id(77);
        header
            .encode(&mut frame, ApiKey::Metadata.request_header_version(12))
            .unwrap();
        MetadataRequest::default().encode(&mut frame, 12).unwrap();
        let frame = frame.freeze();
        let raw = RawHeader::peek(&frame).unwrap();
        assert_eq!((raw.api_key, raw.api_version, raw.correlation_id), (3, 12, 77));
        let (h, body) = decode_request_header(frame, ApiKey::Metadata).unwrap();
        assert_eq!(h.correlation_id, 77);
        let _req: MetadataRequest = decode_body(body, ApiKey::Metadata, 12).unwrap();
    }
}
