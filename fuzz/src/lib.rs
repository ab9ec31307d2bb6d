//! Input formats shared by the fuzz targets and the seed generator (`examples/seeds.rs`).
//!
//! Targets whose input is one protobuf message take the encoded message as is. The others
//! read a small framing defined here, with an encoder beside each parser so that the seeds
//! are built from real values rather than written as opaque bytes.

pub mod chunk_stream;
pub mod router_target;
pub mod stop_case;

/// Reads the input front to back; reads past the end yield zeros or nothing, so every byte
/// string is a valid input.
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&byte, rest)) => {
                self.data = rest;
                byte
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// Up to `len` bytes (fewer at the end of the input).
    pub fn bytes(&mut self, len: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(len.min(self.data.len()));
        self.data = rest;
        head
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}
