//! Opening an input path (or `-` for stdin) as a stream of pickle bytes, decompressing gzip,
//! zstd and xz by their magic bytes whatever the file is called.
//!
//! Everything is read as a stream, through the reader's fixed window: regular files, pipes,
//! `<(…)` process substitutions, devices and `/proc` files alike, and compressed data is
//! decompressed as it is parsed (on a thread of its own, a few MiB ahead: `crate::read_ahead`),
//! never into memory as a whole. Nothing is memory-mapped: a mapped file that another process
//! truncates kills the reader with SIGBUS, while a read just returns less (and the reader
//! reports a truncated pickle).
//!
//! Decompression has a work budget: a stream may expand at most [`MAX_EXPANSION`] times its
//! compressed bytes read so far (plus [`EXPANSION_ALLOWANCE`]). Real snapshots compress 18–25×
//! with xz (every bundled fixture and both bench files); a bomb of a billion tiny opcodes in
//! 565 KB of xz expands 3,500×.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use memsnap_pickle::CountingReader;

use crate::invocation::in_memory;
use crate::parallel_file::ParallelFile;
use crate::read_ahead::ReadAhead;

/// The compression a file uses, detected from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
    Xz,
}

impl Compression {
    pub fn detect(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
            Compression::Xz
        } else {
            Compression::None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
            Compression::Xz => "xz",
        }
    }
}

/// Most pickle bytes one compressed byte may expand to (see the module comment): 40 times the
/// highest ratio of any real snapshot measured, so no real file comes near it.
pub const MAX_EXPANSION: u64 = 1000;
/// Pickle bytes any compressed input may expand to regardless of its size.
pub const EXPANSION_ALLOWANCE: u64 = 64 << 20;

/// Bytes at the start of a file that tell the compression apart.
const MAGIC: usize = 6;

/// An input opened for reading.
pub struct Opened {
    /// The pickle bytes (decompressed when needed).
    pub reader: Box<dyn Read + Send>,
    pub compression: Compression,
    /// Bytes of the file as stored, read so far.
    pub stored: Arc<AtomicU64>,
    /// Pickle bytes handed out so far.
    pub pickle: Arc<AtomicU64>,
    /// The size of a regular file, known before reading.
    pub regular_len: Option<u64>,
    /// Set when reading stopped at the pickle-byte cap given to [`open_input`].
    pub over_cap: Arc<AtomicBool>,
}

impl Opened {
    /// The pickle's size when the input is a plain regular file (its length), else 0.
    pub fn size_hint(&self) -> u64 {
        match (self.compression, self.regular_len) {
            (Compression::None, Some(len)) => len,
            _ => 0,
        }
    }

    /// Read what follows the pickle to the end, so the sizes count the whole input (a plain
    /// regular file's length is known without reading).
    pub fn finish(mut self) -> io::Result<(u64, u64)> {
        if let (Compression::None, Some(len)) = (self.compression, self.regular_len) {
            return Ok((len, len));
        }
        io::copy(&mut self.reader, &mut io::sink())?;
        Ok((self.stored.load(Ordering::Relaxed), self.pickle.load(Ordering::Relaxed)))
    }
}

/// Open `path` (or stdin for `-`); a name the run was handed bytes under
/// ([`crate::invocation::in_memory`]) reads those bytes instead of a file. With a `cap`, reading fails once the pickle exceeds that
/// many bytes (and [`Opened::over_cap`] says so): `batch` admits an input whose decompressed
/// size it only estimated, and holds it to the estimate.
pub fn open_input(path: &Path, cap: Option<u64>) -> io::Result<Opened> {
    let (raw, regular_len): (Box<dyn Read + Send>, Option<u64>) = if let Some(bytes) = in_memory(path) {
        // Handed to this run in memory (the Python extension): read like a regular file.
        let len = bytes.as_ref().len() as u64;
        (Box::new(io::Cursor::new(bytes)), Some(len))
    } else if path.as_os_str() == "-" {
        (Box::new(io::stdin()), None)
    } else {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if meta.is_dir() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "is a directory"));
        }
        // Only a regular file's length means anything: pipes, devices and /proc files report
        // 0 (or a device size) and are read to their end instead.
        let regular_len = meta.is_file().then_some(meta.len());
        // A file with a length is read at offsets, its large reads in parallel; the rest (a
        // /proc file reports 0) read as they come.
        let raw: Box<dyn Read + Send> = match regular_len {
            Some(len) if len > 0 => Box::new(ParallelFile::new(file)),
            _ => Box::new(file),
        };
        (raw, regular_len)
    };
    let (counted, stored) = CountingReader::new(raw);
    let mut counted: Box<dyn Read + Send> = Box::new(counted);
    let mut head = Vec::with_capacity(MAGIC);
    (&mut counted).take(MAGIC as u64).read_to_end(&mut head)?;
    let compression = Compression::detect(&head);
    let stream = io::Cursor::new(head).chain(counted);
    let decoded: Box<dyn Read + Send> = match compression {
        Compression::None => Box::new(stream),
        Compression::Gzip => Box::new(Expansion::new(flate2::read::MultiGzDecoder::new(stream), compression, &stored)),
        Compression::Zstd => Box::new(Expansion::new(zstd::stream::read::Decoder::new(stream)?, compression, &stored)),
        Compression::Xz => {
            Box::new(Expansion::new(xz2::read::XzDecoder::new_multi_decoder(stream), compression, &stored))
        }
    };
    let over_cap = Arc::new(AtomicBool::new(false));
    let decoded: Box<dyn Read + Send> = match cap {
        Some(cap) => Box::new(Capped { inner: decoded, left: cap, over_cap: over_cap.clone() }),
        None => decoded,
    };
    // Decompression, several times slower than parsing, runs on a thread of its own
    // (`crate::read_ahead`). A plain file is read where it is parsed: reading it ahead gains
    // nothing measurable (a copy more per byte) and costs the read-ahead's buffers.
    let (decoded, stored) = if compression != Compression::None {
        let ahead = ReadAhead::spawn(decoded, stored)?;
        let stored = ahead.stored();
        (Box::new(ahead) as Box<dyn Read + Send>, stored)
    } else {
        (decoded, stored)
    };
    let (reader, pickle) = CountingReader::new(decoded);
    Ok(Opened { reader: Box::new(reader), compression, stored, pickle, regular_len, over_cap })
}

/// Fails a read past `left` more bytes, and records that it did.
struct Capped<R> {
    inner: R,
    left: u64,
    over_cap: Arc<AtomicBool>,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.over_cap.store(true, Ordering::Relaxed);
            return Err(io::Error::other("larger than its estimated size"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// A decompressor that fails once it has expanded more than the budget allows, and names the
/// compression in its errors.
struct Expansion<R> {
    inner: R,
    compression: Compression,
    stored: Arc<AtomicU64>,
    out: u64,
}

impl<R: Read> Expansion<R> {
    fn new(inner: R, compression: Compression, stored: &Arc<AtomicU64>) -> Expansion<R> {
        Expansion { inner, compression, stored: stored.clone(), out: 0 }
    }
}

impl<R: Read> Read for Expansion<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let name = self.compression.name();
        let n =
            self.inner.read(buf).map_err(|e| io::Error::new(e.kind(), format!("{name} decompression failed: {e}")))?;
        self.out += n as u64;
        let stored = self.stored.load(Ordering::Relaxed);
        if self.out > EXPANSION_ALLOWANCE.saturating_add(MAX_EXPANSION.saturating_mul(stored)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{name} stream expands to more than {} bytes from {stored} compressed bytes \
                     (over {MAX_EXPANSION}x; real snapshots compress about 25x): refusing a decompression bomb",
                    self.out
                ),
            ));
        }
        Ok(n)
    }
}
