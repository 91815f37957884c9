//! Where the VM's bytes come from: a slice held in memory ([`SliceSource`], zero-copy: strings
//! are borrowed from it) or any [`Read`] ([`ReadSource`]: a file, a pipe, a decompressor),
//! read through a fixed window so that memory follows the objects a pickle builds, never the
//! size of the input or what a length field claims.
//!
//! A reader never maps the file: a mapping faults with SIGBUS when another process truncates
//! the file under it, and a read only returns fewer bytes (which the VM reports as truncation).

use std::borrow::Cow;
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Why a source could not give the bytes asked for.
#[derive(Debug)]
pub enum Fault {
    /// The input ended with `available` bytes left.
    Short { available: u64 },
    /// Reading failed (an I/O error, a corrupt compressed stream, a decompression budget).
    Io(io::Error),
}

/// The bytes of one pickle, read front to back.
///
/// `'a` is the lifetime of borrowed data: [`SliceSource`] lends its bytes for `'a`, a
/// [`ReadSource`] copies what the VM keeps (its window is reused).
pub trait Source<'a> {
    /// Offset of the next byte in the pickle.
    fn offset(&self) -> u64;
    /// Bytes of the input as stored (compressed bytes for a decompressor) consumed so far; the
    /// object budget is measured against it.
    fn stored_bytes(&self) -> u64;
    /// The next byte, `None` at the end of the input.
    fn next_byte(&mut self) -> Result<Option<u8>, Fault>;
    /// Exactly `N` bytes.
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Fault>;
    /// `n` (at most 255) bytes, lent until the next call.
    fn short(&mut self, n: usize) -> Result<&[u8], Fault>;
    /// Step back over the `n` bytes the last call to [`Source::short`] returned, so they can be
    /// taken again with [`Source::bytes`] (a cache miss keeps the bytes it looked at).
    fn unread(&mut self, n: usize);
    /// Exactly `n` bytes of any length, borrowed where the source can. A length longer than
    /// the input fails once the input ends, with what was really there counted.
    fn bytes(&mut self, n: u64) -> Result<Cow<'a, [u8]>, Fault>;
    /// Bytes up to the next `\n` (consumed, not returned).
    fn line(&mut self) -> Result<Cow<'a, [u8]>, Fault>;
    /// Check that `n` more bytes exist (for `FRAME`, whose length is only a hint): exact for a
    /// slice and for a window that can hold them; a reader accepts a longer claim, and the
    /// opcode that runs out of bytes reports the truncation.
    fn expect(&mut self, n: u64) -> Result<(), Fault>;
    /// Bytes known to follow the cursor without reading further (all of them for a slice).
    fn buffered(&self) -> u64;
    /// How many bytes are left in the input, when that is known without reading it (a slice,
    /// a file of known length, or a reader that reached its end).
    fn known_left(&self) -> Option<u64>;

    /// Up to `n` bytes from the current position, without consuming them (fewer at the end of
    /// the input). A reader's window grows to `n` for this; the parallel trace reader asks for
    /// a few MiB at a time.
    fn ahead(&mut self, n: usize) -> Result<&[u8], Fault>;

    /// Consume `n` bytes that [`Source::ahead`] returned.
    fn skip(&mut self, n: usize);
}

/// A pickle held in memory.
pub struct SliceSource<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> SliceSource<'a> {
    pub fn new(data: &'a [u8]) -> SliceSource<'a> {
        SliceSource { data, pos: 0 }
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], Fault> {
        let data: &'a [u8] = self.data;
        let left = data.len() - self.pos;
        if n > left {
            return Err(Fault::Short { available: left as u64 });
        }
        let s = &data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
}

impl<'a> Source<'a> for SliceSource<'a> {
    #[inline]
    fn offset(&self) -> u64 {
        self.pos as u64
    }
    fn stored_bytes(&self) -> u64 {
        self.pos as u64
    }
    #[inline]
    fn next_byte(&mut self) -> Result<Option<u8>, Fault> {
        let b = self.data.get(self.pos).copied();
        self.pos += b.is_some() as usize;
        Ok(b)
    }
    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Fault> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    #[inline]
    fn short(&mut self, n: usize) -> Result<&[u8], Fault> {
        self.take(n)
    }
    fn unread(&mut self, n: usize) {
        self.pos -= n;
    }
    #[inline]
    fn bytes(&mut self, n: u64) -> Result<Cow<'a, [u8]>, Fault> {
        let left = (self.data.len() - self.pos) as u64;
        if n > left {
            return Err(Fault::Short { available: left });
        }
        self.take(n as usize).map(Cow::Borrowed)
    }
    fn line(&mut self) -> Result<Cow<'a, [u8]>, Fault> {
        let data: &'a [u8] = self.data;
        let rest = &data[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(Cow::Borrowed(&rest[..n]))
            }
            None => Err(Fault::Short { available: rest.len() as u64 }),
        }
    }
    fn expect(&mut self, n: u64) -> Result<(), Fault> {
        let left = (self.data.len() - self.pos) as u64;
        if n > left {
            return Err(Fault::Short { available: left });
        }
        Ok(())
    }
    fn buffered(&self) -> u64 {
        (self.data.len() - self.pos) as u64
    }
    fn known_left(&self) -> Option<u64> {
        Some((self.data.len() - self.pos) as u64)
    }
    fn ahead(&mut self, n: usize) -> Result<&[u8], Fault> {
        let end = self.pos.saturating_add(n).min(self.data.len());
        Ok(&self.data[self.pos..end])
    }
    fn skip(&mut self, n: usize) {
        self.pos += n;
    }
}

/// Counts the bytes a reader hands out, for a [`ReadSource`] over a decompressor to know how
/// much of the stored (compressed) input it has consumed.
pub struct CountingReader<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> CountingReader<R> {
    pub fn new(inner: R) -> (CountingReader<R>, Arc<AtomicU64>) {
        let count = Arc::new(AtomicU64::new(0));
        (CountingReader { inner, count: count.clone() }, count)
    }
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Size of a [`ReadSource`]'s window. Large enough that refills are rare next to the work done
/// per byte, small enough to be nothing next to a snapshot's model; every argument of a fixed
/// size (at most 255 bytes) fits.
pub const WINDOW: usize = 1 << 20;

/// A pickle read from any reader through a window of [`WINDOW`] bytes.
pub struct ReadSource<R> {
    reader: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Pickle offset of `buf[0]`.
    base: u64,
    eof: bool,
    /// Stored bytes consumed, when the reader decompresses (else the pickle offset is used).
    stored: Option<Arc<AtomicU64>>,
    /// The pickle's length when known beforehand (a regular file's size): lets [`Source::expect`]
    /// refuse a frame longer than the file.
    len_hint: Option<u64>,
}

impl<R: Read> ReadSource<R> {
    pub fn new(reader: R) -> ReadSource<R> {
        ReadSource { reader, buf: vec![0; WINDOW], pos: 0, end: 0, base: 0, eof: false, stored: None, len_hint: None }
    }

    /// The same source, told the pickle's length (used only to judge `FRAME` lengths).
    pub fn with_len_hint(self, len: u64) -> ReadSource<R> {
        ReadSource { len_hint: Some(len), ..self }
    }

    /// A source whose stored bytes are counted by `stored` (see [`CountingReader`]).
    pub fn with_stored_count(reader: R, stored: Arc<AtomicU64>) -> ReadSource<R> {
        ReadSource { stored: Some(stored), ..ReadSource::new(reader) }
    }

    /// Read until `n` bytes follow the cursor or the input ends; returns how many follow.
    /// `n` must be at most the window's size ([`WINDOW`], or more after [`Source::ahead`]).
    /// Out of line: it runs once per window, not per byte.
    #[cold]
    #[inline(never)]
    fn fill(&mut self, n: usize) -> Result<usize, Fault> {
        debug_assert!(n <= self.buf.len());
        if self.end - self.pos >= n {
            return Ok(self.end - self.pos);
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        while self.end < n && !self.eof {
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Fault::Io(e)),
            }
        }
        Ok(self.end)
    }

    /// Take `n` bytes (any length) into a vector that grows with what really arrives.
    fn take_owned(&mut self, n: u64) -> Result<Vec<u8>, Fault> {
        let from_window = (self.end - self.pos).min(n.min(usize::MAX as u64) as usize);
        let mut out = Vec::with_capacity(from_window);
        out.extend_from_slice(&self.buf[self.pos..self.pos + from_window]);
        self.pos += from_window;
        while (out.len() as u64) < n {
            let got = self.fill(1)?;
            if got == 0 {
                return Err(Fault::Short { available: out.len() as u64 });
            }
            let k = (self.end - self.pos).min((n - out.len() as u64).min(usize::MAX as u64) as usize);
            out.extend_from_slice(&self.buf[self.pos..self.pos + k]);
            self.pos += k;
        }
        Ok(out)
    }
}

impl<'a, R: Read> Source<'a> for ReadSource<R> {
    #[inline]
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }
    fn stored_bytes(&self) -> u64 {
        match &self.stored {
            Some(c) => c.load(Ordering::Relaxed),
            None => self.offset(),
        }
    }
    #[inline(always)]
    fn next_byte(&mut self) -> Result<Option<u8>, Fault> {
        if self.pos == self.end && self.fill(1)? == 0 {
            return Ok(None);
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(Some(b))
    }
    #[inline(always)]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Fault> {
        if self.end - self.pos < N {
            let got = self.fill(N)?;
            if got < N {
                return Err(Fault::Short { available: got as u64 });
            }
        }
        let mut a = [0u8; N];
        a.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        Ok(a)
    }
    #[inline]
    fn short(&mut self, n: usize) -> Result<&[u8], Fault> {
        if self.end - self.pos < n {
            let got = self.fill(n)?;
            if got < n {
                return Err(Fault::Short { available: got as u64 });
            }
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn unread(&mut self, n: usize) {
        self.pos -= n;
    }
    fn bytes(&mut self, n: u64) -> Result<Cow<'a, [u8]>, Fault> {
        self.take_owned(n).map(Cow::Owned)
    }
    fn line(&mut self) -> Result<Cow<'a, [u8]>, Fault> {
        let mut out = Vec::new();
        loop {
            if self.pos == self.end && self.fill(1)? == 0 {
                return Err(Fault::Short { available: out.len() as u64 });
            }
            let window = &self.buf[self.pos..self.end];
            match window.iter().position(|&b| b == b'\n') {
                Some(k) => {
                    out.extend_from_slice(&window[..k]);
                    self.pos += k + 1;
                    return Ok(Cow::Owned(out));
                }
                None => {
                    out.extend_from_slice(window);
                    self.pos = self.end;
                }
            }
        }
    }
    fn expect(&mut self, n: u64) -> Result<(), Fault> {
        if n <= WINDOW as u64 {
            let got = self.fill(n as usize)?;
            if (got as u64) < n {
                return Err(Fault::Short { available: got as u64 });
            }
        } else if let Some(len) = self.len_hint {
            let left = len.saturating_sub(self.offset());
            if n > left {
                return Err(Fault::Short { available: left });
            }
        }
        Ok(())
    }
    fn buffered(&self) -> u64 {
        (self.end - self.pos) as u64
    }
    fn known_left(&self) -> Option<u64> {
        if self.eof {
            Some((self.end - self.pos) as u64)
        } else {
            self.len_hint.map(|len| len.saturating_sub(self.offset()))
        }
    }
    fn ahead(&mut self, n: usize) -> Result<&[u8], Fault> {
        if n > self.buf.len() {
            // Grown once, to what the caller reads ahead (a few MiB); it stays that size.
            self.buf.resize(n, 0);
        }
        let got = self.fill(n)?;
        Ok(&self.buf[self.pos..self.pos + got.min(n)])
    }
    fn skip(&mut self, n: usize) {
        debug_assert!(self.pos + n <= self.end);
        self.pos += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out one byte per call, to exercise every refill path.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match (self.0.split_first(), buf.first_mut()) {
                (Some((b, rest)), Some(slot)) => {
                    *slot = *b;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    #[test]
    fn window_refills_across_every_read_size() {
        let data: Vec<u8> = (0..3 * WINDOW + 17).map(|i| (i % 251) as u8).collect();
        let mut s = ReadSource::new(Trickle(&data));
        let mut at = 0usize;
        let mut step = 0usize;
        while at < data.len() {
            step = (step + 1) % 5;
            match step {
                0 => {
                    assert_eq!(Source::next_byte(&mut s).unwrap(), Some(data[at]));
                    at += 1;
                }
                1 if at + 8 <= data.len() => {
                    let a: [u8; 8] = Source::array(&mut s).unwrap();
                    assert_eq!(&a[..], &data[at..at + 8]);
                    at += 8;
                }
                2 if at + 200 <= data.len() => {
                    assert_eq!(Source::short(&mut s, 200).unwrap(), &data[at..at + 200]);
                    at += 200;
                }
                3 if at + WINDOW + 5 <= data.len() => {
                    let b = Source::bytes(&mut s, (WINDOW + 5) as u64).unwrap();
                    assert_eq!(&b[..], &data[at..at + WINDOW + 5]);
                    at += WINDOW + 5;
                }
                _ => {}
            }
            assert_eq!(Source::offset(&s), at as u64);
        }
        assert_eq!(Source::next_byte(&mut s).unwrap(), None);
    }

    #[test]
    fn a_long_claim_fails_with_what_was_there() {
        let mut s = ReadSource::new(&b"abcdef"[..]);
        match Source::bytes(&mut s, 1 << 62) {
            Err(Fault::Short { available }) => assert_eq!(available, 6),
            other => panic!("{other:?}"),
        }
        let mut s = ReadSource::new(&b"ab"[..]);
        assert!(matches!(Source::array::<4>(&mut s), Err(Fault::Short { available: 2 })));
        let mut s = ReadSource::new(&b"no newline"[..]);
        assert!(matches!(Source::line(&mut s), Err(Fault::Short { available: 10 })));
    }
}
