//! Reading an input path (or `-` for stdin) into bytes, decompressing gzip, zstd and xz by their
//! magic bytes whatever the file is called.
//!
//! Plain files are memory-mapped so a multi-GB snapshot is never copied; the pickle reader
//! borrows strings from the mapping. The mapping is only read, never written.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use memmap2::Mmap;

/// Bytes of one input, either mapped or owned (decompressed or read from stdin).
pub enum InputBytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl InputBytes {
    /// Tell the kernel that mapped pages before `offset` are no longer needed, so a multi-GB
    /// file read front to back does not stay resident (and count in our RSS) as a whole.
    /// Pages are re-read from the file if touched again, so borrowed data stays valid.
    pub fn release_before(&self, offset: usize) {
        #[cfg(unix)]
        if let InputBytes::Mapped(m) = self {
            let page = 4096;
            let end = offset / page * page;
            if end > 0 {
                // SAFETY-relevant: DONTNEED on a read-only private file mapping only drops clean
                // page-cache references; contents are refetched from the file on access.
                #[allow(unsafe_code)]
                let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, 0, end) };
            }
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            InputBytes::Mapped(m) => m,
            InputBytes::Owned(v) => v,
        }
    }
}

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

/// Upper bound on the decompressed size we accept, so a compression bomb cannot take all memory:
/// half of physical memory (read from `/proc/meminfo`), and never more than 64 GiB. Real
/// snapshots reach a few GB.
pub fn max_decompressed() -> u64 {
    const CEILING: u64 = 64 << 30;
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    total.map_or(CEILING, |t| (t / 2).min(CEILING))
}

/// Read `path` (or stdin for `-`), decompressing when needed.
pub fn read_input(path: &Path) -> io::Result<(InputBytes, Compression)> {
    let raw = if path.as_os_str() == "-" {
        let mut v = Vec::new();
        io::stdin().lock().read_to_end(&mut v)?;
        InputBytes::Owned(v)
    } else {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if meta.is_dir() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "is a directory"));
        }
        if meta.len() == 0 {
            InputBytes::Owned(Vec::new())
        } else {
            // Memory-mapping a regular file: the mapping is read-only and we accept that a
            // concurrent truncation by another process would fault, like every mmap reader.
            #[allow(unsafe_code)]
            let map = unsafe { Mmap::map(&file)? };
            #[cfg(unix)]
            {
                let _ = map.advise(memmap2::Advice::Sequential);
            }
            InputBytes::Mapped(map)
        }
    };
    let compression = Compression::detect(raw.as_slice());
    if compression == Compression::None {
        return Ok((raw, compression));
    }
    let data = raw.as_slice();
    let mut reader: Box<dyn Read + '_> = match compression {
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(data)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(data)?),
        Compression::Xz => Box::new(xz2::read::XzDecoder::new_multi_decoder(data)),
        Compression::None => unreachable!("handled above"),
    };
    let fail = |e: io::Error| io::Error::new(e.kind(), format!("{} decompression failed: {e}", compression.name()));
    // Look at the first decompressed bytes before inflating the rest: a compressed file that is
    // not a pickle (or a compression bomb of zeros) is rejected after 64 KiB, not gigabytes.
    let mut out = Vec::new();
    (&mut reader).take(64 << 10).read_to_end(&mut out).map_err(fail)?;
    if let Some(&first) = out.first() {
        if !matches!(first, 0x80 | b'(' | b']' | b'}') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} stream does not contain a pickle (first decompressed byte 0x{first:02x})",
                    compression.name()
                ),
            ));
        }
    }
    let limit = max_decompressed();
    reader.take(limit + 1 - out.len() as u64).read_to_end(&mut out).map_err(fail)?;
    if out.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} stream decompresses to more than {limit} bytes (half of this machine's memory, at most 64 GiB)",
                compression.name()
            ),
        ));
    }
    Ok((InputBytes::Owned(out), compression))
}
