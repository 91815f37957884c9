//! The output and resuming: the [`Sink`] the rows are written to (stdout, a device in place, or
//! `OUT.partial` renamed over `OUT` at the end, or converted to Parquet as `OUT`), and what
//! `--resume` keeps of an interrupted run's `OUT.partial`.

use std::collections::HashMap;
use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

use super::rows::{csv_field, csv_header, text_cell};
use super::{Args, Format};
use crate::emit::shown_path;
use crate::output::{self, Destination};

/// Where the rows go.
pub(super) enum Sink {
    Stdout(BufWriter<crate::emit::Stdout>),
    /// A device or descriptor name (`/dev/stdout`), written in place.
    InPlace {
        file: File,
        path: PathBuf,
    },
    /// `OUT.partial`: whole rows, one write each, renamed over `OUT` at the end.
    Partial {
        file: File,
        partial: PathBuf,
        target: PathBuf,
        keep: Option<Permissions>,
    },
    /// `OUT.partial` as for [`Sink::Partial`], in JSON Lines, converted at the end into the
    /// Parquet file `OUT` (see [`super::parquet`]).
    ParquetPartial {
        file: File,
        partial: PathBuf,
        target: PathBuf,
    },
}

impl Sink {
    pub(super) fn write(&mut self, line: &str) -> anyhow::Result<()> {
        match self {
            Sink::Stdout(w) => w.write_all(line.as_bytes()).context("cannot write to stdout"),
            Sink::InPlace { file, path }
            | Sink::Partial { file, partial: path, .. }
            | Sink::ParquetPartial { file, partial: path, .. } => {
                file.write_all(line.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
            }
        }
    }

    pub(super) fn finish(self) -> anyhow::Result<()> {
        match self {
            Sink::Stdout(mut w) => w.flush().context("cannot write to stdout"),
            Sink::InPlace { mut file, path } => {
                file.flush().with_context(|| format!("cannot write {}", path.display()))
            }
            Sink::Partial { file, partial, target, keep } => output::replace_with(&partial, &file, &target, keep),
            Sink::ParquetPartial { file, partial, target } => {
                drop(file);
                super::parquet::convert(&partial, &target)
            }
        }
    }
}

/// What `--resume` found in `OUT.partial`.
#[derive(Default)]
pub(super) struct Resumed {
    /// The rows of inputs `0..prefix` are in the file already, in order; `prefix_errors` of
    /// them are error rows.
    pub(super) prefix: usize,
    pub(super) prefix_errors: usize,
    /// Rows of later inputs (by [`input_key`]), reused as they are: (line, is an error row).
    pub(super) later: HashMap<String, (String, bool)>,
    /// Complete rows found in the file.
    pub(super) found: usize,
}

/// What identifies an input's row: its `path` as the row writes it.
pub(super) fn input_key(shown: &str, format: Format) -> String {
    match format {
        // A Parquet output's rows are kept as JSON Lines until the batch is done.
        Format::Jsonl | Format::Parquet => shown.to_string(),
        Format::Csv => csv_field(&text_cell(shown)),
    }
}

/// The first cell of a CSV line as written (quotes included).
fn first_csv_cell(line: &str) -> Option<&str> {
    let Some(rest) = line.strip_prefix('"') else {
        return line.find(',').map(|i| &line[..i]);
    };
    let b = rest.as_bytes();
    let mut i = 0;
    loop {
        match b.get(i)? {
            b'"' if b.get(i + 1) == Some(&b'"') => i += 2,
            b'"' => return Some(&line[..i + 2]),
            _ => i += 1,
        }
    }
}

/// The key of a written row and whether it is an error row; `None` when the line is not one.
fn row_key(line: &str, format: Format) -> Option<(String, bool)> {
    match format {
        Format::Jsonl | Format::Parquet => {
            let v: Value = serde_json::from_str(line).ok()?;
            Some((v.get("path")?.as_str()?.to_string(), !v.get("error")?.is_null()))
        }
        // An error row ends with its message; every other row with an empty `error` cell.
        Format::Csv => Some((first_csv_cell(line)?.to_string(), !line.ends_with(",\n"))),
    }
}

/// Open `partial` to continue it: keep its complete rows (a torn last line is dropped), find
/// which inputs they are the rows of, and cut the file after the ones that come first in input
/// order (later rows are kept in memory and written again in their place). Returns the file,
/// positioned at its end, whether it holds the CSV header, and what was found. `None`: there
/// is no such file.
fn reopen_partial(partial: &Path, format: Format, keys: &[String]) -> anyhow::Result<Option<(File, bool, Resumed)>> {
    let bytes = match std::fs::read(partial) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", partial.display())),
    };
    let mut lines = bytes.split_inclusive(|&b| b == b'\n').filter(|l| l.ends_with(b"\n"));
    let mut kept_bytes = 0usize;
    let mut has_header = false;
    let not_rows =
        |what: &str| anyhow::anyhow!("--resume: {} {what}; remove it or run without --resume", partial.display());
    if format == Format::Csv {
        if let Some(h) = lines.next() {
            if h != csv_header().as_bytes() {
                return Err(not_rows("does not start with the CSV header of batch rows"));
            }
            kept_bytes += h.len();
            has_header = true;
        }
    }
    let mut rows: Vec<(String, &str, bool)> = Vec::new();
    for l in lines {
        // A line that is not a row (a torn write, or something else) ends what is kept.
        let Some((key, is_error, text)) =
            std::str::from_utf8(l).ok().and_then(|t| row_key(t, format).map(|(k, e)| (k, e, t)))
        else {
            if rows.is_empty() && format == Format::Jsonl {
                return Err(not_rows("does not hold JSON Lines rows of a batch"));
            }
            break;
        };
        rows.push((key, text, is_error));
    }
    let prefix = rows.iter().zip(keys).take_while(|((k, _, _), key)| k == *key).count();
    kept_bytes += rows[..prefix].iter().map(|r| r.1.len()).sum::<usize>();
    let mut resumed = Resumed {
        prefix,
        prefix_errors: rows[..prefix].iter().filter(|r| r.2).count(),
        later: HashMap::new(),
        found: rows.len(),
    };
    for (key, text, is_error) in rows.into_iter().skip(prefix) {
        resumed.later.entry(key).or_insert_with(|| (text.to_string(), is_error));
    }
    let file =
        OpenOptions::new().append(true).open(partial).with_context(|| format!("cannot open {}", partial.display()))?;
    file.set_len(kept_bytes as u64).with_context(|| format!("cannot write {}", partial.display()))?;
    Ok(Some((file, has_header, resumed)))
}

/// Why a Parquet output must be a file: it is written whole at the end, not streamed.
const PARQUET_NEEDS_A_FILE: &str =
    "Parquet needs -o FILE: a columnar file is written whole when the batch is done, not streamed";

/// The format `-o PATH` asks for by its extension: `.csv` CSV, `.parquet` Parquet, anything
/// else JSON Lines.
fn format_of(p: &Path) -> Format {
    match p.extension() {
        Some(e) if e.eq_ignore_ascii_case("csv") => Format::Csv,
        Some(e) if e.eq_ignore_ascii_case("parquet") => Format::Parquet,
        _ => Format::Jsonl,
    }
}

/// The row writer, the format the rows are written in (JSON Lines for a Parquet output, which is
/// converted at the end), a name for the summary line, whether it is stdout, and what `--resume`
/// found. `keys` are the inputs' [`input_key`]s, in order.
pub(super) fn open_output(
    args: &Args,
    keys_of: impl Fn(Format) -> Vec<String>,
) -> anyhow::Result<(Sink, Format, String, bool, Resumed)> {
    let Some(p) = args.output.as_ref().filter(|p| p.as_os_str() != "-") else {
        anyhow::ensure!(args.format != Some(Format::Parquet), "{PARQUET_NEEDS_A_FILE} to stdout");
        anyhow::ensure!(!args.resume, "--resume needs -o FILE: rows written to stdout cannot be resumed");
        let mut sink = Sink::Stdout(BufWriter::new(crate::emit::Stdout));
        let format = args.format.unwrap_or(Format::Jsonl);
        if format == Format::Csv {
            sink.write(&csv_header())?;
        }
        return Ok((sink, format, "stdout".into(), true, Resumed::default()));
    };
    let requested = args.format.unwrap_or_else(|| format_of(p));
    let format = if requested == Format::Parquet { Format::Jsonl } else { requested };
    let name = shown_path(p);
    let (mut sink, has_header, resumed) = match output::destination(p)? {
        Destination::InPlace => {
            anyhow::ensure!(
                requested != Format::Parquet,
                "{PARQUET_NEEDS_A_FILE}: {} is a device or descriptor",
                p.display()
            );
            anyhow::ensure!(
                !args.resume,
                "--resume: {} is a device or descriptor, not a file: there is nothing to resume",
                p.display()
            );
            let file = OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(p)
                .with_context(|| format!("cannot open {}", p.display()))?;
            (Sink::InPlace { file, path: p.clone() }, false, Resumed::default())
        }
        Destination::Replace { keep } => {
            let partial = output::partial_path(p);
            let reopened = if args.resume { reopen_partial(&partial, format, &keys_of(format))? } else { None };
            if args.resume && reopened.is_none() {
                crate::emit::stderr_line(&format!(
                    "memsnap batch: no {} to resume: reading every input",
                    shown_path(&partial)
                ));
            }
            let (file, has_header, resumed) = match reopened {
                Some(r) => r,
                None => {
                    let file =
                        File::create(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
                    (file, false, Resumed::default())
                }
            };
            let target = p.clone();
            let sink = match requested {
                // The target's permissions are kept by `output::write_file`, which writes it.
                Format::Parquet => Sink::ParquetPartial { file, partial, target },
                Format::Jsonl | Format::Csv => Sink::Partial { file, partial, target, keep },
            };
            (sink, has_header, resumed)
        }
    };
    if format == Format::Csv && !has_header {
        sink.write(&csv_header())?;
    }
    Ok((sink, format, name, false, resumed))
}
