//! Snapshots saved with `torch.save` instead of `_dump_snapshot`.
//!
//! `torch.save(torch.cuda.memory._snapshot(), path)` writes a zip archive with PyTorch's stream
//! writer: its first entry is `NAME/data.pkl`, stored (not compressed), a protocol-2 pickle of
//! the object, then `byteorder`, `version` and the other records. The local header of that first
//! entry sets the data-descriptor flag, so it gives no sizes; none is needed, since a pickle ends
//! at its `STOP` and what follows is never read. A snapshot holds no tensors, so its `data.pkl`
//! has no persistent ids; any other object saved this way (a state dict, with tensors) is refused
//! by the VM at its first `BINPERSID`, or by the converter for its shape. Why by hand and not a zip
//! crate: one fixed-layout header at byte 0 is all there is to read, and a zip crate reads the
//! central directory at the end of the file, which a stream (a pipe, a decompressor) cannot reach.

use std::io::Read;

use super::{read_up_to, shape, ReadError};

/// The signature of a zip local file header.
pub(super) const ZIP_MAGIC: &[u8; 4] = b"PK\x03\x04";
/// Bytes of a local file header before the entry's name (APPNOTE 4.3.7).
const FIXED: usize = 30;
/// The name `torch.save` gives the pickle (after the archive's folder).
const DATA_PKL: &[u8] = b"data.pkl";

/// The lengths of the name and the extra field that follow the fixed part `head` of the first
/// entry's local header, once it is checked to be a stored entry.
fn name_and_extra(head: &[u8]) -> Result<(usize, usize), ReadError> {
    let Some(head) = head.get(..FIXED) else { return Err(cut_short("byte 0")) };
    let u16_at = |i: usize| u16::from_le_bytes([head[i], head[i + 1]]);
    let method = u16_at(8);
    if method != 0 {
        return Err(shape(
            "byte 8",
            format!("a zip archive whose first entry is compressed (method {method}): torch.save stores its data.pkl, so this is not a snapshot saved with torch.save"),
        ));
    }
    Ok((usize::from(u16_at(26)), usize::from(u16_at(28))))
}

/// Check that the first entry's `name` is a `data.pkl`.
fn check_name(name: &[u8]) -> Result<(), ReadError> {
    let base = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
    if base == DATA_PKL {
        Ok(())
    } else {
        Err(shape(
            "byte 30",
            "a zip archive whose first entry is not data.pkl: not a snapshot saved with torch.save (memsnap reads the pickle of _dump_snapshot, or torch.save(torch.cuda.memory._snapshot(), path))",
        ))
    }
}

/// Where the pickle of a `torch.save` archive held in memory starts.
pub(super) fn pickle_offset(data: &[u8]) -> Result<usize, ReadError> {
    let (name, extra) = name_and_extra(data)?;
    // As a reader sees it: the name and the extra field read in one go, then the name checked.
    let start = FIXED + name + extra;
    if start > data.len() {
        return Err(cut_short("byte 30"));
    }
    check_name(&data[FIXED..FIXED + name])?;
    Ok(start)
}

/// Read the first entry's local header from `stream`, checked as [`pickle_offset`] checks it,
/// leaving the stream at the pickle.
pub(super) fn skip_header(stream: &mut impl Read) -> Result<(), ReadError> {
    let mut fixed = [0u8; FIXED];
    let got = read_up_to(stream, &mut fixed)?;
    let (name, extra) = name_and_extra(&fixed[..got])?;
    let mut rest = vec![0u8; name + extra];
    if read_up_to(stream, &mut rest)? < rest.len() {
        return Err(cut_short("byte 30"));
    }
    check_name(&rest[..name])
}

fn cut_short(at: &str) -> ReadError {
    shape(at, "a zip archive cut short in its first entry's header: not a snapshot")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(method: u16, name: &[u8], extra: usize) -> Vec<u8> {
        let mut h = ZIP_MAGIC.to_vec();
        h.extend_from_slice(&[0, 0, 8, 8]);
        h.extend_from_slice(&method.to_le_bytes());
        h.extend_from_slice(&[0; 16]);
        h.extend_from_slice(&(name.len() as u16).to_le_bytes());
        h.extend_from_slice(&(extra as u16).to_le_bytes());
        h.extend_from_slice(name);
        h.extend(std::iter::repeat_n(b'Z', extra));
        h
    }

    #[test]
    fn the_pickle_starts_after_the_name_and_the_padding() {
        let h = header(0, b"snap/data.pkl", 51);
        assert_eq!(pickle_offset(&h).unwrap(), 30 + 13 + 51);
        assert_eq!(pickle_offset(&header(0, b"data.pkl", 0)).unwrap(), 38);
    }

    #[test]
    fn other_archives_are_refused() {
        let e = |h: &[u8]| pickle_offset(h).unwrap_err().to_string();
        assert!(e(&header(8, b"snap/data.pkl", 0)).contains("compressed (method 8)"));
        assert!(e(&header(0, b"snap/byteorder", 0)).contains("not data.pkl"));
        assert!(e(&header(0, b"x/data.pkl.bak", 0)).contains("not data.pkl"));
        assert!(e(&header(0, b"snap/data.pkl", 9)[..40]).contains("cut short"));
        assert!(e(&ZIP_MAGIC[..]).contains("cut short"));
    }
}
