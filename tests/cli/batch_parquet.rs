//! `batch -o rows.parquet`: the same rows as JSON Lines, read back with the parquet crate's own
//! Arrow reader and compared value for value; refused without an output file; an unreadable
//! partial file is a one-line error naming it. Identical bytes for every `--jobs` are in
//! batch.rs, a resumed Parquet batch in batch_resume.rs. See docs/batch.md.

use crate::common;

use std::fs::File;
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use serde_json::{json, Map, Value};

use common::{fixture, memsnap, root};

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The value at `i` of an Arrow array as JSON, written out by hand for the types a batch row
/// has (an independent reading: no arrow-json here). Panics on any other type.
fn value(array: &dyn Array, i: usize) -> Value {
    if array.is_null(i) {
        return Value::Null;
    }
    match array.data_type() {
        DataType::UInt64 => json!(array.as_primitive::<UInt64Type>().value(i)),
        DataType::Int64 => json!(array.as_primitive::<Int64Type>().value(i)),
        DataType::Float64 => json!(array.as_primitive::<Float64Type>().value(i)),
        DataType::Utf8 => json!(array.as_string::<i32>().value(i)),
        DataType::List(_) => {
            let items = array.as_list::<i32>().value(i);
            Value::Array((0..items.len()).map(|j| value(&items, j)).collect())
        }
        DataType::Struct(fields) => {
            let st = array.as_struct();
            let object: Map<String, Value> =
                fields.iter().zip(st.columns()).map(|(f, c)| (f.name().clone(), value(c, i))).collect();
            Value::Object(object)
        }
        other => panic!("a column of type {other}"),
    }
}

/// The rows of a Parquet file as JSON objects (columns by name), and its batches.
fn parquet_rows(path: &Path) -> (Vec<Value>, Vec<RecordBatch>) {
    let file = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap();
    let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
    let mut rows = Vec::new();
    for batch in &batches {
        for i in 0..batch.num_rows() {
            let object: Map<String, Value> = batch
                .schema()
                .fields()
                .iter()
                .zip(batch.columns())
                .map(|(f, c)| (f.name().clone(), value(c.as_ref(), i)))
                .collect();
            rows.push(Value::Object(object));
        }
    }
    (rows, batches)
}

#[test]
fn parquet_rows_are_the_json_lines_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.pickle");
    std::fs::write(&bad, b"not a pickle").unwrap();
    let mut inputs = vec!["fixtures/dev".to_string(), "fixtures/multi".to_string(), s(&bad).to_string()];
    // A sum that saturates at 2^64 - 1 (past Int64), and strings with terminal escapes.
    for hostile in ["ok_sizes_sum_past_2p64.pickle.xz", "ok_terminal_escapes.pickle.xz"] {
        let p = fixture(&format!("hostile/{hostile}"));
        if p.is_file() {
            inputs.push(format!("fixtures/hostile/{hostile}"));
        } else {
            eprintln!("note: {} is absent", p.display());
        }
    }
    let run = |out: &Path| {
        let mut args = vec!["batch"];
        args.extend(inputs.iter().map(String::as_str));
        args.extend(["-o", s(out), "--jobs", "2"]);
        memsnap(&args)
    };
    let (jsonl, parquet) = (tmp.path().join("rows.jsonl"), tmp.path().join("rows.parquet"));
    let j = run(&jsonl);
    assert_eq!(j.code, Some(2), "{}", j.stderr);
    let p = run(&parquet);
    assert_eq!(p.code, Some(2), "the bad file is an error row: {}", p.stderr);
    assert!(p.stdout.is_empty(), "{}", p.stdout);
    let rows_line = j.stderr.lines().last().unwrap().replace("rows.jsonl", "rows.parquet");
    assert_eq!(p.stderr.lines().last().unwrap(), rows_line);
    assert!(!tmp.path().join("rows.parquet.partial").exists(), "the partial file is removed");
    assert!(std::fs::read(&parquet).unwrap().starts_with(b"PAR1"), "a Parquet file, chosen by the extension");

    let expected: Vec<Value> =
        std::fs::read_to_string(&jsonl).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let (rows, batches) = parquet_rows(&parquet);
    assert_eq!(rows.len(), expected.len());
    assert!(rows.len() >= 15, "{} rows", rows.len());
    for (got, want) in rows.iter().zip(&expected) {
        // Column for column: the same keys (in the same order) and values, nulls included.
        let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(got), keys(want), "{}", want["path"]);
        assert_eq!(got, want, "{}", want["path"]);
    }
    // The rows are of every kind: an error row, suspects with sites, several devices.
    assert!(rows.iter().any(|r| r["error"].is_string()) && rows.iter().any(|r| r["error"].is_null()));
    assert!(rows.iter().any(|r| r["top_suspects"][0]["site"]["line"].is_u64()));
    assert!(rows.iter().any(|r| r["devices"].as_array().is_some_and(|d| d.len() > 1)));
    if inputs.iter().any(|i| i.contains("2p64")) {
        assert!(rows.iter().any(|r| r["allocated_bytes"] == json!(u64::MAX)), "u64::MAX is kept whole");
    }

    // Byte counts are unsigned, indices signed; compressed with zstd.
    let schema = batches[0].schema();
    assert_eq!(schema.field_with_name("allocated_bytes").unwrap().data_type(), &DataType::UInt64);
    assert!(!schema.field_with_name("path").unwrap().is_nullable());
    assert!(matches!(schema.field_with_name("devices").unwrap().data_type(),
        DataType::List(item) if item.data_type() == &DataType::Int64));
    let file = File::open(&parquet).unwrap();
    let meta = ParquetRecordBatchReaderBuilder::try_new(file).unwrap().metadata().clone();
    let column = meta.row_group(0).column(0);
    assert!(matches!(column.compression(), Compression::ZSTD(_)), "{:?}", column.compression());
}

#[test]
fn parquet_needs_an_output_file() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        &["batch", "fixtures/multi", "--format", "parquet"][..],
        &["batch", "fixtures/multi", "--format", "parquet", "-o", "-"],
        &["batch", "fixtures/multi", "--format", "parquet", "-o", "/dev/stdout"],
    ] {
        let r = memsnap(args);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        assert!(r.stdout.is_empty(), "{args:?}: nothing on stdout");
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: one line: {}", r.stderr);
        assert!(r.stderr.starts_with("memsnap: error: Parquet needs -o FILE"), "{args:?}: {}", r.stderr);
    }
    // --format beats the extension, both ways.
    let out = tmp.path().join("rows.jsonl");
    let r = memsnap(&["batch", "fixtures/multi", "--format", "parquet", "-o", s(&out)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(std::fs::read(&out).unwrap().starts_with(b"PAR1"));
    let out = tmp.path().join("ROWS.PARQUET");
    let r = memsnap(&["batch", "fixtures/multi", "--format", "jsonl", "-o", s(&out)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(std::fs::read(&out).unwrap().starts_with(b"{"));
    // The extension in any case.
    let r = memsnap(&["batch", "fixtures/multi", "-o", s(&out)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(std::fs::read(&out).unwrap().starts_with(b"PAR1"));
}

#[test]
fn a_partial_file_that_is_not_batch_rows_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("rows.parquet");
    let partial = tmp.path().join("rows.parquet.partial");
    std::fs::write(&out, "OLD\n").unwrap();
    // A row --resume accepts (it has `path` and `error`) for the one input, whose figures are
    // not of the row's types: it is kept, and the conversion must refuse it.
    let snap = "fixtures/multi/m02_ddp_rank0.pickle";
    assert!(root().join(snap).is_file());
    let line = format!("{{\"allocated_bytes\":\"lots\",\"error\":null,\"path\":\"{snap}\",\"schema_version\":1}}\n");
    std::fs::write(&partial, &line).unwrap();
    let r = memsnap(&["batch", snap, "-o", s(&out), "--resume"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "one line: {}", r.stderr);
    assert!(
        r.stderr.starts_with(&format!("memsnap: error: cannot convert {} to Parquet: ", partial.display())),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("allocated_bytes"), "says which column: {}", r.stderr);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "OLD\n", "OUT is untouched");
    assert_eq!(std::fs::read_to_string(&partial).unwrap(), line, "the partial file is left for a look");

    // A key that is not a column is refused too, not dropped.
    let line = format!("{{\"error\":null,\"path\":\"{snap}\",\"schema_version\":1,\"surprise\":1}}\n");
    std::fs::write(&partial, &line).unwrap();
    let r = memsnap(&["batch", snap, "-o", s(&out), "--resume"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("to Parquet: ") && r.stderr.contains("surprise"), "{}", r.stderr);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "OLD\n");
}
