//! Text kept in memory LZ4-compressed when large.
//!
//! The cloud keeps every object of a site as JSON text: a device's visitors, a profile
//! ConfigMap's copy of every device of a node. Such text repeats its keys and values; compressed
//! it takes a quarter to a tenth of the memory, and decompressing costs about a microsecond per
//! KB, paid only when the text is read (sent, listed, watched).

use std::borrow::Cow;
use std::sync::Arc;

/// A text, compressed from [`Packed::FROM`] bytes up when that makes it smaller. Cloning shares it.
#[derive(Clone, Debug)]
pub struct Packed {
    len: usize,
    packed: bool,
    data: Arc<[u8]>,
}

/// Equal when their texts are.
impl PartialEq for Packed {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len
            && (Arc::ptr_eq(&self.data, &other.data) || self.bytes() == other.bytes())
    }
}

impl Packed {
    /// Texts shorter than this are kept as they are.
    pub const FROM: usize = 512;

    pub fn new(text: &[u8]) -> Self {
        if text.len() >= Self::FROM {
            let small = lz4_flex::block::compress(text);
            if small.len() < text.len() {
                return Self {
                    len: text.len(),
                    packed: true,
                    data: Arc::from(small),
                };
            }
        }
        Self {
            len: text.len(),
            packed: false,
            data: Arc::from(text),
        }
    }

    /// The text. It was compressed by [`Packed::new`] from `len` bytes, so decompressing cannot
    /// fail but by a bug; then it reads as `null`.
    pub fn bytes(&self) -> Cow<'_, [u8]> {
        if !self.packed {
            return Cow::Borrowed(&self.data);
        }
        match lz4_flex::block::decompress(&self.data, self.len) {
            Ok(v) => Cow::Owned(v),
            Err(_) => Cow::Borrowed(b"null"),
        }
    }

    /// The length of the text (not of what is kept).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes kept in memory for it.
    pub fn kept(&self) -> usize {
        self.data.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_texts_are_kept_as_they_are_and_large_ones_compressed() {
        let small = Packed::new(b"{\"a\":1}");
        assert_eq!(&*small.bytes(), b"{\"a\":1}");
        assert_eq!(small.kept(), 7);

        let device = format!(
            "[{}]",
            (0..40)
                .map(|i| format!("{{\"name\":\"p{i}\",\"visitors\":{{\"protocolName\":\"modbus\",\"configData\":{{\"register\":\"HoldingRegister\",\"offset\":{i}}}}}}}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let p = Packed::new(device.as_bytes());
        assert_eq!(p.len(), device.len());
        assert!(
            p.kept() * 3 < device.len(),
            "{} of {}",
            p.kept(),
            device.len()
        );
        assert_eq!(&*p.bytes(), device.as_bytes());
    }

    #[test]
    fn text_that_does_not_compress_is_kept_as_it_is() {
        // A deterministic sequence without repeats that LZ4 could use.
        let mut x: u32 = 0x9e37_79b9;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x & 0xff) as u8
            })
            .collect();
        let p = Packed::new(&noise);
        assert_eq!(p.kept(), noise.len());
        assert_eq!(&*p.bytes(), &noise[..]);
    }
}
