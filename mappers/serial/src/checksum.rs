//! Frame checksums: appended to binary requests and checked on replies.

/// A checksum over a whole frame (everything before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checksum {
    None,
    /// The sum of the bytes, modulo 256 (1 byte).
    Sum8,
    /// The XOR of the bytes (1 byte).
    Xor8,
    /// CRC-16/MODBUS: polynomial 0xA001 reflected, initial 0xFFFF; sent low byte first.
    Crc16Modbus,
    /// CRC-16/CCITT-FALSE: polynomial 0x1021, initial 0xFFFF; sent high byte first.
    Crc16Ccitt,
}

impl Checksum {
    /// From the `checksum` key: `none`, `sum8` (or `sum`), `xor8` (or `xor`), `crc16-modbus`,
    /// `crc16-ccitt`.
    pub fn parse(s: &str) -> Option<Self> {
        Some(
            match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
                "" | "none" => Self::None,
                "sum" | "sum8" => Self::Sum8,
                "xor" | "xor8" => Self::Xor8,
                "crc16-modbus" | "crc16modbus" | "modbus" => Self::Crc16Modbus,
                "crc16-ccitt" | "crc16ccitt" | "ccitt" => Self::Crc16Ccitt,
                _ => return None,
            },
        )
    }

    /// Bytes the checksum takes at the end of a frame.
    pub fn width(self) -> usize {
        match self {
            Self::None => 0,
            Self::Sum8 | Self::Xor8 => 1,
            Self::Crc16Modbus | Self::Crc16Ccitt => 2,
        }
    }

    /// The checksum of `data`, as it goes on the wire.
    pub fn compute(self, data: &[u8]) -> Vec<u8> {
        match self {
            Self::None => Vec::new(),
            Self::Sum8 => vec![data.iter().fold(0u8, |a, b| a.wrapping_add(*b))],
            Self::Xor8 => vec![data.iter().fold(0u8, |a, b| a ^ b)],
            Self::Crc16Modbus => crc16_modbus(data).to_le_bytes().to_vec(),
            Self::Crc16Ccitt => crc16_ccitt(data).to_be_bytes().to_vec(),
        }
    }

    /// `frame` with its checksum appended.
    pub fn append(self, mut frame: Vec<u8>) -> Vec<u8> {
        let sum = self.compute(&frame);
        frame.extend_from_slice(&sum);
        frame
    }

    /// Checks the checksum at the end of `frame`; the error says what was received and what
    /// was computed.
    pub fn verify(self, frame: &[u8]) -> Result<(), ChecksumError> {
        let n = self.width();
        if n == 0 {
            return Ok(());
        }
        if frame.len() < n {
            return Err(ChecksumError::NoRoom { len: frame.len() });
        }
        let (data, got) = frame.split_at(frame.len() - n);
        let want = self.compute(data);
        if got == want.as_slice() {
            Ok(())
        } else {
            Err(ChecksumError::Mismatch {
                received: crate::field::hex(got),
                computed: crate::field::hex(&want),
            })
        }
    }
}

/// A frame whose checksum is not right.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChecksumError {
    #[error("a {len}-byte frame has no room for its checksum")]
    NoRoom { len: usize },
    #[error("bad checksum: received {received}, computed {computed}")]
    Mismatch { received: String, computed: String },
}

fn crc16_modbus(data: &[u8]) -> u16 {
    let mut crc: u16 = 0xFFFF;
    for b in data {
        crc ^= u16::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xA001
            } else {
                crc >> 1
            };
        }
    }
    crc
}

fn crc16_ccitt(data: &[u8]) -> u16 {
    let mut crc: u16 = 0xFFFF;
    for b in data {
        crc ^= u16::from(*b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_values_of_the_catalogue() {
        // The standard check input "123456789".
        let data = b"123456789";
        assert_eq!(crc16_modbus(data), 0x4B37);
        assert_eq!(crc16_ccitt(data), 0x29B1);
        // A Modbus RTU request: 01 03 00 00 00 01 carries 84 0A.
        assert_eq!(
            Checksum::Crc16Modbus.compute(&[0x01, 0x03, 0x00, 0x00, 0x00, 0x01]),
            vec![0x84, 0x0A]
        );
        assert_eq!(Checksum::Sum8.compute(&[0xFF, 0x02]), vec![0x01]);
        assert_eq!(Checksum::Xor8.compute(&[0xF0, 0x0F, 0x01]), vec![0xFE]);
    }

    #[test]
    fn verify_names_both_sums() {
        let frame = Checksum::Crc16Ccitt.append(vec![0xAA, 0x01]);
        assert_eq!(Checksum::Crc16Ccitt.verify(&frame), Ok(()));
        let mut bad = frame.clone();
        bad[1] ^= 0xFF;
        let e = Checksum::Crc16Ccitt.verify(&bad).expect_err("bad");
        assert!(e.to_string().starts_with("bad checksum: received "), "{e}");
        assert!(Checksum::Sum8.verify(&[]).is_err());
        assert_eq!(Checksum::parse("CRC16_MODBUS"), Some(Checksum::Crc16Modbus));
        assert_eq!(Checksum::parse("md5"), None);
    }
}
