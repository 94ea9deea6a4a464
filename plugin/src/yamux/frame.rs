//! Yamux frame headers: 12 bytes, big-endian (hashicorp/yamux `spec.md`).

/// The only protocol version.
pub(crate) const VERSION: u8 = 0;
/// Every stream starts with this window in each direction.
pub const INITIAL_WINDOW: u32 = 256 * 1024;

/// Frame types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameType {
    Data = 0,
    WindowUpdate = 1,
    Ping = 2,
    GoAway = 3,
}

/// Flag bits.
pub(crate) mod flags {
    pub(crate) const SYN: u16 = 0x1;
    pub(crate) const ACK: u16 = 0x2;
    pub(crate) const FIN: u16 = 0x4;
    pub(crate) const RST: u16 = 0x8;
}

/// GoAway codes.
pub(crate) mod go_away {
    pub(crate) const PROTOCOL_ERROR: u32 = 1;
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) ty: FrameType,
    pub(crate) flags: u16,
    pub(crate) stream_id: u32,
    /// Data: payload size; WindowUpdate: window delta; Ping: opaque value; GoAway: code.
    pub(crate) length: u32,
}

/// Why a header could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeaderError {
    #[error("yamux: unsupported protocol version {0}")]
    Version(u8),
    #[error("yamux: invalid frame type {0}")]
    Type(u8),
}

impl Header {
    pub(crate) fn new(ty: FrameType, flags: u16, stream_id: u32, length: u32) -> Self {
        Self {
            ty,
            flags,
            stream_id,
            length,
        }
    }

    pub(crate) fn encode(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[0] = VERSION;
        b[1] = self.ty as u8;
        b[2..4].copy_from_slice(&self.flags.to_be_bytes());
        b[4..8].copy_from_slice(&self.stream_id.to_be_bytes());
        b[8..12].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8; 12]) -> Result<Self, HeaderError> {
        if b[0] != VERSION {
            return Err(HeaderError::Version(b[0]));
        }
        let ty = match b[1] {
            0 => FrameType::Data,
            1 => FrameType::WindowUpdate,
            2 => FrameType::Ping,
            3 => FrameType::GoAway,
            t => return Err(HeaderError::Type(t)),
        };
        Ok(Self {
            ty,
            flags: u16::from_be_bytes([b[2], b[3]]),
            stream_id: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            length: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
        })
    }

    pub(crate) fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = Header::new(FrameType::WindowUpdate, flags::ACK, 5, 0);
        assert_eq!(h.encode(), [0, 1, 0, 2, 0, 0, 0, 5, 0, 0, 0, 0]);
        assert_eq!(Header::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn bad_version_and_type_are_errors() {
        assert_eq!(Header::decode(&[1; 12]), Err(HeaderError::Version(1)));
        let mut b = [0u8; 12];
        b[1] = 9;
        assert_eq!(Header::decode(&b), Err(HeaderError::Type(9)));
    }
}
