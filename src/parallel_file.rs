//! Reading a regular file's large reads on several threads at once.
//!
//! Why: the parser refills its window (several MiB: `memsnap_model`'s parallel reader asks for
//! three chunks per thread) on its own thread, while the decoding threads wait for the window.
//! Copying those bytes out of the page cache is a fifth of the parser thread's time on the
//! 1.07 GB bench file (`docs/performance.md`). The copies of disjoint parts of one read are
//! independent, so a large read is cut into one part per thread, each read with `pread` at its
//! own offset. Nothing more is buffered: each part lands where a single `read` would have put
//! it. Small reads (most of what the sequential reader asks) are one `pread`.
//!
//! What a caller sees is a `read`: bytes from the current position, fewer at the end of the
//! file, an error only when no byte came before it (the bytes that did come are handed over, and
//! the next read meets the error again), as a single `read` would.

use std::fs::File;
use std::io::{self, Read};

use rayon::prelude::*;

/// Reads shorter than twice this are one `pread`: below it a part's copy is too short to pay
/// for handing it to another thread.
const MIN_PART: usize = 1 << 20;

/// A regular file read from its start, large reads in parallel (see the module comment).
pub struct ParallelFile {
    file: File,
    pos: u64,
}

impl ParallelFile {
    /// `file`, read from offset 0 whatever its cursor.
    pub fn new(file: File) -> ParallelFile {
        ParallelFile { file, pos: 0 }
    }
}

impl Read for ParallelFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // A small read does not ask rayon for its threads: that would start its pool at the
        // first read, and each of its threads reserves a malloc arena (64 MiB of address space
        // with glibc) before a decompressor makes its dictionary, which then fails under an
        // address-space limit that the file reads within otherwise (`ulimit -v`;
        // `allocation_failure_is_an_error_line_not_an_abort` in tests/cli/hostile_streams.rs).
        if buf.len() < 2 * MIN_PART || rayon::current_num_threads() < 2 {
            let n = read_full_at(&self.file, buf, self.pos)?;
            self.pos += n as u64;
            return Ok(n);
        }
        let part = buf.len().div_ceil(rayon::current_num_threads()).max(MIN_PART);
        let (file, pos) = (&self.file, self.pos);
        let parts: Vec<(usize, io::Result<usize>)> = buf
            .par_chunks_mut(part)
            .enumerate()
            .map(|(i, chunk)| (chunk.len(), read_full_at(file, chunk, pos + (i * part) as u64)))
            .collect();
        // The bytes up to the first part that came short (the end of the file) or failed.
        let mut n = 0;
        for (len, got) in parts {
            match got {
                Ok(k) => {
                    n += k;
                    if k < len {
                        break;
                    }
                }
                Err(e) if n == 0 => return Err(e),
                Err(_) => break,
            }
        }
        self.pos += n as u64;
        Ok(n)
    }
}

/// Fill `buf` from `file` at `at` until it is full or the file ends; an error after some bytes
/// returns those bytes.
fn read_full_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match pread(file, &mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if got == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(got)
}

#[cfg(unix)]
fn pread(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, at)
}

#[cfg(windows)]
fn pread(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 + i / 4093) as u8).collect();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&data).unwrap();
        f.flush().unwrap();
        (f, data)
    }

    /// Reads `r` to its end with reads of `piece` bytes.
    fn drain(r: &mut ParallelFile, piece: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0; piece];
        loop {
            match r.read(&mut buf).unwrap() {
                0 => return out,
                n => out.extend_from_slice(&buf[..n]),
            }
        }
    }

    #[test]
    fn reads_every_byte_in_order_whatever_the_read_sizes_and_threads() {
        for len in [0, 1, MIN_PART - 1, 2 * MIN_PART, 2 * MIN_PART + 1, 7 * MIN_PART + 12_345] {
            let (f, want) = file_of(len);
            for threads in [1, 2, 3, 8] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                for piece in [4096, 2 * MIN_PART, 3 * MIN_PART + 7, 16 * MIN_PART] {
                    let mut r = ParallelFile::new(File::open(f.path()).unwrap());
                    let got = pool.install(|| drain(&mut r, piece));
                    assert!(got == want, "len {len}, {threads} threads, reads of {piece}: {} bytes", got.len());
                }
            }
        }
    }

    #[test]
    fn a_large_read_past_the_end_returns_what_the_file_has() {
        let (f, want) = file_of(3 * MIN_PART + 5);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
        let mut r = ParallelFile::new(File::open(f.path()).unwrap());
        let mut buf = vec![0; 8 * MIN_PART];
        let n = pool.install(|| r.read(&mut buf)).unwrap();
        assert_eq!(n, want.len());
        assert!(buf[..n] == want[..]);
        assert_eq!(pool.install(|| r.read(&mut buf)).unwrap(), 0);
    }
}
