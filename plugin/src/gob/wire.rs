//! Gob primitives: unsigned/signed integers, floats, byte strings and message framing.
//!
//! These are the byte layouts of Go's `encoding/gob` (`encode.go`/`decode.go`): a uint below 128 is one
//! byte, otherwise a negated byte count followed by big-endian bytes; an int is zig-zag folded into a
//! uint; a float is the byte-reversed IEEE-754 bits sent as a uint.

use super::Error;

/// Reads primitives from one gob message; running past its end is an error, never a panic.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `buf[pos..end]`.
    pub(crate) fn new(buf: &'a [u8], pos: usize, end: usize) -> Self {
        Self { buf, pos, end }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn end(&self) -> usize {
        self.end
    }

    pub(crate) fn remaining(&self) -> usize {
        self.end - self.pos
    }

    pub(crate) fn buf(&self) -> &'a [u8] {
        self.buf
    }

    /// Moves the window to the next message `[pos, end)` of the same stream.
    pub(crate) fn set_window(&mut self, pos: usize, end: usize) {
        self.pos = pos;
        self.end = end;
    }

    pub(crate) fn read_byte(&mut self) -> Result<u8, Error> {
        if self.pos >= self.end {
            return Err(Error::Truncated);
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(b)
    }

    pub(crate) fn read_uint(&mut self) -> Result<u64, Error> {
        let first = self.read_byte()?;
        if first < 0x80 {
            return Ok(u64::from(first));
        }
        let n = (!first).wrapping_add(1) as usize; // negated byte count
        if n > 8 {
            return Err(Error::invalid(format!(
                "uint has {n} bytes; at most 8 are allowed"
            )));
        }
        let bytes = self.take(n)?;
        Ok(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    pub(crate) fn read_int(&mut self) -> Result<i64, Error> {
        Ok(unzigzag(self.read_uint()?))
    }

    pub(crate) fn read_float(&mut self) -> Result<f64, Error> {
        Ok(f64::from_bits(self.read_uint()?.swap_bytes()))
    }

    /// A length-prefixed byte string (Go `string` and `[]byte`).
    pub(crate) fn read_bytes(&mut self) -> Result<&'a [u8], Error> {
        let len = self.read_len()?;
        self.take(len)
    }

    /// A count that must fit in what is left of the message (Go's "length exceeds input size").
    pub(crate) fn read_len(&mut self) -> Result<usize, Error> {
        let n = self.read_uint()?;
        if n > self.remaining() as u64 {
            return Err(Error::invalid(format!(
                "length {n} exceeds the {} bytes left in the message",
                self.remaining()
            )));
        }
        Ok(n as usize)
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if n > self.remaining() {
            return Err(Error::Truncated);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
}

/// Folds a signed int the way gob does: `i << 1`, or `(^i << 1) | 1` when negative.
pub(crate) fn zigzag(i: i64) -> u64 {
    if i < 0 {
        ((!i as u64) << 1) | 1
    } else {
        (i as u64) << 1
    }
}

pub(crate) fn unzigzag(u: u64) -> i64 {
    if u & 1 == 1 {
        !((u >> 1) as i64)
    } else {
        (u >> 1) as i64
    }
}

/// Appends gob primitives to a buffer.
pub(crate) fn put_uint(out: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        out.push(v as u8);
        return;
    }
    let bytes = v.to_be_bytes();
    let skip = (v.leading_zeros() / 8) as usize;
    out.push((-((8 - skip) as i8)) as u8);
    out.extend_from_slice(&bytes[skip..]);
}

pub(crate) fn put_int(out: &mut Vec<u8>, v: i64) {
    put_uint(out, zigzag(v));
}

pub(crate) fn put_float(out: &mut Vec<u8>, v: f64) {
    put_uint(out, v.to_bits().swap_bytes());
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_uint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Reads a message length prefix at `buf[pos..]`: `Ok(None)` if the prefix itself is incomplete.
pub(crate) fn peek_uint(buf: &[u8], pos: usize) -> Result<Option<(u64, usize)>, Error> {
    let Some(&first) = buf.get(pos) else {
        return Ok(None);
    };
    if first < 0x80 {
        return Ok(Some((u64::from(first), 1)));
    }
    let n = (!first).wrapping_add(1) as usize;
    if n > 8 {
        return Err(Error::invalid(format!(
            "message length has {n} bytes; at most 8 are allowed"
        )));
    }
    if buf.len() < pos + 1 + n {
        return Ok(None);
    }
    let v = buf[pos + 1..pos + 1 + n]
        .iter()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    Ok(Some((v, 1 + n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uint_examples_from_go_docs() {
        for (v, bytes) in [
            (0u64, vec![0x00]),
            (7, vec![0x07]),
            (256, vec![0xFE, 0x01, 0x00]),
        ] {
            let mut out = Vec::new();
            put_uint(&mut out, v);
            assert_eq!(out, bytes);
            let mut r = Reader::new(&out, 0, out.len());
            assert_eq!(r.read_uint().unwrap(), v);
        }
    }

    #[test]
    fn int_examples_from_go_docs() {
        for (v, bytes) in [
            (3i64, vec![0x06]),
            (-129, vec![0xFE, 0x01, 0x01]),
            (65, vec![0xFF, 0x82]),
            (-65, vec![0xFF, 0x81]),
        ] {
            let mut out = Vec::new();
            put_int(&mut out, v);
            assert_eq!(out, bytes, "int {v}");
            let mut r = Reader::new(&out, 0, out.len());
            assert_eq!(r.read_int().unwrap(), v);
        }
    }

    #[test]
    fn float_example_from_go_docs() {
        let mut out = Vec::new();
        put_float(&mut out, 17.0);
        assert_eq!(out, vec![0xFE, 0x31, 0x40]);
    }

    #[test]
    fn truncated_uint_is_an_error() {
        let mut r = Reader::new(&[0xFE, 0x01], 0, 2);
        assert!(matches!(r.read_uint(), Err(Error::Truncated)));
    }
}
