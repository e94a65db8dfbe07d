//! Request framing: every Kafka request and response is an `int32` size followed by that many
//! bytes. Sans-I/O: the connection code reads into a `BytesMut` and calls [`split_frame`].

use bytes::{Buf, Bytes, BytesMut};

/// The smallest request frame: api key, api version and correlation id.
pub const MIN_REQUEST_FRAME_BYTES: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame size {0} is negative")]
    Negative(i32),
    #[error("frame of {size} bytes is larger than the limit of {max} bytes (socket.request.max.bytes)")]
    TooLarge { size: usize, max: usize },
    #[error("frame of {0} bytes is too short to hold a request header")]
    TooShort(usize),
}

/// Splits one complete frame (without its size prefix) off the front of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed. The size is checked against
/// `max_frame_bytes` as soon as the 4-byte prefix is in, before waiting for (or allocating) the
/// body, so an oversized frame is refused without being buffered.
pub fn split_frame(buf: &mut BytesMut, max_frame_bytes: usize) -> Result<Option<Bytes>, FrameError> {
    let Some(size) = peek_frame_size(buf, max_frame_bytes)? else {
        return Ok(None);
    };
    if buf.len() < 4 + size {
        return Ok(None);
    }
    buf.advance(4);
    Ok(Some(buf.split_to(size).freeze()))
}

/// The size of the frame at the front of `buf`, once its prefix has arrived, checked against
/// the limits. Lets a reader reserve exactly the space the frame needs.
pub fn peek_frame_size(buf: &[u8], max_frame_bytes: usize) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = buf.first_chunk::<4>() else {
        return Ok(None);
    };
    let size = i32::from_be_bytes(*prefix);
    if size < 0 {
        return Err(FrameError::Negative(size));
    }
    let size = size as usize;
    if size > max_frame_bytes {
        return Err(FrameError::TooLarge {
            size,
            max: max_frame_bytes,
        });
    }
    if size < MIN_REQUEST_FRAME_BYTES {
        return Err(FrameError::TooShort(size));
    }
    Ok(Some(size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(body: &[u8]) -> BytesMut {
        let mut b = BytesMut::new();
        b.extend_from_slice(&(body.len() as i32).to_be_bytes());
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn splits_complete_frames_only() {
        let mut buf = framed(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        buf.extend_from_slice(&framed(&[0; 8])[..6]);
        let first = split_frame(&mut buf, 100).unwrap().unwrap();
        assert_eq!(&first[..], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(split_frame(&mut buf, 100).unwrap(), None);
        buf.extend_from_slice(&[0; 6]);
        assert_eq!(split_frame(&mut buf, 100).unwrap().unwrap().len(), 8);
        assert!(buf.is_empty());
    }

    #[test]
    fn refuses_oversized_before_body_arrives() {
        let mut buf = BytesMut::from(&1_000_000i32.to_be_bytes()[..]);
        assert_eq!(
            split_frame(&mut buf, 1000),
            Err(FrameError::TooLarge {
                size: 1_000_000,
                max: 1000
            })
        );
        let mut buf = BytesMut::from(&(-1i32).to_be_bytes()[..]);
        assert_eq!(split_frame(&mut buf, 1000), Err(FrameError::Negative(-1)));
        let mut buf = framed(&[0; 3]);
        assert_eq!(split_frame(&mut buf, 1000), Err(FrameError::TooShort(3)));
    }
}
