//! The memory budget: the pickle bytes a file is estimated to cost (from its size, or the
//! decompressed size its gzip, zstd or xz header or index states) and the default budget of
//! pickle bytes in flight (a third of the available memory).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::input::{Compression, EXPANSION_ALLOWANCE, MAX_EXPANSION};

/// Pickle bytes a file is admitted at, and whether that is only an estimate (which the reader
/// then holds the file to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Estimate {
    pub(super) pickle_bytes: u64,
    pub(super) exact: bool,
}

/// A plain regular file's size is exact. For a compressed file, the size it decompresses to as
/// its own header or index says (gzip ISIZE, zstd frame content size, xz index) — a claim the
/// file could get wrong — else 32 times its size (real snapshots compress about 25 times).
/// Never above what the reader would accept from it. Anything else (stdin, a pipe) is
/// admitted at the whole budget: it is read alone.
pub(super) fn estimate_pickle_bytes(path: &Path) -> Option<Estimate> {
    // Bytes handed over in memory (the Python extension) are not a file to look into.
    if crate::invocation::in_memory(path).is_some() {
        return None;
    }
    let mut f = File::open(path).ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let len = meta.len();
    let mut head = [0u8; 18];
    let n = read_up_to(&mut f, &mut head);
    let claimed = match Compression::detect(&head[..n]) {
        Compression::None => return Some(Estimate { pickle_bytes: len, exact: true }),
        Compression::Gzip => tail_u32(&mut f, len).map(|isize| u64::from(isize).max(len)),
        Compression::Zstd => zstd::zstd_safe::get_frame_content_size(&head[..n]).ok().flatten(),
        Compression::Xz => xz_uncompressed_size(&mut f, len),
    };
    let most = EXPANSION_ALLOWANCE.saturating_add(len.saturating_mul(MAX_EXPANSION));
    let pickle_bytes = claimed.unwrap_or(len.saturating_mul(32)).min(most);
    Some(Estimate { pickle_bytes, exact: false })
}

fn read_up_to(f: &mut File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    n
}

fn read_at(f: &mut File, offset: u64, buf: &mut [u8]) -> Option<()> {
    f.seek(SeekFrom::Start(offset)).ok()?;
    (read_up_to(f, buf) == buf.len()).then_some(())
}

/// The last four bytes, little-endian (gzip's ISIZE: the uncompressed size modulo 2³²).
fn tail_u32(f: &mut File, len: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    read_at(f, len.checked_sub(4)?, &mut b)?;
    Some(u32::from_le_bytes(b))
}

/// Sum of the uncompressed sizes in the indexes of an xz file's streams, read from the end.
fn xz_uncompressed_size(f: &mut File, len: u64) -> Option<u64> {
    fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for i in 0..9 {
            let byte = *b.get(*pos)?;
            *pos += 1;
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let mut end = len;
    let mut total = 0u64;
    for _ in 0..1024 {
        // Stream padding: zero bytes in groups of four between and after streams.
        let mut word = [0u8; 4];
        while end >= 4 && read_at(f, end - 4, &mut word).is_some() && word == [0; 4] {
            end -= 4;
        }
        let mut footer = [0u8; 12];
        read_at(f, end.checked_sub(12)?, &mut footer)?;
        if &footer[10..12] != b"YZ" {
            return None;
        }
        let index_size = (u64::from(u32::from_le_bytes(footer[4..8].try_into().ok()?)) + 1) * 4;
        let index_start = end.checked_sub(12 + index_size)?;
        let mut index = vec![0u8; usize::try_from(index_size).ok().filter(|&n| n <= 64 << 20)?];
        read_at(f, index_start, &mut index)?;
        let mut pos = 1; // index indicator 0x00
        if index[0] != 0 {
            return None;
        }
        let records = varint(&index, &mut pos)?;
        let mut blocks = 0u64;
        for _ in 0..records {
            let unpadded = varint(&index, &mut pos)?;
            total = total.checked_add(varint(&index, &mut pos)?)?;
            blocks = blocks.checked_add(unpadded.checked_add(3)? / 4 * 4)?;
        }
        let start = index_start.checked_sub(blocks)?.checked_sub(12)?;
        if start == 0 {
            return Some(total);
        }
        end = start;
    }
    None
}

/// Memory this process may still use: `MemAvailable`, lowered by a cgroup v2 limit if any.
fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let mut avail = kib * 1024;
    let cg = |f: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{f}")).ok().and_then(|s| s.trim().parse::<u64>().ok())
    };
    if let (Some(max), Some(cur)) = (cg("memory.max"), cg("memory.current")) {
        avail = avail.min(max.saturating_sub(cur));
    }
    Some(avail)
}

/// A third of the available memory: reading a snapshot peaks at about 1.5 times its pickle
/// bytes (the mapped or decompressed pickle, then the model, replay and analysis), and the rest
/// is headroom for the system.
pub(super) fn default_budget() -> u64 {
    (available_memory().unwrap_or(12 << 30) / 3).max(256 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_read_the_decompressed_size_from_headers() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/variants");
        let plain = std::fs::metadata(dir.join("s12_p4.pickle")).unwrap().len();
        let est = |name: &str| estimate_pickle_bytes(&dir.join(name));
        assert_eq!(est("s12_p4.pickle"), Some(Estimate { pickle_bytes: plain, exact: true }));
        for name in ["s12_p4.pickle.gz", "s12_p4.pickle.xz"] {
            assert_eq!(est(name), Some(Estimate { pickle_bytes: plain, exact: false }), "{name}");
        }
        // This zstd stream was written without a content size: the estimate falls back to 32
        // times the file, and the reader holds the file to it.
        for name in ["s12_p4.pickle.zst", "s12_p4_zstd_misnamed.pickle"] {
            let len = std::fs::metadata(dir.join(name)).unwrap().len();
            assert_eq!(est(name), Some(Estimate { pickle_bytes: len * 32, exact: false }), "{name}");
        }
        assert_eq!(est("no such file"), None);
        assert_eq!(estimate_pickle_bytes(Path::new("/dev/null")), None, "not a regular file");
    }
}
