//! Output files (`report -o`, `flamegraph -o`, `batch -o`): a file is replaced whole or not at
//! all. The new contents go to a temporary file in the target's directory, which is flushed,
//! synced and renamed over the target only when everything was written; on any failure the
//! target keeps its old contents and the temporary file is removed. A symbolic link at the
//! target is replaced by the new file (rename semantics): what it pointed to is not written.
//!
//! Names that are not files to replace are written in place: a device, FIFO or socket
//! (`/dev/null`, a named pipe), and anything under `/dev` or `/proc` or linked into them
//! (`/dev/stdout`, `/dev/fd/3`), which name an open descriptor rather than a file.
//!
//! Every error names the path it is about.

use std::fs::{File, OpenOptions, Permissions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

use crate::emit::emit_raw;

/// How a name given with `-o` is written.
#[derive(Debug)]
pub enum Destination {
    /// Written in place: a device, FIFO, socket or descriptor name.
    InPlace,
    /// Replaced by renaming a finished file over it; a regular file there keeps its
    /// permissions (`None`: a new file, mode 0666 less the umask).
    Replace { keep: Option<Permissions> },
}

fn names_a_descriptor(p: &Path) -> bool {
    p.starts_with("/dev") || p.starts_with("/proc")
}

/// What `path` is, and so how to write it.
pub fn destination(path: &Path) -> anyhow::Result<Destination> {
    let link = std::fs::read_link(path).ok();
    if names_a_descriptor(path) || link.as_deref().is_some_and(names_a_descriptor) {
        return Ok(Destination::InPlace);
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => bail!("cannot write {}: it is a directory", path.display()),
        Ok(m) if !m.is_file() => Ok(Destination::InPlace),
        _ => {
            // A regular file keeps its mode; a link (to a file or to nothing) is replaced.
            let keep = std::fs::symlink_metadata(path).ok().filter(|m| m.is_file()).map(|m| m.permissions());
            Ok(Destination::Replace { keep })
        }
    }
}

/// The directory a new file for `path` is made in: the target's own, so the rename stays on
/// one file system.
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Make the rename durable (best effort: not every file system can sync a directory).
fn sync_dir(path: &Path) {
    if let Ok(d) = File::open(dir_of(path)) {
        let _ = d.sync_all();
    }
}

/// Write `bytes` to `path`: whole or not at all (see the module documentation).
pub fn write_file(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    match destination(path)? {
        Destination::InPlace => {
            let mut f = OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            f.write_all(bytes).with_context(|| format!("cannot write {}", path.display()))?;
            f.flush().with_context(|| format!("cannot write {}", path.display()))?;
            Ok(())
        }
        Destination::Replace { keep } => {
            let mut tmp = temp_for(path, keep)?;
            let tmp_path = tmp.path().to_path_buf();
            let failed = |what: &str| format!("cannot {what} {} (written as {})", path.display(), tmp_path.display());
            tmp.write_all(bytes).with_context(|| failed("write"))?;
            tmp.flush().with_context(|| failed("write"))?;
            tmp.as_file().sync_all().with_context(|| failed("write"))?;
            // On failure `persist` hands the file back and dropping it removes it.
            tmp.persist(path)
                .map_err(|e| e.error)
                .with_context(|| format!("cannot rename {} to {}", tmp_path.display(), path.display()))?;
            sync_dir(path);
            Ok(())
        }
    }
}

/// A new temporary file beside `path` (`.NAME.XXXXXX.tmp`), removed when dropped.
fn temp_for(path: &Path, keep: Option<Permissions>) -> anyhow::Result<tempfile::NamedTempFile> {
    let dir = dir_of(path);
    let name = path.file_name().map_or_else(|| "output".into(), |n| n.to_string_lossy().into_owned());
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // As `File::create`: mode 0666, less the umask (applied when the file is made).
        builder.permissions(Permissions::from_mode(0o666));
    }
    let tmp = builder
        .tempfile_in(dir)
        .with_context(|| format!("cannot create {}: cannot create a file in {}", path.display(), dir.display()))?;
    if let Some(p) = keep {
        tmp.as_file().set_permissions(p).with_context(|| format!("cannot create {}", path.display()))?;
    }
    Ok(tmp)
}

/// `OUT.partial`: where `batch -o OUT` keeps its finished rows while it runs.
pub fn partial_path(target: &Path) -> PathBuf {
    let mut name = target.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    target.with_file_name(name)
}

/// Rename a finished `from` (in `to`'s directory) over `to`, keeping the permissions of a
/// regular file there.
pub fn replace_with(from: &Path, file: &File, to: &Path, keep: Option<Permissions>) -> anyhow::Result<()> {
    file.sync_all().with_context(|| format!("cannot write {}", from.display()))?;
    if let Some(p) = keep {
        file.set_permissions(p).with_context(|| format!("cannot set the permissions of {}", from.display()))?;
    }
    std::fs::rename(from, to).with_context(|| format!("cannot rename {} to {}", from.display(), to.display()))?;
    sync_dir(to);
    Ok(())
}

/// What an output holds, for how it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// HTML or SVG, which escape their own text: written as it is.
    Markup,
    /// Text (folded stacks): with the safety net of [`crate::emit::emit`] (C0 but `\n`, DEL and C1 controls
    /// escaped), whether it goes to stdout or to a file.
    Text,
}

/// Write `text` to `path`, whole or not at all ([`crate::output::write_file`]), or to stdout
/// for `-`.
pub fn write_output(path: &Path, text: &str, content: Content) -> anyhow::Result<()> {
    let text = match content {
        Content::Markup => std::borrow::Cow::Borrowed(text),
        Content::Text => memsnap_model::escape_controls(text),
    };
    if path.as_os_str() == "-" {
        return emit_raw(&text);
    }
    crate::output::write_file(path, text.as_bytes())
}
