//! Rows: analysing one file into the figures of its row ([`analyze_row`]), and writing a row as
//! a JSON Lines object or a CSV line, with the CSV columns, quoting and the escaping of untrusted
//! text cells.

use std::path::Path;

use memsnap_analysis::{Site, Suspect};
use memsnap_model::{escape_controls, json_safe, printable, shown};
use serde_json::{json, Value};

use super::Format;
use crate::load::LoadError;
use crate::pipeline::analyze_file_capped;
use crate::pipeline::lacks;
use crate::pipeline::{device_figures, DeviceFigures};

/// The reason a file could not be loaded, without the path (the row already says it).
pub(super) fn load_error_text(e: &LoadError) -> String {
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
pub(super) struct Figures {
    pickle_bytes: u64,
    compression: &'static str,
    producer: &'static str,
    devices: Vec<DeviceFigures>,
    suspect_count: usize,
    top_suspects: Vec<Suspect>,
    caveats: Vec<String>,
}

pub(super) struct Row {
    /// The path as given (or as found under a directory given).
    pub(super) path: String,
    /// Size of the file as stored; `None` when it could not even be looked at.
    pub(super) file_bytes: Option<u64>,
    pub(super) result: Result<Figures, String>,
}

/// What a worker sends back: a row, or word that the input outgrew the size it was admitted at.
pub(super) enum Outcome {
    Row(Row),
    OverCap,
}

pub(super) fn analyze_row(path: &Path, shown: String, top: usize, cap: Option<u64>) -> Outcome {
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
pub(super) fn text_cell(s: &str) -> String {
    let s = printable(s);
    if s != "-" && s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.into_owned()
    }
}

pub(super) fn csv_field(s: &str) -> String {
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
/// One row as the line written: JSON with the characters that could drive a terminal as `\u`
/// escapes (the values unchanged), or CSV with the safety net of text output.
pub(super) fn row_line(row: &Row, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Jsonl => json_safe(&serde_json::to_string(&row_json(row))?).into_owned() + "\n",
        Format::Csv => escape_controls(&row_csv(row)).into_owned(),
    })
}

pub(super) fn csv_header() -> String {
    CSV_COLUMNS.join(",") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
