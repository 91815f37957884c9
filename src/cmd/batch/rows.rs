//! Rows: analysing one file into the figures of its row ([`analyze_row`]), and writing a row as
//! a JSON Lines object or a CSV line, with the CSV columns, quoting and the escaping of untrusted
//! text cells; and [`row_schema`], the JSON row's columns as Arrow types (for Parquet).

use std::path::Path;

use arrow_schema::{DataType, Field, Fields, Schema};
use memsnap_analysis::{Site, Suspect};
use memsnap_model::{escape_controls, json_safe, printable, shown};
use serde_json::{json, Value};

use super::Format;
use crate::load::LoadError;
use crate::pipeline::analyze_file_capped;
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
#[derive(Clone)]
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
            let mut caveats = a.file_caveats.clone();
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

const CSV_COLUMNS: [&str; 17] = [
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
    "top_suspect_severities",
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
                    "severity": s.severity.name(),
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

/// The columns of [`row_json`] as Arrow types, in the JSON row's (alphabetical) key order: what a
/// Parquet output holds, decoded from the JSON Lines rows. Nullable wherever the JSON can be
/// `null` (every figure of an error row, a peak without a trace, a suspect without a user frame).
/// Byte counts are `UInt64`, as memsnap counts them: a sum over a file's blocks can saturate at
/// 2^64 - 1 (fixtures/hostile/ok_sizes_sum_past_2p64), which `Int64` cannot hold. Indices and
/// counts (devices, lines, `suspect_count`, `schema_version`) are `Int64`.
pub(super) fn row_schema() -> Schema {
    let field = |name: &str, data_type: DataType, nullable: bool| Field::new(name, data_type, nullable);
    let list_of = |item: DataType| DataType::List(Field::new_list_field(item, false).into());
    let bytes = |name: &str, nullable: bool| field(name, DataType::UInt64, nullable);
    let per_device = Fields::from(vec![
        bytes("allocated_bytes", false),
        field("device", DataType::Int64, false),
        bytes("peak_allocated_bytes", true),
        bytes("peak_reserved_bytes", true),
        bytes("reserved_bytes", false),
    ]);
    let site = Fields::from(vec![
        field("filename", DataType::Utf8, false),
        field("function", DataType::Utf8, false),
        field("line", DataType::Int64, false),
    ]);
    let suspect = Fields::from(vec![
        bytes("bytes", false),
        field("confidence", DataType::Float64, false),
        field("device", DataType::Int64, false),
        field("kind", DataType::Utf8, false),
        field("severity", DataType::Utf8, false),
        field("site", DataType::Struct(site), true),
    ]);
    Schema::new(vec![
        bytes("allocated_bytes", true),
        field("caveats", list_of(DataType::Utf8), true),
        field("compression", DataType::Utf8, true),
        field("devices", list_of(DataType::Int64), true),
        field("error", DataType::Utf8, true),
        bytes("file_bytes", true),
        field("path", DataType::Utf8, false),
        bytes("peak_allocated_bytes", true),
        field("peak_device", DataType::Int64, true),
        bytes("peak_reserved_bytes", true),
        field("per_device", list_of(DataType::Struct(per_device)), true),
        bytes("pickle_bytes", true),
        field("producer", DataType::Utf8, true),
        bytes("reserved_bytes", true),
        field("schema_version", DataType::Int64, false),
        field("suspect_count", DataType::Int64, true),
        field("top_suspects", list_of(DataType::Struct(suspect)), true),
    ])
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
            f.top_suspects.iter().map(|s| s.severity.name()).collect::<Vec<_>>().join(";"),
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
        // A Parquet output's rows are kept as JSON Lines until the batch is done.
        Format::Jsonl | Format::Parquet => json_safe(&serde_json::to_string(&row_json(row))?).into_owned() + "\n",
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

    /// `value` has the shape `data_type` says, level by level: the same keys as a struct's fields
    /// (and in their order), `null` only where the field is nullable, numbers of the column's
    /// type.
    fn conforms(value: &Value, data_type: &DataType, nullable: bool, at: &str) {
        if value.is_null() {
            assert!(nullable, "{at} is null in a row but not nullable in the schema");
            return;
        }
        match data_type {
            DataType::Struct(fields) => {
                let object = value.as_object().unwrap_or_else(|| panic!("{at}: not an object: {value}"));
                let keys: Vec<&str> = object.keys().map(String::as_str).collect();
                let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
                assert_eq!(keys, names, "{at}: the row's keys and the schema's fields");
                for f in fields {
                    conforms(&object[f.name()], f.data_type(), f.is_nullable(), &format!("{at}.{}", f.name()));
                }
            }
            DataType::List(item) => {
                let items = value.as_array().unwrap_or_else(|| panic!("{at}: not an array: {value}"));
                for (i, v) in items.iter().enumerate() {
                    conforms(v, item.data_type(), item.is_nullable(), &format!("{at}[{i}]"));
                }
            }
            DataType::UInt64 => assert!(value.is_u64(), "{at}: not a u64: {value}"),
            DataType::Int64 => assert!(value.is_i64(), "{at}: not an i64: {value}"),
            DataType::Float64 => assert!(value.is_number(), "{at}: not a number: {value}"),
            DataType::Utf8 => assert!(value.is_string(), "{at}: not a string: {value}"),
            other => panic!("{at}: {other} is not a type row_json writes"),
        }
    }

    #[test]
    fn the_arrow_schema_is_the_json_row() {
        let snap = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/multi/m02_ddp_rank1.pickle");
        let Outcome::Row(read) = analyze_row(&snap, "m02_ddp_rank1.pickle".into(), 3, None) else {
            panic!("read without a cap")
        };
        let Ok(figures) = &read.result else { panic!("m02_ddp_rank1.pickle is readable") };
        assert!(figures.top_suspects.iter().any(|s| s.site.is_some()), "a suspect with a site");
        // Every null the JSON can hold: a device without a trace (no peaks), a suspect without a
        // user frame, a file that could not be looked at, an error row.
        let mut untraced = figures.clone();
        untraced.devices.iter_mut().for_each(|d| d.peak_known = false);
        untraced.top_suspects.iter_mut().for_each(|s| s.site = None);
        let untraced = Row { path: "untraced".into(), file_bytes: Some(1), result: Ok(untraced) };
        let unread = Row { path: "-".into(), file_bytes: None, result: Err("cannot read".into()) };
        let schema = DataType::Struct(row_schema().fields().clone());
        for row in [&read, &untraced, &unread] {
            let json = row_json(row);
            conforms(&json, &schema, false, &row.path);
            // And as it is written and read back (key order is the serialised order).
            let line = row_line(row, Format::Jsonl).unwrap();
            conforms(&serde_json::from_str(&line).unwrap(), &schema, false, &row.path);
        }
        assert!(row_json(&untraced)["peak_allocated_bytes"].is_null());
        assert!(row_json(&untraced)["top_suspects"][0]["site"].is_null());
    }

    #[test]
    fn csv_quoting() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
