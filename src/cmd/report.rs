//! `memsnap report FILE -o report.html|report.svg`: the self-contained report (verdict,
//! timeline, peak attribution, flamegraph, segment map, caveats) as an HTML page or one SVG.
//! The HTML page is interactive (inline script and data, nothing fetched) unless `--static`
//! asks for the script-free page.

use std::path::{Path, PathBuf};

use memsnap_report::timeline::XAxis;
use memsnap_report::{ReportInput, ReportOptions};

use crate::exit::Exit;
use crate::output::{write_output, Content};
use crate::pipeline::analyze_file;
use crate::pipeline::file_name;

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
    /// Write the HTML page without its script and data: static figures only, for places that
    /// strip scripts (some mail clients, wikis). The SVG format is always static.
    #[arg(long = "static")]
    pub static_page: bool,
    /// Also embed, event by event, the iteration that holds MOMENT (the window of 4,096 events
    /// around it outside iterations), before the page's own choice; repeatable. Traces of up to
    /// 131,072 events are embedded whole anyway. MOMENT as in `flamegraph --at`.
    #[arg(long, value_name = "MOMENT", value_parser = crate::moment::parse)]
    pub detail: Vec<crate::moment::At>,
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

/// `--detail` moments as (device, event) on every device where they exist; an error only when
/// one exists on no device.
fn focus(a: &crate::pipeline::Analyzed, moments: &[crate::moment::At]) -> anyhow::Result<Vec<(u32, usize)>> {
    let mut out = Vec::new();
    for at in moments {
        let mut first_error = None;
        let mut found = false;
        for (d, da) in a.replay.devices.iter().zip(&a.analysis.devices) {
            let events = a.loaded.snapshot.trace(d.device).map_or(&[][..], |t| &t.events[..]);
            if events.is_empty() {
                continue;
            }
            match at.resolve(events, d.peaks.allocated.event_index, || da.phases.iteration_starts.clone()) {
                Ok(e) => {
                    out.push((d.device, e.unwrap_or(0)));
                    found = true;
                }
                Err(e) => first_error = first_error.or(Some(format!("device {}: {e}", d.device))),
            }
        }
        if !found {
            anyhow::bail!("--detail {}: {}", at.name(), first_error.unwrap_or_else(|| "the file has no trace".into()));
        }
    }
    Ok(out)
}

pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let format = format_of(&args.output, args.format)?;
    let a = analyze_file(&args.snapshot.file)?;
    let caveats = a.file_caveats.clone();
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
    let detail = memsnap_report::interactive::Detail { focus: focus(&a, &args.detail)? };
    let phase = crate::progress::phase("rendering the report");
    let text = match format {
        Format::Html if args.static_page => memsnap_report::build(&input, &opts).html(),
        Format::Html => memsnap_report::interactive::build_page(&input, &opts, &detail),
        Format::Svg => memsnap_report::build(&input, &opts).svg(),
    };
    phase.finish_and_clear();
    write_output(&args.output, &text, Content::Markup)?;
    crate::emit::leave(a);
    Ok(Exit::SUCCESS)
}
