//! Reading an input on a thread of its own, a few blocks ahead of the parser.
//!
//! Why: the parser's thread is the one the parallel reader merges on, and every byte it waits
//! for is time the other threads idle. A compressed input is decompressed as it is parsed
//! (`crate::input`), and on the parser's thread the decompressor's time adds to the parse
//! instead of overlapping it: xz inflates the 87 MB bench file in about 0.3 s, longer than the
//! parse takes (gzip and zstd inflate faster, and gain less; `docs/performance.md`).
//!
//! The reading thread reads [`BLOCK`] bytes at a time into buffers the parser hands back when it
//! has copied them out, at most [`DEPTH`] ahead, so it holds a bounded amount of memory
//! whatever the input. What the parser sees is unchanged: the same bytes in order, the same
//! error at the same place (an error is handed over after the bytes read before it), and the
//! stored-bytes count ([`ReadAhead::stored`]) moves only when the parser takes a block, to what
//! the input had consumed when that block was read, so that it does not depend on how far ahead
//! the thread happens to be (the object budget reads it; see `memsnap_pickle::Limits`).

use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender};
use std::sync::Arc;

/// Bytes read per block: large enough that the channel's cost per block is nothing, small
/// enough that [`DEPTH`] blocks are a small part of the memory a read takes.
const BLOCK: usize = 1 << 20;
/// Blocks read ahead of the parser at most (plus the one it is copying from): a few keep the
/// decompressor busy while the parser works on a window, without holding more than a few MiB.
const DEPTH: usize = 4;

/// What the reading thread hands over: what it read, with the stored count once it was read.
struct Block {
    got: Got,
    stored: u64,
}

/// Bytes, the end of the input, or the error that ended it.
enum Got {
    Bytes(Vec<u8>),
    End,
    Failed(io::Error),
}

/// A reader that reads its input on its own thread (see the module comment). The thread ends
/// at the input's end or error, or when this is dropped (after the read it is in).
pub struct ReadAhead {
    blocks: Receiver<Block>,
    /// Empty buffers back to the thread.
    spare: Sender<Vec<u8>>,
    current: Vec<u8>,
    at: usize,
    done: bool,
    stored: Arc<AtomicU64>,
}

impl ReadAhead {
    /// Read `inner` on a new thread; `inner_stored` counts the input bytes `inner` has consumed
    /// (it moves on that thread). Fails only when no thread can be started.
    pub fn spawn(mut inner: Box<dyn Read + Send>, inner_stored: Arc<AtomicU64>) -> io::Result<ReadAhead> {
        let (tx, blocks) = sync_channel::<Block>(DEPTH);
        let (spare, spares) = channel::<Vec<u8>>();
        std::thread::Builder::new().name("memsnap-read-ahead".into()).spawn(move || loop {
            let mut buf = spares.try_recv().unwrap_or_default();
            buf.resize(BLOCK, 0);
            let (n, error) = read_block(&mut inner, &mut buf);
            let stored = inner_stored.load(Ordering::Relaxed);
            if n > 0 {
                buf.truncate(n);
                // A failed send: the parser is gone (done or failed), nothing to read for.
                if tx.send(Block { got: Got::Bytes(buf), stored }).is_err() {
                    return;
                }
            }
            let last = match error {
                Some(error) => Got::Failed(error),
                None if n < BLOCK => Got::End,
                None => continue,
            };
            let _ = tx.send(Block { got: last, stored });
            return;
        })?;
        Ok(ReadAhead { blocks, spare, current: Vec::new(), at: 0, done: false, stored: Arc::new(AtomicU64::new(0)) })
    }

    /// Input bytes consumed as of the block the parser is reading (see the module comment).
    pub fn stored(&self) -> Arc<AtomicU64> {
        self.stored.clone()
    }
}

/// Fill `buf` from `r` until it is full, `r` ends or fails: the bytes read, and the error when
/// one ended it (handed over after those bytes).
fn read_block(r: &mut dyn Read, buf: &mut [u8]) -> (usize, Option<io::Error>) {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (got, Some(e)),
        }
    }
    (got, None)
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        while self.at == self.current.len() {
            if self.done {
                return Ok(0);
            }
            let block = self.blocks.recv().unwrap_or_else(|_| Block {
                got: Got::Failed(io::Error::other("the thread reading the input stopped")),
                stored: self.stored.load(Ordering::Relaxed),
            });
            self.stored.store(block.stored, Ordering::Relaxed);
            match block.got {
                Got::Bytes(buf) => {
                    let used = std::mem::replace(&mut self.current, buf);
                    if used.capacity() > 0 {
                        let _ = self.spare.send(used);
                    }
                    self.at = 0;
                }
                Got::End => self.done = true,
                Got::Failed(error) => {
                    self.done = true;
                    return Err(error);
                }
            }
        }
        let n = out.len().min(self.current.len() - self.at);
        out[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out `data` a few bytes at a time (sizes cycling through `steps`), then fails with
    /// `error` when one is set; counts what it handed out in `stored`.
    struct Dribble {
        data: Vec<u8>,
        at: usize,
        steps: Vec<usize>,
        step: usize,
        error: Option<io::ErrorKind>,
        stored: Arc<AtomicU64>,
    }

    impl Read for Dribble {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.at == self.data.len() {
                return match self.error {
                    Some(kind) => Err(io::Error::new(kind, "broken input")),
                    None => Ok(0),
                };
            }
            let n = self.steps[self.step % self.steps.len()].min(out.len()).min(self.data.len() - self.at);
            self.step += 1;
            out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            self.stored.fetch_add(n as u64, Ordering::Relaxed);
            Ok(n)
        }
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn ahead(data: &[u8], steps: &[usize], error: Option<io::ErrorKind>) -> ReadAhead {
        let stored = Arc::new(AtomicU64::new(0));
        let inner =
            Dribble { data: data.to_vec(), at: 0, steps: steps.to_vec(), step: 0, error, stored: stored.clone() };
        ReadAhead::spawn(Box::new(inner), stored).unwrap()
    }

    /// Reads `r` to its end in pieces of `piece` bytes; the bytes and the error that ended it.
    fn drain(r: &mut ReadAhead, piece: usize) -> (Vec<u8>, Option<io::Error>) {
        let mut out = Vec::new();
        let mut buf = vec![0; piece];
        loop {
            match r.read(&mut buf) {
                Ok(0) => return (out, None),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) => return (out, Some(e)),
            }
        }
    }

    #[test]
    fn hands_over_every_byte_in_order_across_blocks() {
        for len in [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 12_345, (DEPTH + 3) * BLOCK] {
            let want = data(len);
            for (steps, piece) in
                [(&[BLOCK][..], 1 << 16), (&[1, 7, 4096, 100_003][..], 977), (&[65_536][..], 3 * BLOCK)]
            {
                let mut r = ahead(&want, steps, None);
                let (got, err) = drain(&mut r, piece);
                assert!(err.is_none(), "len {len}: {err:?}");
                assert!(got == want, "len {len}, steps {steps:?}: {} bytes back, {} sent", got.len(), want.len());
                assert_eq!(r.stored().load(Ordering::Relaxed), len as u64, "the count reaches the end");
                assert_eq!(r.read(&mut [0; 8]).unwrap(), 0, "stays ended");
            }
        }
    }

    #[test]
    fn an_error_comes_after_the_bytes_read_before_it() {
        let want = data(2 * BLOCK + 999);
        let mut r = ahead(&want, &[1000, 33], Some(io::ErrorKind::InvalidData));
        let (got, err) = drain(&mut r, 4096);
        assert!(got == want, "{} bytes before the error, {} sent", got.len(), want.len());
        let err = err.expect("the input's error");
        assert_eq!((err.kind(), err.to_string()), (io::ErrorKind::InvalidData, "broken input".to_string()));
        assert_eq!(r.read(&mut [0; 8]).unwrap(), 0, "nothing after the error");
    }

    #[test]
    fn the_stored_count_moves_with_the_blocks_the_parser_takes() {
        let want = data(DEPTH * BLOCK * 2);
        let mut r = ahead(&want, &[BLOCK], None);
        let mut buf = vec![0; 10];
        r.read_exact(&mut buf).unwrap();
        // Whatever the thread has read since, the count is that of the first block.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(r.stored().load(Ordering::Relaxed), BLOCK as u64);
        let mut rest = vec![0; BLOCK];
        r.read_exact(&mut rest).unwrap();
        assert_eq!(r.stored().load(Ordering::Relaxed), 2 * BLOCK as u64);
    }

    #[test]
    fn dropping_the_reader_ends_the_thread() {
        let stored = Arc::new(AtomicU64::new(0));
        let inner =
            Dribble { data: data(64 * BLOCK), at: 0, steps: vec![BLOCK], step: 0, error: None, stored: stored.clone() };
        let mut r = ReadAhead::spawn(Box::new(inner), stored.clone()).unwrap();
        r.read_exact(&mut [0; 16]).unwrap();
        drop(r);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let read = stored.load(Ordering::Relaxed);
        assert!(read <= ((DEPTH + 3) * BLOCK) as u64, "read {read} bytes ahead of a parser that is gone");
    }
}
