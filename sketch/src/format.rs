//! The frame every encoded sketch travels in: on the wire, in RocksDB and in exports.
//!
//! ```text
//! offset  size  field
//! 0       4     magic "HGSK"
//! 4       1     format version (1)
//! 5       1     kind: 1 distinct, 2 frequency, 3 membership
//! 6       2     flags, little-endian; none defined in version 1, must be 0
//! 8       4     body length L, little-endian
//! 12      L     body: the kind's parameters and payload (see each sketch module)
//! 12+L    8     checksum: xxh3-64 (seed 0) of bytes 0..12+L, little-endian
//! ```
//!
//! All integers are little-endian. The layout is specified byte by byte in
//! docs/FORMAT.md and pinned by golden-byte tests; it never changes within a version.
//!
//! Decoding treats its input as hostile: [`decode_frame`] checks every length before it
//! reads, and [`BodyReader`] does the same for the body, so a short, long or corrupted
//! buffer is an error that says what is wrong, never a panic.

use crate::error::DecodeError;
pub use crate::kind::Kind;
use xxhash_rust::xxh3::xxh3_64;

/// The four bytes every encoded sketch starts with.
pub const MAGIC: [u8; 4] = *b"HGSK";
/// The only format version this build reads and writes.
pub const FORMAT_VERSION: u8 = 1;
/// Bytes before the body.
pub const HEADER_LEN: usize = 12;
/// Bytes after the body.
pub const CHECKSUM_LEN: usize = 8;
/// The largest body a decoder accepts (256 MiB); anything larger is hostile or corrupt.
pub const MAX_BODY_LEN: usize = 256 << 20;

/// Wraps a body in the frame: header, body, checksum.
pub fn encode_frame(kind: Kind, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len() + CHECKSUM_LEN);
    out.extend_from_slice(&MAGIC);
    out.push(FORMAT_VERSION);
    out.push(kind.code());
    out.extend_from_slice(&0u16.to_le_bytes());
    // Bodies are bounded by MAX_BODY_LEN on decode; an in-memory sketch larger than 4 GiB
    // cannot be built from the parameter ranges the constructors accept.
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    let checksum = xxh3_64(&out);
    out.extend_from_slice(&checksum.to_le_bytes());
    out
}

/// Checks a frame and returns its kind and body.
pub fn decode_frame(bytes: &[u8]) -> Result<(Kind, &[u8]), DecodeError> {
    if bytes.len() < HEADER_LEN + CHECKSUM_LEN {
        return Err(DecodeError::Truncated {
            what: "frame header and checksum",
            needed: HEADER_LEN + CHECKSUM_LEN,
            available: bytes.len(),
        });
    }
    if bytes[0..4] != MAGIC {
        return Err(DecodeError::BadMagic {
            found: [bytes[0], bytes[1], bytes[2], bytes[3]],
        });
    }
    let version = bytes[4];
    if version != FORMAT_VERSION {
        return Err(DecodeError::UnsupportedVersion { version });
    }
    let kind = Kind::from_code(bytes[5]).ok_or(DecodeError::UnknownKind { code: bytes[5] })?;
    let flags = u16::from_le_bytes([bytes[6], bytes[7]]);
    if flags != 0 {
        return Err(DecodeError::Invalid {
            field: "flags",
            reason: format!("{flags:#06x} set, but format version 1 defines no flags"),
        });
    }
    let body_len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    if body_len > MAX_BODY_LEN {
        return Err(DecodeError::Invalid {
            field: "body length",
            reason: format!("{body_len} bytes exceeds the limit of {MAX_BODY_LEN}"),
        });
    }
    let expected_len = HEADER_LEN + body_len + CHECKSUM_LEN;
    if bytes.len() != expected_len {
        return Err(DecodeError::LengthMismatch {
            declared: expected_len,
            actual: bytes.len(),
        });
    }
    let (covered, trailer) = bytes.split_at(HEADER_LEN + body_len);
    let stored = u64::from_le_bytes(trailer.try_into().expect("trailer is 8 bytes"));
    let computed = xxh3_64(covered);
    if stored != computed {
        return Err(DecodeError::ChecksumMismatch { stored, computed });
    }
    Ok((kind, &covered[HEADER_LEN..]))
}

/// A cursor over a sketch body that checks every read against the bytes left.
pub struct BodyReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> BodyReader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        BodyReader { bytes, pos: 0 }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes; `what` names them in the error if they are not there.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated {
                what,
                needed: n,
                available: self.remaining(),
            });
        }
        let slice = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(slice)
    }

    /// One byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    /// A little-endian u16.
    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    /// A little-endian u32.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// A little-endian u64.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A little-endian IEEE 754 double.
    pub fn f64(&mut self, what: &'static str) -> Result<f64, DecodeError> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        Ok(self
            .take(N, what)?
            .try_into()
            .expect("take returned N bytes"))
    }

    /// Succeeds only if every byte was read: trailing bytes mean the body is not what its
    /// parameters say.
    pub fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::TrailingBytes { extra }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trips() {
        let framed = encode_frame(Kind::Frequency, b"body");
        let (kind, body) = decode_frame(&framed).unwrap();
        assert_eq!(kind, Kind::Frequency);
        assert_eq!(body, b"body");
    }

    #[test]
    fn frame_is_pinned() {
        let framed = encode_frame(Kind::Distinct, &[0xAB]);
        assert_eq!(&framed[..13], b"HGSK\x01\x01\x00\x00\x01\x00\x00\x00\xAB");
        assert_eq!(framed.len(), 21);
    }

    #[test]
    fn every_corruption_is_named() {
        let good = encode_frame(Kind::Membership, b"payload");
        assert!(matches!(
            decode_frame(&good[..5]),
            Err(DecodeError::Truncated { .. })
        ));
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(
            decode_frame(&bad),
            Err(DecodeError::BadMagic { .. })
        ));
        let mut bad = good.clone();
        bad[4] = 9;
        assert!(matches!(
            decode_frame(&bad),
            Err(DecodeError::UnsupportedVersion { version: 9 })
        ));
        let mut bad = good.clone();
        bad[5] = 0;
        assert!(matches!(
            decode_frame(&bad),
            Err(DecodeError::UnknownKind { code: 0 })
        ));
        let mut bad = good.clone();
        bad[13] ^= 1;
        assert!(matches!(
            decode_frame(&bad),
            Err(DecodeError::ChecksumMismatch { .. })
        ));
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            decode_frame(&long),
            Err(DecodeError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn reader_refuses_to_overrun() {
        let mut r = BodyReader::new(&[1, 2, 3]);
        assert_eq!(r.u16("a").unwrap(), 0x0201);
        let err = r.u32("the counter").unwrap_err();
        assert_eq!(
            err.to_string(),
            "truncated sketch: the counter needs 4 bytes but only 1 remain"
        );
    }
}
