//! Source locations as people read them: a [`Site`] (file, line, function) and the short labels
//! every output names code by (`file.py:12 (function)`, paths cut to their last components).

use memsnap_model::{clip, FrameId, Snapshot};

/// A site as plain data.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Site {
    pub filename: String,
    pub line: u32,
    pub function: String,
}

impl Site {
    pub fn of(snap: &Snapshot, f: FrameId) -> Site {
        let fr = snap.frame(f);
        Site { filename: snap.str(fr.filename).to_string(), line: fr.line, function: snap.str(fr.name).to_string() }
    }

    /// `file.py:12 (function)` with the path shortened to its last components. A label for
    /// people: the file and function names are [`clip`]ped (the full ones stay in the fields).
    pub fn short(&self) -> String {
        short_text(&self.filename, self.line, &self.function)
    }
}

fn short_text(filename: &str, line: u32, function: &str) -> String {
    // A profiler-converted file knows the Python function only: no file, no line.
    if line == 0 && filename == memsnap_model::PROFILER_FRAME_FILENAME {
        return clip(function).into_owned();
    }
    format!("{}:{} ({})", clip(short_path(filename)), line, clip(function))
}

/// [`Site::short`] of a frame, without copying its names first.
pub(crate) fn short_of(snap: &Snapshot, f: FrameId) -> String {
    let fr = snap.frame(f);
    short_text(snap.str(fr.filename), fr.line, snap.str(fr.name))
}

/// The last three components of a path: enough to recognise `torch/nn/functional.py` or the
/// user's `train.py`, short enough to read.
pub fn short_path(p: &str) -> &str {
    let mut cut = p.len();
    for _ in 0..3 {
        match p[..cut].rfind('/') {
            Some(i) => cut = i,
            None => return p,
        }
    }
    &p[cut + 1..]
}
