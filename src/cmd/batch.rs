//! `memsnap batch PATH... [-o rows.jsonl|rows.csv] [--jobs N]`: one row per snapshot over files,
//! directories (walked recursively) and glob patterns, and a row with `error` for every file that
//! cannot be read, then on to the next.
//!
//! Files are analysed on a pool of `--jobs` threads. They are admitted in input order against a
//! budget of pickle bytes in flight, so an archive of multi-GB dumps never has more of them in
//! memory at once than fit. Rows are written in input order whatever the thread count or timing:
//! the output is byte-identical for every `--jobs`. With `-o OUT` the rows go to `OUT.partial`,
//! which replaces OUT at the end, and `--resume` continues an interrupted run from it to the same
//! bytes. See docs/batch.md.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, BufWriter, IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;

use anyhow::Context;
use memsnap_analysis::{Site, Suspect};
use memsnap_model::{escape_controls, json_safe, printable, shown};
use serde_json::{json, Value};

use crate::emit::shown_path;
use crate::input::{Compression, EXPANSION_ALLOWANCE, MAX_EXPANSION};
use crate::load::LoadError;
use crate::output::{self, Destination};
use crate::pipeline::analyze_file_capped;
use crate::pipeline::lacks;
use crate::pipeline::{device_figures, DeviceFigures};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON object per line.
    Jsonl,
    /// Comma-separated values with a header line (RFC 4180 quoting).
    Csv,
}

#[derive(clap::Args)]
pub struct Args {
    /// Snapshot files, directories (walked recursively) and glob patterns such as
    /// 'runs/**/*.pickle.gz'. In directories only *.pickle and *.pkl files (optionally .gz, .zst
    /// or .xz) are read; a file named explicitly or matched by a pattern is always read.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Where to write the rows; `.csv` writes CSV, anything else JSON Lines. Default: stdout.
    /// FILE is replaced only when the batch is done; meanwhile finished rows are kept in
    /// `FILE.partial`.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Continue an interrupted run with `-o FILE` (same arguments): keep the complete rows in
    /// `FILE.partial` and read only the inputs it has no row for. The result is the same bytes
    /// as an uninterrupted run.
    #[arg(long)]
    pub resume: bool,
    /// Row format, overriding the output file's extension.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Worker threads [default: the available cores].
    #[arg(short, long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Most pickle bytes (after decompression) being read at once, e.g. 8GiB [default: a third
    /// of the available memory]. A file larger than this is read alone. A compressed file is
    /// admitted at the size its header or index states (or 32 times its size when it states
    /// none) and held to it: one that turns out larger is stopped and read again alone.
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse)]
    pub max_inflight_bytes: Option<u64>,
    /// Suspects listed per row (the highest ranked).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub top: usize,
}

/// The reason a file could not be loaded, without the path (the row already says it).
pub fn load_error_text(e: &LoadError) -> String {
    match e {
        LoadError::Io { source, .. } => source.to_string(),
        LoadError::Read { source, .. } => source.to_string(),
        LoadError::OverCap { cap, .. } => format!("more than {cap} pickle bytes"),
    }
}

/// A site as one short string: `file.py:12 (function)`, or `-` without a user frame. The names
/// are [`shown`]: clipped, control and bidi characters escaped.
fn site_text(site: Option<&Site>) -> String {
    site.map_or_else(|| "-".to_string(), |s| format!("{}:{} ({})", shown(&s.filename), s.line, shown(&s.function)))
}

/// What one row says about a readable file.
struct Figures {
    pickle_bytes: u64,
    compression: &'static str,
    producer: &'static str,
    devices: Vec<DeviceFigures>,
    suspect_count: usize,
    top_suspects: Vec<Suspect>,
    caveats: Vec<String>,
}

struct Row {
    /// The path as given (or as found under a directory given).
    path: String,
    /// Size of the file as stored; `None` when it could not even be looked at.
    file_bytes: Option<u64>,
    result: Result<Figures, String>,
}

/// What a worker sends back: a row, or word that the input outgrew the size it was admitted at.
enum Outcome {
    Row(Row),
    OverCap,
}

fn analyze_row(path: &Path, shown: String, top: usize, cap: Option<u64>) -> Outcome {
    Outcome::Row(match analyze_file_capped(path, cap) {
        Ok(a) => {
            let suspects = a.analysis.suspects();
            let mut caveats = lacks(&a.loaded.snapshot);
            for da in &a.analysis.devices {
                caveats.extend(da.caveats.iter().map(|c| format!("device {}: {c}", da.device)));
            }
            let figures = Figures {
                pickle_bytes: a.loaded.pickle_bytes,
                compression: a.loaded.compression.name(),
                producer: a.loaded.snapshot.source.producer.name(),
                devices: device_figures(&a),
                suspect_count: suspects.len(),
                top_suspects: suspects.into_iter().take(top).cloned().collect(),
                caveats,
            };
            Row { path: shown, file_bytes: Some(a.loaded.file_bytes), result: Ok(figures) }
        }
        Err(LoadError::OverCap { .. }) => return Outcome::OverCap,
        Err(e) => {
            let file_bytes = if path.as_os_str() == "-" { None } else { std::fs::metadata(path).ok().map(|m| m.len()) };
            Row { path: shown, file_bytes, result: Err(load_error_text(&e)) }
        }
    })
}

impl Figures {
    fn allocated(&self) -> u64 {
        self.devices.iter().map(|d| d.allocated_bytes).sum()
    }
    fn reserved(&self) -> u64 {
        self.devices.iter().map(|d| d.reserved_bytes).sum()
    }
    /// The device with the largest peak of allocated bytes (the first such on a tie).
    fn peak_device(&self) -> Option<&DeviceFigures> {
        self.devices.iter().rev().max_by_key(|d| d.peak_allocated_bytes)
    }
    fn peak_reserved(&self) -> u64 {
        self.devices.iter().map(|d| d.peak_reserved_bytes).max().unwrap_or(0)
    }
}

const CSV_COLUMNS: [&str; 16] = [
    "path",
    "file_bytes",
    "pickle_bytes",
    "compression",
    "producer",
    "devices",
    "allocated_bytes",
    "reserved_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "peak_device",
    "suspect_count",
    "top_suspect_kinds",
    "top_suspect_sites",
    "caveats",
    "error",
];

fn row_json(row: &Row) -> Value {
    let mut v = json!({
        "schema_version": 1,
        "path": row.path,
        "file_bytes": row.file_bytes,
        "pickle_bytes": null,
        "compression": null,
        "producer": null,
        "devices": null,
        "allocated_bytes": null,
        "reserved_bytes": null,
        "peak_allocated_bytes": null,
        "peak_reserved_bytes": null,
        "peak_device": null,
        "per_device": null,
        "suspect_count": null,
        "top_suspects": null,
        "caveats": null,
        "error": null,
    });
    match &row.result {
        Err(e) => v["error"] = json!(e),
        Ok(f) => {
            v["pickle_bytes"] = json!(f.pickle_bytes);
            v["compression"] = json!(f.compression);
            v["producer"] = json!(f.producer);
            v["devices"] = json!(f.devices.iter().map(|d| d.device).collect::<Vec<_>>());
            v["allocated_bytes"] = json!(f.allocated());
            v["reserved_bytes"] = json!(f.reserved());
            let known = f.devices.iter().all(|d| d.peak_known);
            v["peak_allocated_bytes"] = json!(known.then(|| f.peak_device().map_or(0, |d| d.peak_allocated_bytes)));
            v["peak_reserved_bytes"] = json!(known.then(|| f.peak_reserved()));
            v["peak_device"] = json!(f.peak_device().map(|d| d.device));
            v["per_device"] = json!(f
                .devices
                .iter()
                .map(|d| json!({
                    "device": d.device,
                    "allocated_bytes": d.allocated_bytes,
                    "reserved_bytes": d.reserved_bytes,
                    "peak_allocated_bytes": d.peak_known.then_some(d.peak_allocated_bytes),
                    "peak_reserved_bytes": d.peak_known.then_some(d.peak_reserved_bytes),
                }))
                .collect::<Vec<_>>());
            v["suspect_count"] = json!(f.suspect_count);
            v["top_suspects"] = json!(f
                .top_suspects
                .iter()
                .map(|s| json!({
                    "kind": s.kind.name(),
                    "device": s.device,
                    "bytes": s.bytes,
                    "confidence": (s.confidence * 100.0).round() / 100.0,
                    "site": s.site.as_ref().map(|x| json!({"filename": x.filename, "line": x.line, "function": x.function})),
                }))
                .collect::<Vec<_>>());
            v["caveats"] = json!(f.caveats);
        }
    }
    v
}

/// A cell of untrusted text (a path, sites, caveats, an error message): control and bidi
/// characters as visible escapes, and a cell a spreadsheet would read as a formula (starting
/// with `=`, `+`, `-`, `@`, tab or CR) prefixed with `'`, as OWASP advises. memsnap's own
/// placeholder `-` (no user frame) stays as it is. Numeric cells are memsnap's and never go
/// through here.
fn text_cell(s: &str) -> String {
    let s = printable(s);
    if s != "-" && s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.into_owned()
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn row_csv(row: &Row) -> String {
    let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
    let cells: Vec<String> = match &row.result {
        Err(e) => {
            let mut c = vec![text_cell(&row.path), opt(row.file_bytes)];
            c.resize(CSV_COLUMNS.len() - 1, String::new());
            c.push(text_cell(e));
            c
        }
        Ok(f) => vec![
            text_cell(&row.path),
            opt(row.file_bytes),
            f.pickle_bytes.to_string(),
            f.compression.to_string(),
            f.producer.to_string(),
            f.devices.iter().map(|d| d.device.to_string()).collect::<Vec<_>>().join(";"),
            f.allocated().to_string(),
            f.reserved().to_string(),
            f.peak_device().map_or(0, |d| d.peak_allocated_bytes).to_string(),
            f.peak_reserved().to_string(),
            f.peak_device().map_or(String::new(), |d| d.device.to_string()),
            f.suspect_count.to_string(),
            f.top_suspects.iter().map(|s| s.kind.name()).collect::<Vec<_>>().join(";"),
            text_cell(&f.top_suspects.iter().map(|s| site_text(s.site.as_ref())).collect::<Vec<_>>().join(";")),
            text_cell(&f.caveats.join(" | ")),
            String::new(),
        ],
    };
    let mut line = cells.iter().map(|c| csv_field(c)).collect::<Vec<_>>().join(",");
    line.push('\n');
    line
}

/// One input the rows are about, in output order.
enum Input {
    File {
        shown: String,
        path: PathBuf,
    },
    /// An argument (or a directory under one) that failed before any file could be read.
    Error {
        shown: String,
        message: String,
    },
}

#[derive(Default)]
struct Discovery {
    inputs: Vec<Input>,
    /// Files in walked directories whose names do not look like snapshots.
    skipped: usize,
    /// Canonical paths of the files already listed: a file reached twice gets one row.
    seen: HashSet<PathBuf>,
    /// Canonical paths of the directories walked, against symlink loops.
    walked: HashSet<PathBuf>,
}

/// `*.pickle` or `*.pkl`, optionally compressed (`.gz`, `.gzip`, `.zst`, `.zstd`, `.xz`);
/// case-insensitive.
pub fn is_snapshot_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    let base =
        [".gz", ".gzip", ".zst", ".zstd", ".xz"].iter().find_map(|ext| lower.strip_suffix(ext)).unwrap_or(&lower);
    base.ends_with(".pickle") || base.ends_with(".pkl")
}

fn is_pattern(p: &Path) -> bool {
    p.to_str().is_some_and(|s| s.contains(['*', '?', '[']))
}

impl Discovery {
    fn add_file(&mut self, path: PathBuf) {
        if path.as_os_str() != "-" {
            let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            if !self.seen.insert(key) {
                return;
            }
        }
        self.inputs.push(Input::File { shown: path.display().to_string(), path });
    }

    fn add_error(&mut self, path: &Path, message: String) {
        self.inputs.push(Input::Error { shown: path.display().to_string(), message });
    }

    /// Add an existing path: a directory is walked, anything else is read as a snapshot.
    /// `explicit` is a path named on the command line, which is read whatever it is (a FIFO
    /// blocks until written, like `cat`); a path found in a directory or by a pattern is read
    /// only when it is a regular file, so a FIFO or a device there cannot hang the batch.
    fn add_path(&mut self, path: PathBuf, explicit: bool) {
        let meta = std::fs::metadata(&path);
        if !explicit && meta.as_ref().is_ok_and(|m| !m.is_dir() && !m.is_file()) {
            return self.skip_special(&path);
        }
        if meta.is_ok_and(|m| m.is_dir()) {
            let before = self.inputs.len();
            self.walk(&path);
            if self.inputs.len() == before {
                eprintln!(
                    "memsnap: warning: {}: no snapshot files (*.pickle, *.pkl, optionally .gz/.zst/.xz) in this directory",
                    shown_path(&path)
                );
            }
        } else {
            self.add_file(path);
        }
    }

    fn walk(&mut self, dir: &Path) {
        let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        if !self.walked.insert(key) {
            return;
        }
        let mut entries: Vec<std::ffi::OsString> =
            match std::fs::read_dir(dir).and_then(|r| r.map(|e| e.map(|e| e.file_name())).collect()) {
                Ok(v) => v,
                Err(e) => return self.add_error(dir, format!("cannot read directory: {e}")),
            };
        entries.sort();
        for name in entries {
            let text = name.to_string_lossy();
            // Hidden files and directories (.git, editor swap files) are never snapshots.
            if text.starts_with('.') {
                continue;
            }
            let path = dir.join(&name);
            let meta = std::fs::metadata(&path);
            if meta.as_ref().is_ok_and(|m| m.is_dir()) {
                self.walk(&path);
            } else if !is_snapshot_name(&text) {
                self.skipped += 1;
            } else if meta.is_ok_and(|m| !m.is_file()) {
                self.skip_special(&path);
            } else {
                self.add_file(path);
            }
        }
    }

    /// A FIFO, socket or device found under a directory or by a pattern: not read.
    fn skip_special(&mut self, path: &Path) {
        eprintln!("memsnap: warning: {}: not a regular file (a FIFO, socket or device): skipped", shown_path(path));
        self.skipped += 1;
    }

    fn add_arg(&mut self, arg: &Path) {
        if arg.as_os_str() == "-" || arg.exists() {
            return self.add_path(arg.to_path_buf(), true);
        }
        if !is_pattern(arg) {
            let e = std::fs::metadata(arg).err().map_or_else(|| "not found".to_string(), |e| e.to_string());
            return self.add_error(arg, e);
        }
        let pattern = arg.to_string_lossy();
        let opts = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: true,
        };
        let paths = match glob::glob_with(&pattern, opts) {
            Ok(p) => p,
            Err(e) => return self.add_error(arg, format!("invalid glob pattern: {e}")),
        };
        let mut matched = false;
        for entry in paths {
            matched = true;
            match entry {
                Ok(p) => self.add_path(p, false),
                Err(e) => {
                    let path = e.path().to_path_buf();
                    self.add_error(&path, format!("cannot read directory: {}", e.error()));
                }
            }
        }
        if !matched {
            self.add_error(arg, "no file matches this pattern".into());
        }
    }
}

/// Pickle bytes a file is admitted at, and whether that is only an estimate (which the reader
/// then holds the file to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Estimate {
    pickle_bytes: u64,
    exact: bool,
}

/// A plain regular file's size is exact. For a compressed file, the size it decompresses to as
/// its own header or index says (gzip ISIZE, zstd frame content size, xz index) — a claim the
/// file could get wrong — else 32 times its size (real snapshots compress about 25 times).
/// Never above what the reader would accept from it. Anything else (stdin, a pipe) is
/// admitted at the whole budget: it is read alone.
fn estimate_pickle_bytes(path: &Path) -> Option<Estimate> {
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
fn default_budget() -> u64 {
    (available_memory().unwrap_or(12 << 30) / 3).max(256 << 20)
}

/// One row as the line written: JSON with the characters that could drive a terminal as `\u`
/// escapes (the values unchanged), or CSV with the safety net of text output.
fn row_line(row: &Row, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Jsonl => json_safe(&serde_json::to_string(&row_json(row))?).into_owned() + "\n",
        Format::Csv => escape_controls(&row_csv(row)).into_owned(),
    })
}

fn csv_header() -> String {
    CSV_COLUMNS.join(",") + "\n"
}

/// Where the rows go.
enum Sink {
    Stdout(BufWriter<io::Stdout>),
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
}

impl Sink {
    fn write(&mut self, line: &str) -> anyhow::Result<()> {
        match self {
            Sink::Stdout(w) => w.write_all(line.as_bytes()).context("cannot write to stdout"),
            Sink::InPlace { file, path } | Sink::Partial { file, partial: path, .. } => {
                file.write_all(line.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
            }
        }
    }

    fn finish(self) -> anyhow::Result<()> {
        match self {
            Sink::Stdout(mut w) => w.flush().context("cannot write to stdout"),
            Sink::InPlace { mut file, path } => {
                file.flush().with_context(|| format!("cannot write {}", path.display()))
            }
            Sink::Partial { file, partial, target, keep } => output::replace_with(&partial, &file, &target, keep),
        }
    }
}

/// What `--resume` found in `OUT.partial`.
#[derive(Default)]
struct Resumed {
    /// The rows of inputs `0..prefix` are in the file already, in order; `prefix_errors` of
    /// them are error rows.
    prefix: usize,
    prefix_errors: usize,
    /// Rows of later inputs (by [`input_key`]), reused as they are: (line, is an error row).
    later: HashMap<String, (String, bool)>,
    /// Complete rows found in the file.
    found: usize,
}

/// What identifies an input's row: its `path` as the row writes it.
fn input_key(shown: &str, format: Format) -> String {
    match format {
        Format::Jsonl => shown.to_string(),
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
        Format::Jsonl => {
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

/// The row writer, its format, a name for the summary line, whether it is stdout, and what
/// `--resume` found. `keys` are the inputs' [`input_key`]s, in order.
fn open_output(
    args: &Args,
    keys_of: impl Fn(Format) -> Vec<String>,
) -> anyhow::Result<(Sink, Format, String, bool, Resumed)> {
    let Some(p) = args.output.as_ref().filter(|p| p.as_os_str() != "-") else {
        anyhow::ensure!(!args.resume, "--resume needs -o FILE: rows written to stdout cannot be resumed");
        let mut sink = Sink::Stdout(BufWriter::new(io::stdout()));
        let format = args.format.unwrap_or(Format::Jsonl);
        if format == Format::Csv {
            sink.write(&csv_header())?;
        }
        return Ok((sink, format, "stdout".into(), true, Resumed::default()));
    };
    let ext_csv = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    let format = args.format.unwrap_or(if ext_csv { Format::Csv } else { Format::Jsonl });
    let name = shown_path(p);
    let (mut sink, has_header, resumed) = match output::destination(p)? {
        Destination::InPlace => {
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
                eprintln!("memsnap batch: no {} to resume: reading every input", shown_path(&partial));
            }
            let (file, has_header, resumed) = match reopened {
                Some(r) => r,
                None => {
                    let file =
                        File::create(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
                    (file, false, Resumed::default())
                }
            };
            (Sink::Partial { file, partial, target: p.clone(), keep }, has_header, resumed)
        }
    };
    if format == Format::Csv && !has_header {
        sink.write(&csv_header())?;
    }
    Ok((sink, format, name, false, resumed))
}

/// How often the progress bar is brought up to date while files are being read.
const PROGRESS_TICK: std::time::Duration = std::time::Duration::from_millis(200);

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    crate::progress::per_file_off();
    let jobs = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    anyhow::ensure!(jobs >= 1, "--jobs must be at least 1");
    let budget = args.max_inflight_bytes.unwrap_or_else(default_budget);

    let mut disc = Discovery::default();
    for arg in &args.paths {
        disc.add_arg(arg);
    }
    let (mut out, format, out_name, to_stdout, mut resumed) = open_output(args, |format| {
        disc.inputs
            .iter()
            .map(|i| match i {
                Input::File { shown, .. } | Input::Error { shown, .. } => input_key(shown, format),
            })
            .collect()
    })?;
    // Inputs whose rows an interrupted run already wrote are not read again: the first
    // `resumed.prefix` are in the file, later ones are written again from `reused`.
    let mut reused: BTreeMap<usize, (String, bool)> = BTreeMap::new();
    let mut inputs: Vec<Input> = Vec::new();
    for (i, input) in std::mem::take(&mut disc.inputs).into_iter().enumerate() {
        if i < resumed.prefix {
            continue;
        }
        let shown = match &input {
            Input::File { shown, .. } | Input::Error { shown, .. } => shown,
        };
        match resumed.later.remove(&input_key(shown, format)) {
            Some(line) => {
                reused.insert(i, line);
            }
            None => inputs.push(input),
        }
    }
    let kept = resumed.prefix + reused.len();

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        // Reading happens on these threads rather than the main one: give them its usual stack.
        .stack_size(8 << 20)
        .thread_name(|i| format!("memsnap-batch-{i}"))
        .build()?;
    // On a terminal only, and not when the rows themselves go to the same terminal.
    let rows_on_terminal = to_stdout && io::stdout().is_terminal();
    // The bar runs over stored bytes (what takes the time); the message counts files.
    let total_bytes: u64 = inputs
        .iter()
        .filter_map(|i| match i {
            Input::File { path, .. } => std::fs::metadata(path).ok().filter(|m| m.is_file()).map(|m| m.len()),
            Input::Error { .. } => None,
        })
        .sum();
    let (mut files_done, files_total) = (0usize, inputs.len());
    let files_message = |done: usize, last: &str| format!("{done}/{files_total} files {last}");
    let progress = if crate::progress::shown() && !rows_on_terminal {
        let pb = indicatif::ProgressBar::with_draw_target(Some(total_bytes), indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}) {wide_msg}",
        ) {
            pb.set_style(style.progress_chars("=> "));
        }
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };

    // Admission runs on this thread, outside the pool, and workers never wait: a worker blocked
    // on the budget could otherwise be handed another file's task by rayon's work stealing while
    // it holds the budget itself, and deadlock.
    let (tx, rx) = mpsc::channel::<(usize, Outcome, u64)>();
    let (mut next, mut running, mut in_flight) = (0usize, 0usize, 0u64);
    let mut next_cost: Option<Option<Estimate>> = None;
    // Inputs that outgrew their estimate, to be read again alone and without a cap.
    let mut again: Vec<usize> = Vec::new();
    let spawn = |index: usize, path: PathBuf, shown: String, cap: Option<u64>, cost: u64| {
        let (tx, top) = (tx.clone(), args.top);
        pool.spawn(move || {
            let outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| analyze_row(&path, shown.clone(), top, cap)))
                    .unwrap_or_else(|panic| {
                        let what = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        Outcome::Row(Row {
                            path: shown,
                            file_bytes: None,
                            result: Err(format!("internal error (a bug in memsnap): {what}")),
                        })
                    });
            let _ = tx.send((index, outcome, cost));
        });
    };
    // Rows by their index in `inputs`; `written` counts rows over all inputs (resumed ones too).
    let mut done: BTreeMap<usize, Row> = BTreeMap::new();
    let (mut written, mut written_read, mut errors) = (resumed.prefix, 0usize, resumed.prefix_errors);
    loop {
        if running == 0 {
            if let Some(index) = again.pop() {
                if let Input::File { shown, path } = &inputs[index] {
                    running += 1;
                    in_flight = budget;
                    spawn(index, path.clone(), shown.clone(), None, budget);
                }
            }
        }
        while next < inputs.len() && again.is_empty() {
            match &inputs[next] {
                Input::Error { shown, message } => {
                    done.insert(next, Row { path: shown.clone(), file_bytes: None, result: Err(message.clone()) });
                    files_done += 1;
                    progress.set_message(files_message(files_done, ""));
                }
                Input::File { shown, path } => {
                    let estimate = *next_cost.get_or_insert_with(|| estimate_pickle_bytes(path));
                    // Unknown sizes (stdin, pipes) take the whole budget: they are read alone.
                    let cost = estimate.map_or(budget, |e| e.pickle_bytes);
                    if running > 0 && (running >= jobs || in_flight.saturating_add(cost) > budget) {
                        break;
                    }
                    next_cost = None;
                    running += 1;
                    in_flight = in_flight.saturating_add(cost);
                    let cap = estimate.filter(|e| !e.exact).map(|e| e.pickle_bytes);
                    spawn(next, path.clone(), shown.clone(), cap, cost);
                }
            }
            next += 1;
        }
        // Write every row whose predecessors are all written: a row kept from the partial
        // file, or the next row read.
        loop {
            if let Some((line, is_error)) = reused.remove(&written) {
                errors += usize::from(is_error);
                out.write(&line)?;
                written += 1;
                continue;
            }
            let Some(row) = done.remove(&written_read) else { break };
            errors += usize::from(row.result.is_err());
            out.write(&row_line(&row, format)?)?;
            written += 1;
            written_read += 1;
        }
        if running == 0 {
            break;
        }
        // Wake now and then to move the bar while big files are read.
        let (index, outcome, cost) = match rx.recv_timeout(PROGRESS_TICK) {
            Ok(received) => received,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                progress.set_position(crate::progress::bytes_read());
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => anyhow::bail!("a batch worker stopped"),
        };
        progress.set_position(crate::progress::bytes_read());
        running -= 1;
        in_flight -= cost;
        let row = match outcome {
            Outcome::Row(row) => row,
            Outcome::OverCap => {
                // Read again from the start: its bytes count twice.
                if let Input::File { path, .. } = &inputs[index] {
                    progress.inc_length(std::fs::metadata(path).map_or(0, |m| m.len()));
                }
                again.push(index);
                continue;
            }
        };
        files_done += 1;
        progress.set_message(files_message(files_done, &printable(&row.path)));
        done.insert(index, row);
    }
    progress.finish_and_clear();
    out.finish()?;

    let skipped = if disc.skipped > 0 {
        format!("; {} other files skipped (not named like a snapshot, or not a regular file)", disc.skipped)
    } else {
        String::new()
    };
    // `--resume` has an output file (open_output made sure).
    let kept = match args.output.as_deref().filter(|_| args.resume) {
        Some(p) => format!(
            "; {kept} of them kept from {} ({} complete rows found)",
            shown_path(&output::partial_path(p)),
            resumed.found
        ),
        None => String::new(),
    };
    eprintln!("memsnap batch: {written} rows ({errors} unreadable) written to {out_name}{kept}{skipped}");
    Ok(if errors > 0 { ExitCode::from(2) } else { ExitCode::SUCCESS })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names() {
        for yes in
            ["a.pickle", "a.PKL", "a.pickle.gz", "a.pkl.zst", "a.pickle.xz", "a.pickle.zstd", "snap.rank1.pickle"]
        {
            assert!(is_snapshot_name(yes), "{yes}");
        }
        for no in ["a.json", "a.truth.json", "a.txt", "README.md", "a.pt", "a.pickle.json", "pickle", "a.gz"] {
            assert!(!is_snapshot_name(no), "{no}");
        }
    }

    #[test]
    fn csv_text_cells_are_escaped_and_cannot_be_formulas() {
        for (cell, want) in [
            ("=1+2", "'=1+2"),
            ("+cmd", "'+cmd"),
            ("-2+3", "'-2+3"),
            ("@SUM(A1)", "'@SUM(A1)"),
            // Escaped first: a tab or CR is no longer the first character, but a backslash.
            ("\tx", "\\tx"),
            ("-", "-"),
            ("-;train.py:3 (f)", "'-;train.py:3 (f)"),
            ("train.py:3 (f)", "train.py:3 (f)"),
            ("a\x1b[2J\nb", "a\\x1b[2J\\nb"),
        ] {
            assert_eq!(text_cell(cell), want, "{cell:?}");
        }
    }

    #[test]
    fn csv_quoting() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

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
