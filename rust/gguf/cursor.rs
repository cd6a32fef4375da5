//! A forward-only reader over untrusted bytes. Every read checks the
//! remaining length first and names what it was reading when it fails.

use crate::{Error, Result};

pub struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { data, pos: 0 }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::load(format!(
                "file truncated while reading {what}: need {n} bytes at offset {}, only {} left",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    pub fn i8(&mut self, what: &str) -> Result<i8> {
        Ok(i8::from_le_bytes(self.array(what)?))
    }
    pub fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub fn i16(&mut self, what: &str) -> Result<i16> {
        Ok(i16::from_le_bytes(self.array(what)?))
    }
    pub fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub fn i32(&mut self, what: &str) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }
    pub fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    pub fn i64(&mut self, what: &str) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }
    pub fn f32(&mut self, what: &str) -> Result<f32> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }
    pub fn f64(&mut self, what: &str) -> Result<f64> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    /// A count that promises `count` items of at least `min_item` bytes each
    /// must fit in what is left, which rejects absurd counts before any
    /// allocation sized by them.
    pub fn count(&mut self, min_item: usize, what: &str) -> Result<usize> {
        let raw = self.u64(what)?;
        let fits = usize::try_from(raw).ok().filter(|n| {
            n.checked_mul(min_item.max(1))
                .is_some_and(|b| b <= self.remaining())
        });
        fits.ok_or_else(|| {
            Error::load(format!(
                "{what} is {raw}, more than the {} bytes left in the file can hold",
                self.remaining()
            ))
        })
    }

    /// GGUF string: u64 length then bytes. Keys and names must be UTF-8;
    /// values are decoded lossily because some vocabularies carry raw bytes.
    pub fn string_bytes(&mut self, what: &str) -> Result<&'a [u8]> {
        let n = self.count(1, what)?;
        self.take(n, what)
    }

    pub fn string_strict(&mut self, what: &str) -> Result<String> {
        let b = self.string_bytes(what)?;
        String::from_utf8(b.to_vec()).map_err(|_| Error::load(format!("{what} is not valid UTF-8")))
    }

    pub fn string_lossy(&mut self, what: &str) -> Result<String> {
        let b = self.string_bytes(what)?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_read_names_what() {
        let mut c = Cursor::new(&[1, 2, 3]);
        let e = c.u32("tensor count").unwrap_err();
        assert!(e.to_string().contains("tensor count"), "{e}");
    }

    #[test]
    fn absurd_count_rejected_before_allocation() {
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 16]);
        let mut c = Cursor::new(&bytes);
        assert!(c.count(8, "array length").is_err());
    }
}
