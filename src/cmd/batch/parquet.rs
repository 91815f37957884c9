//! `batch -o rows.parquet`: the finished batch's rows as one Parquet file, converted from the
//! JSON Lines rows in `OUT.partial`.
//!
//! Why from the partial file rather than from the rows in memory: a Parquet file is columnar and
//! ends with its footer, so it cannot be appended to row by row, nor continued after a crash. The
//! rows of a Parquet batch are therefore written exactly as for `-o rows.jsonl` — each whole, as it
//! finishes, to `OUT.partial` — so that `--resume` works unchanged on them, and only when the
//! batch is done are they decoded against [`row_schema`] and written out as Parquet. The Parquet
//! bytes are a function of the JSON Lines bytes alone, which are the same for every `--jobs`
//! and for a resumed run, so the Parquet file is too. The file is built in memory (compressed, a
//! fraction of the JSON's size) and OUT is replaced by it whole or not at all
//! ([`crate::output::write_file`]); the partial file is removed only after that, so a failure
//! on the way leaves it for `--resume`.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use ::parquet::arrow::ArrowWriter;
use ::parquet::basic::{Compression, ZstdLevel};
use ::parquet::file::properties::WriterProperties;
use anyhow::Context;

use super::rows::row_schema;
use crate::output;

/// Rows decoded from JSON and handed to the Parquet writer at a time. It bounds the memory of
/// decoding, and is fixed: where the writer cuts pages depends on how its input is batched, and
/// the same rows must give the same bytes.
const BATCH_ROWS: usize = 4096;

/// The column chunks are zstd-compressed (which pyarrow, DuckDB, Polars and Spark all read) at
/// zstd's own default level.
const ZSTD_LEVEL: i32 = 3;

/// Convert the JSON Lines rows in `partial` to the Parquet file `target` (replaced whole), then
/// remove `partial`. Every error is one line naming the file it is about.
pub(super) fn convert(partial: &Path, target: &Path) -> anyhow::Result<()> {
    let bytes = to_parquet(partial)?;
    output::write_file(target, &bytes)?;
    std::fs::remove_file(partial).with_context(|| format!("cannot remove {}", partial.display()))
}

/// The Parquet bytes of the JSON Lines rows in `partial`.
fn to_parquet(partial: &Path) -> anyhow::Result<Vec<u8>> {
    let cannot = || format!("cannot convert {} to Parquet", partial.display());
    let file = File::open(partial).with_context(|| format!("cannot open {}", partial.display()))?;
    let schema = Arc::new(row_schema());
    // Strict: a key that is not a column is an error, not a column silently dropped.
    let rows = arrow_json::ReaderBuilder::new(schema.clone())
        .with_batch_size(BATCH_ROWS)
        .with_strict_mode(true)
        .build(BufReader::new(file))
        .with_context(cannot)?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL).with_context(cannot)?))
        .build();
    let mut writer = ArrowWriter::try_new(Vec::new(), schema, Some(props)).with_context(cannot)?;
    for batch in rows {
        // The decoder's message says which field failed.
        let batch = batch.with_context(cannot)?;
        writer.write(&batch).with_context(cannot)?;
    }
    writer.into_inner().with_context(cannot)
}
