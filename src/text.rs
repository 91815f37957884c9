//! Formatting shared by the text outputs: sizes, categories, site labels.

use memsnap_analysis::{Category, Site};

/// Bytes with a binary unit and two decimals (`20.00 MiB`), the one precision of every text
/// output.
pub fn fmt_bytes(b: u64) -> String {
    memsnap_model::format_bytes(b, 2)
}

pub fn category_title(c: Category) -> &'static str {
    match c {
        Category::PreTrace => "made before the trace",
        Category::Gradients => "gradients",
        Category::OptimizerState => "optimizer state",
        Category::Activations => "activations",
        Category::Temporaries => "temporaries",
        Category::Other => "other long-lived",
    }
}

/// [`category_title`] for a device whose trace records allocations (`traced_allocations`) or
/// none (no trace, or a ring of a few entries, as the legacy `_record_memory_history(True)`
/// keeps): then every live block is pre-trace, leaks included, not only parameters and buffers.
pub fn category_title_in(c: Category, traced_allocations: bool) -> &'static str {
    match c {
        Category::PreTrace if !traced_allocations => "pre-trace (all of it: the trace records no allocation)",
        _ => category_title(c),
    }
}

/// A suspect's site as the label suspects are matched by: [`Site::short`]
/// (`path/last/parts.py:LINE (function)`), or `(no user frame)` without a site. `diff` matches the
/// suspects of two files by kind and this label, `ranks` those of the ranks of a job, so that files
/// written from different checkouts or machines line up; both also print it and write it as the
/// JSON's `label`.
pub fn site_label(site: Option<&Site>) -> String {
    site.map_or_else(|| "(no user frame)".to_string(), Site::short)
}

/// The time of the first timed event of `events`: the origin of every relative time a text
/// output prints for that device.
pub fn trace_origin(events: &[memsnap_model::TraceEvent]) -> Option<i64> {
    events.iter().find(|e| e.has_time()).map(|e| e.time_us)
}

/// `time_us` as seconds after the trace's first timed event, to the microsecond: `+12.345678 s`
/// (`-0.000100 s` for an event stamped before it, which a file may hold).
pub fn since_start(time_us: i64, origin: i64) -> String {
    let d = i128::from(time_us) - i128::from(origin);
    let sign = if d < 0 { '-' } else { '+' };
    let d = d.unsigned_abs();
    format!("{sign}{}.{:06} s", d / 1_000_000, d % 1_000_000)
}

/// Microseconds since the Unix epoch as a UTC date and time to the microsecond:
/// `2026-11-30 14:05:03.123456 UTC`. Days to a civil date by Howard Hinnant's `civil_from_days`
/// (exact over the proleptic Gregorian calendar), which needs no date library.
pub fn utc(time_us: i64) -> String {
    let secs = time_us.div_euclid(1_000_000);
    let micros = time_us.rem_euclid(1_000_000);
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{micros:06} UTC", sod / 3600, sod % 3600 / 60, sod % 60)
}

/// Columns to wrap paragraphs to: `$COLUMNS` when set, else the width of the terminal stdout
/// is; `None` (no wrapping) when stdout is not a terminal, so pipes and files get one line per
/// paragraph whatever the terminal.
pub fn wrap_width() -> Option<usize> {
    /// Narrower than this, wrapping makes paragraphs harder to read, not easier.
    const MIN_WIDTH: usize = 40;
    let columns = std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse::<usize>().ok());
    let width = columns.or_else(|| {
        crate::emit::stdout_is_terminal()
            .then(|| terminal_size::terminal_size().map(|(w, _)| usize::from(w.0)))
            .flatten()
    })?;
    Some(width.max(MIN_WIDTH))
}

/// `text` wrapped at spaces to `width` columns (characters), continuation lines indented by
/// `indent` spaces; the first line's own prefix (`first`) counts against the width. A word
/// longer than a line stays whole. Without a width, `first` + `text` on one line.
pub fn wrap(first: &str, text: &str, indent: usize, width: Option<usize>) -> String {
    let Some(width) = width else { return format!("{first}{text}") };
    let mut out = String::from(first);
    let mut col = first.chars().count();
    let mut at_line_start = true;
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let len = word.chars().count();
        if !at_line_start && col + 1 + len > width {
            out.push('\n');
            out.push_str(&" ".repeat(indent));
            col = indent;
            at_line_start = true;
        }
        if !at_line_start {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += len;
        at_line_start = false;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_are_exact_to_the_microsecond() {
        assert_eq!(since_start(1_795_964_915_303_575, 1_795_964_903_000_000), "+12.303575 s");
        assert_eq!(since_start(5, 5), "+0.000000 s");
        assert_eq!(since_start(0, 100), "-0.000100 s");
        assert_eq!(since_start(i64::MAX, i64::MIN + 1), "+18446744073709.551614 s");
    }

    #[test]
    fn epoch_microseconds_are_a_utc_date() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000000 UTC");
        assert_eq!(utc(951_782_400_000_001), "2000-02-29 00:00:00.000001 UTC");
        assert_eq!(utc(1_795_964_915_303_575), "2026-11-29 15:08:35.303575 UTC");
        assert_eq!(utc(-1), "1969-12-31 23:59:59.999999 UTC");
        // The extremes of i64 do not overflow.
        assert!(utc(i64::MIN + 1).ends_with("UTC") && utc(i64::MAX).ends_with("UTC"));
    }

    #[test]
    fn paragraphs_wrap_at_spaces_with_a_hanging_indent() {
        let text = "the tensor is kept alive by a list that grows every iteration";
        assert_eq!(wrap("  fix: ", text, 7, None), format!("  fix: {text}"));
        let wrapped = wrap("  fix: ", text, 7, Some(30));
        assert_eq!(wrapped, "  fix: the tensor is kept\n       alive by a list that\n       grows every iteration");
        assert!(wrapped.lines().all(|l| l.chars().count() <= 30));
        assert_eq!(
            wrapped.split_whitespace().collect::<Vec<_>>(),
            format!("fix: {text}").split_whitespace().collect::<Vec<_>>()
        );
        // A word longer than the line is not cut.
        assert_eq!(wrap("", "aaaaaaaaaa bb", 0, Some(5)), "aaaaaaaaaa\nbb");
    }
}
