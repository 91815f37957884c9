//! `memsnap report FILE -o report.html|report.svg`: the self-contained report (verdict,
//! timeline, peak attribution, flamegraph, segment map, caveats) as an HTML page or one SVG.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use memsnap_report::timeline::XAxis;
use memsnap_report::{ReportInput, ReportOptions};

use crate::output::{write_output, Content};
use crate::pipeline::analyze_file;
use crate::pipeline::{file_name, lacks};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Html,
    Svg,
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub snapshot: crate::args::SnapshotFile,
    /// Output file (`-` for stdout). Its extension, `.html` or `.svg`, picks the format.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Output format, when the output's extension does not say.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// The timeline's x axis: `events` (allocator activity in order, every iteration gets room)
    /// or `time` (seconds since the first event).
    #[arg(long, value_enum, default_value_t = XAxisArg::Events)]
    pub x_axis: XAxisArg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XAxisArg {
    Events,
    Time,
}

/// The format asked for: `--format`, else the output's extension, else an error.
pub fn format_of(output: &Path, format: Option<Format>) -> anyhow::Result<Format> {
    if let Some(f) = format {
        return Ok(f);
    }
    match output.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
        Some("html" | "htm") => Ok(Format::Html),
        Some("svg") => Ok(Format::Svg),
        _ if output.as_os_str() == "-" => Ok(Format::Html),
        _ => anyhow::bail!(
            "{}: cannot tell the format from the extension; use .html or .svg, or --format",
            output.display()
        ),
    }
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let format = format_of(&args.output, args.format)?;
    let a = analyze_file(&args.snapshot.file)?;
    let caveats = lacks(&a.loaded.snapshot);
    let name = file_name(&a.loaded.path);
    let input = ReportInput {
        snapshot: &a.loaded.snapshot,
        replay: &a.replay,
        analysis: &a.analysis,
        file_name: &name,
        file_bytes: a.loaded.file_bytes,
        pickle_bytes: a.loaded.pickle_bytes,
        file_caveats: &caveats,
    };
    let opts = ReportOptions {
        x_axis: match args.x_axis {
            XAxisArg::Events => XAxis::Events,
            XAxisArg::Time => XAxis::Time,
        },
        ..ReportOptions::default()
    };
    let phase = crate::progress::phase("rendering the report");
    let report = memsnap_report::build(&input, &opts);
    let text = match format {
        Format::Html => report.html(),
        Format::Svg => report.svg(),
    };
    phase.finish_and_clear();
    write_output(&args.output, &text, Content::Markup)?;
    crate::emit::leave(a);
    Ok(ExitCode::SUCCESS)
}
