//! The timeline: allocated, reserved and active bytes over the trace, the top sites as stacked
//! areas, iterations and evaluation windows as bands, the peak and OOMs as markers.
//!
//! A trace can hold millions of events, so the series are cut into at most `max_points`
//! buckets of consecutive events; each bucket keeps its maximum (so no peak is lost) and the
//! stacked site areas are taken at the event where allocated bytes peak inside the bucket, so
//! they never rise above the allocated line. The chart itself is drawn with plotters; the
//! hover details (`<title>`) plotters cannot write are laid over it at the same coordinates.

use std::fmt::Write as _;

use memsnap_analysis::{attribute, Attr, DeviceAnalysis, Phases, StackTable};
use memsnap_model::{count_of, plural, Action, Snapshot, TraceEvent};
use memsnap_replay::DeviceReplay;
use plotters::prelude::*;
use rayon::prelude::*;

use crate::text::{escape, fmt_bytes, fmt_count, fmt_seconds, num, open_figure, text_width};

/// Colours of the stacked site areas, bottom first; the rest of allocated memory is grey.
pub const SITE_COLORS: [&str; 6] = ["#9ecae1", "#fdd49e", "#a1d99b", "#fcbba1", "#c6b8e6", "#f7e08b"];
pub const OTHER_COLOR: &str = "#e2e2e2";
const ALLOCATED: RGBColor = RGBColor(0x1d, 0x35, 0x57);
const ALLOCATED_MIN: RGBColor = RGBColor(0x5c, 0x7c, 0xb8);
const RESERVED: RGBColor = RGBColor(0x80, 0x80, 0x80);
const ACTIVE: RGBColor = RGBColor(0x2a, 0x9d, 0x8f);
const BAND: RGBColor = RGBColor(0xee, 0xf0, 0xf5);
const EVAL: RGBColor = RGBColor(0xfd, 0xf3, 0xe3);
const EVAL_STRIP: RGBColor = RGBColor(0xf4, 0xa2, 0x59);
const FLOOR: RGBColor = RGBColor(0x3a, 0x3a, 0x3a);
const OOM: RGBColor = RGBColor(0xd6, 0x28, 0x28);
const PEAK: RGBColor = RGBColor(0xc0, 0x1b, 0x1b);
const LABEL_STRIP: RGBColor = RGBColor(0x7b, 0x5e, 0xa7);

/// More iterations than this are not drawn as bands (they would blur into grey).
const MAX_BANDS: usize = 400;
const MAX_OOMS: usize = 100;
/// Labelled phases drawn at most (the first ones in trace order; the rest are counted in the
/// caption): more distinct labels than this are per-item tags, not phases to see on a chart.
const MAX_LABEL_BANDS: usize = 40;
/// The lowest-allocated line is drawn only when points cover at least this many events (below,
/// it hugs the highest and only adds clutter).
const MIN_LINE_BUCKET: usize = 16;

/// A shaded range of the x axis with its hover text.
#[derive(Clone, Debug)]
pub struct Band {
    pub x0: f64,
    pub x1: f64,
    pub title: String,
}

/// One stacked area: a site's allocated bytes at each sample.
#[derive(Clone, Debug)]
pub struct SiteSeries {
    pub label: String,
    pub values: Vec<u64>,
}

/// The sampled timeline of one device.
#[derive(Clone, Debug)]
pub struct Timeline {
    pub device: u32,
    /// x is seconds since the first event (else the event index, when times are missing).
    pub x_is_time: bool,
    pub events: usize,
    /// Events per bucket (the last may hold fewer).
    pub bucket_events: usize,
    pub xs: Vec<f64>,
    pub allocated: Vec<u64>,
    /// The lowest allocated value in each bucket (equal to `allocated` when buckets hold one
    /// event): with the maximum it shows how far memory swings inside a bucket.
    pub allocated_min: Vec<u64>,
    pub reserved: Vec<u64>,
    pub active: Vec<u64>,
    /// Bottom first.
    pub sites: Vec<SiteSeries>,
    pub iterations: Vec<Band>,
    /// Iterations found but too many to draw as bands.
    pub iterations_not_drawn: usize,
    /// Allocated bytes when each iteration starts (the floor a leak raises).
    pub iteration_floor: Vec<(f64, u64)>,
    pub evals: Vec<Band>,
    /// Phases the program named: each stretch of the trace under one `user_metadata` or
    /// `compile_context` value ([`memsnap_analysis::label_runs`]).
    pub labels: Vec<Band>,
    /// Labels found but not drawn (past [`MAX_LABEL_BANDS`]).
    pub labels_not_drawn: usize,
    pub ooms: Vec<(f64, String)>,
    pub ooms_total: usize,
    pub peak: (f64, u64, String),
    /// Suspects with growth on this device, for the chart's caption.
    pub growth_notes: Vec<String>,
}

/// What the x axis measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum XAxis {
    /// The event index: allocator activity in order, so every iteration gets room however long
    /// the program spent outside the allocator (setup, data loading). PyTorch's own memory
    /// viewer does the same. Times are given in the hover texts.
    #[default]
    Events,
    /// Seconds since the first event (falls back to events when times are missing or go back).
    Time,
}

/// x coordinates of events: seconds since the first event when asked and every event has a
/// time and times never go back, else the event index.
struct XMap<'a> {
    events: &'a [TraceEvent],
    t0: i64,
    time: bool,
    /// Every event has a time and times never go back.
    timed: bool,
}

impl XMap<'_> {
    fn x(&self, i: usize) -> f64 {
        let i = i.min(self.events.len().saturating_sub(1));
        if self.time {
            self.seconds(i)
        } else {
            i as f64
        }
    }

    fn seconds(&self, i: usize) -> f64 {
        let i = i.min(self.events.len().saturating_sub(1));
        (self.events[i].time_us - self.t0) as f64 / 1e6
    }

    /// ` at 1.2 s for 30 ms`, or nothing without times.
    fn when(&self, a: usize, b: usize) -> String {
        if self.timed {
            format!(", at {} for {}", fmt_seconds(self.seconds(a)), fmt_seconds(self.seconds(b) - self.seconds(a)))
        } else {
            String::new()
        }
    }
}

/// Sample the timeline of one device. `None` when the device has no trace.
#[allow(clippy::too_many_arguments)]
pub fn sample(
    snap: &Snapshot,
    stacks: &StackTable,
    phases: &Phases,
    d: &DeviceReplay,
    da: &DeviceAnalysis,
    max_points: usize,
    top_sites: usize,
    axis: XAxis,
) -> Option<Timeline> {
    let events = snap.trace(d.device).map_or(&[][..], |t| &t.events[..]);
    let n = events.len().min(d.series.len());
    if n == 0 {
        return None;
    }
    let timed =
        events[..n].iter().all(|e| e.has_time()) && events[..n].windows(2).all(|w| w[0].time_us <= w[1].time_us);
    let time = timed && axis == XAxis::Time;
    let xm = XMap { events: &events[..n], t0: events[0].time_us, time, timed };

    let buckets = n.min(max_points.max(1));
    let bounds = |k: usize| (k * n / buckets, (k + 1) * n / buckets);
    let s = &d.series;
    // (representative event, allocated max, reserved max, active max, allocated min) per bucket.
    let per: Vec<(usize, u64, u64, u64, u64)> = (0..buckets)
        .into_par_iter()
        .map(|k| {
            let (lo, hi) = bounds(k);
            let (mut rep, mut amax_at_rep) = (lo, s.allocated(lo));
            let (mut rmax, mut amax, mut lmin) = (0, 0, u64::MAX);
            for i in lo..hi {
                let t = s.after(Some(i));
                if t.allocated > amax_at_rep {
                    (rep, amax_at_rep) = (i, t.allocated);
                }
                rmax = rmax.max(t.reserved);
                amax = amax.max(t.active);
                lmin = lmin.min(t.allocated);
            }
            (rep, amax_at_rep, rmax, amax, if lo < hi { lmin } else { 0 })
        })
        .collect();
    let reps: Vec<usize> = per.iter().map(|p| p.0).collect();

    // Stacked sites: the top attributions at the peak, live bytes at each representative event.
    let top: Vec<(Attr, String)> = da
        .peak
        .by_site
        .iter()
        .filter(|sb| sb.bytes > 0)
        .take(top_sites)
        .map(|sb| (sb.attr, sb.label.clone()))
        .collect();
    let k = top.len();
    let mut site_values = vec![vec![0u64; buckets]; k];
    if k > 0 {
        let diff: Vec<i64> = d
            .blocks
            .par_iter()
            .fold(
                || vec![0i64; k * (buckets + 1)],
                |mut acc, b| {
                    if b.pending_at_start() {
                        return acc;
                    }
                    let (attr, _) = attribute(events, phases, stacks, b);
                    let Some(j) = top.iter().position(|t| t.0 == attr) else { return acc };
                    let start = b.alloc_event().unwrap_or(0) as usize;
                    let end = match (b.free_requested_event(), b.free_completed_event()) {
                        (Some(a), Some(c)) => a.min(c) as usize,
                        (Some(a), None) | (None, Some(a)) => a as usize,
                        (None, None) => n,
                    };
                    let lo = reps.partition_point(|&r| r < start);
                    let hi = reps.partition_point(|&r| r < end);
                    if lo < hi {
                        acc[j * (buckets + 1) + lo] += b.size as i64;
                        acc[j * (buckets + 1) + hi] -= b.size as i64;
                    }
                    acc
                },
            )
            .reduce(
                || vec![0i64; k * (buckets + 1)],
                |mut a, b| {
                    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                    a
                },
            );
        for (j, vals) in site_values.iter_mut().enumerate() {
            let mut run = 0i64;
            for (b, v) in vals.iter_mut().enumerate() {
                run += diff[j * (buckets + 1) + b];
                *v = run.max(0) as u64;
            }
        }
    }
    let sites = top.into_iter().zip(site_values).map(|((_, label), values)| SiteSeries { label, values }).collect();

    // Iterations and evaluation windows.
    let starts = &da.phases.iteration_starts;
    let mut iterations = Vec::new();
    let mut iteration_floor = Vec::new();
    for (j, &st) in starts.iter().enumerate() {
        let st = st as usize;
        if st >= n {
            continue;
        }
        let end = starts.get(j + 1).map_or(n, |&e| (e as usize).min(n));
        let floor = s.after(st.checked_sub(1)).allocated;
        iteration_floor.push((xm.x(st), floor));
        let dur = xm.when(st, end - 1);
        iterations.push(Band {
            x0: xm.x(st),
            x1: xm.x(end.saturating_sub(1).max(st)),
            title: format!(
                "iteration {} of {}: events {}–{}{dur}\nallocated at start: {}",
                j + 1,
                starts.len(),
                fmt_count(st as u64),
                fmt_count(end.saturating_sub(1) as u64),
                fmt_bytes(floor)
            ),
        });
    }
    let iterations_not_drawn = if iterations.len() > MAX_BANDS { std::mem::take(&mut iterations).len() } else { 0 };
    if iteration_floor.len() > max_points {
        // Keep every k-th iteration start (and the last), deterministically.
        let k = iteration_floor.len().div_ceil(max_points);
        let last = *iteration_floor.last().unwrap();
        iteration_floor = iteration_floor.into_iter().step_by(k).collect();
        if iteration_floor.last() != Some(&last) {
            iteration_floor.push(last);
        }
    }
    let evals = da
        .phases
        .eval_windows
        .iter()
        .filter(|w| (w.start as usize) < n)
        .map(|w| {
            let (a, b) = (w.start as usize, (w.end as usize).clamp(w.start as usize + 1, n) - 1);
            Band {
                x0: xm.x(a),
                x1: xm.x(b),
                title: format!(
                    "evaluation window (forward passes with no backward): events {}–{}{}",
                    fmt_count(a as u64),
                    fmt_count(b as u64),
                    xm.when(a, b)
                ),
            }
        })
        .collect();

    let runs = memsnap_analysis::label_runs(snap, &events[..n]);
    let labels: Vec<Band> = runs
        .iter()
        .filter(|l| (l.first_event as usize) < n)
        .take(MAX_LABEL_BANDS)
        .map(|l| {
            let (a, b) = (l.first_event as usize, (l.last_event as usize).min(n - 1));
            Band {
                x0: xm.x(a),
                x1: xm.x(b),
                title: format!(
                    "{} \"{}\": events {}–{}{}, {} carrying it",
                    l.kind.name(),
                    l.name,
                    fmt_count(a as u64),
                    fmt_count(b as u64),
                    xm.when(a, b),
                    memsnap_model::plural(l.events, "entry", "entries")
                ),
            }
        })
        .collect();
    let labels_not_drawn = runs.len().saturating_sub(labels.len());

    let mut ooms = Vec::new();
    let mut ooms_total = 0;
    for (i, e) in events[..n].iter().enumerate().filter(|(_, e)| e.action() == Action::Oom) {
        ooms_total += 1;
        if ooms.len() < MAX_OOMS {
            ooms.push((
                xm.x(i),
                format!(
                    "out of memory at event {}{}: asked for {}, {} free on the device; {} allocated, {} reserved",
                    fmt_count(i as u64),
                    if timed { format!(" ({} into the trace)", fmt_seconds(xm.seconds(i))) } else { String::new() },
                    fmt_bytes(e.size),
                    fmt_bytes(e.device_free()),
                    fmt_bytes(s.after(Some(i)).allocated),
                    fmt_bytes(s.after(Some(i)).reserved)
                ),
            ));
        }
    }

    let pk = d.peaks.allocated;
    let pi = pk.event_index.unwrap_or(0).min(n - 1);
    let peak = (
        xm.x(pi),
        pk.value,
        format!(
            "peak allocated: {} ({} bytes) {}",
            fmt_bytes(pk.value),
            fmt_count(pk.value),
            match pk.event_index {
                Some(i) if timed =>
                    format!("after event {} ({} into the trace)", fmt_count(i as u64), fmt_seconds(xm.seconds(i))),
                Some(i) => format!("after event {}", fmt_count(i as u64)),
                None => "before the first event".into(),
            }
        ),
    );
    let growth_notes = da
        .suspects
        .iter()
        .filter_map(|sp| {
            let g = sp.growth_bytes_per_iteration?;
            let site = sp.site.as_ref().map_or("(no user frame)".to_string(), |s| s.short());
            Some(format!("{} at {}: +{} per {}", sp.kind.name(), site, fmt_bytes(g), sp.growth_unit.name()))
        })
        .collect();

    Some(Timeline {
        device: d.device,
        x_is_time: time,
        events: n,
        bucket_events: n.div_ceil(buckets),
        xs: reps.iter().map(|&r| xm.x(r)).collect(),
        allocated: per.iter().map(|p| p.1).collect(),
        allocated_min: per.iter().map(|p| p.4).collect(),
        reserved: per.iter().map(|p| p.2).collect(),
        active: per.iter().map(|p| p.3).collect(),
        sites,
        iterations,
        iterations_not_drawn,
        iteration_floor,
        evals,
        labels,
        labels_not_drawn,
        ooms,
        ooms_total,
        peak,
        growth_notes,
    })
}

/// A unit for the y axis: the largest binary unit below `max`.
fn unit(max: u64) -> (f64, &'static str) {
    const UNITS: [(u64, &str); 4] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B")];
    for (u, name) in UNITS {
        if max >= u {
            return (u as f64, name);
        }
    }
    (1.0, "B")
}

/// Draw the timeline as a complete `<svg>` of the given width.
pub fn render(t: &Timeline, width: u32) -> String {
    let plot_h: u32 = 380;
    let caption_h = 40.0 + 16.0 * t.growth_notes.len() as f64;
    let ymax_bytes =
        t.reserved.iter().chain(&t.allocated).chain(&t.active).copied().max().unwrap_or(0).max(t.peak.1).max(1);
    let (u, uname) = unit(ymax_bytes);
    let ymax = ymax_bytes as f64 / u * 1.12;
    let x0 = 0.0f64.min(t.xs.first().copied().unwrap_or(0.0));
    let mut x1 = t.xs.last().copied().unwrap_or(1.0).max(t.iterations.last().map_or(0.0, |b| b.x1));
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let span = x1 - x0;

    let mut plot = String::new();
    let mut overlay = String::new();
    let mut plot_area = (0i32, 0i32, 0i32, 0i32);
    let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut plot, (width, plot_h)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin_top(16)
            .margin_right(24)
            .margin_left(8)
            .margin_bottom(4)
            .x_label_area_size(40)
            .y_label_area_size(72)
            .build_cartesian_2d(x0..x1, 0f64..ymax)?;
        let ytop = ymax;
        // Evaluation windows behind everything; iteration bands are laid over the areas later
        // (translucent), so they stay visible where the stacked areas fill the plot.
        chart.draw_series(
            t.evals.iter().map(|b| Rectangle::new([(b.x0, 0.0), (b.x1.max(b.x0 + span * 0.002), ytop)], EVAL.filled())),
        )?;
        let x_is_time = t.x_is_time;
        let xfmt = move |v: &f64| {
            if x_is_time {
                if span < 2.0 {
                    format!("{:.0} ms", v * 1000.0)
                } else if span < 20.0 {
                    format!("{v:.1} s")
                } else {
                    format!("{v:.0} s")
                }
            } else {
                compact(v.max(0.0).round() as u64)
            }
        };
        let yfmt = |v: &f64| {
            if *v == 0.0 {
                "0".to_string()
            } else if ymax < 10.0 {
                format!("{v:.1}")
            } else {
                format!("{v:.0}")
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .max_light_lines(0)
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
            .axis_style(RGBColor(0x88, 0x88, 0x88))
            .x_labels(10)
            .y_labels(8)
            .x_label_formatter(&xfmt)
            .y_label_formatter(&yfmt)
            .x_desc(if t.x_is_time {
                "time since the first trace event"
            } else {
                "trace events in order (allocator activity; hover the bands for times)"
            })
            .y_desc(uname)
            .label_style(("sans-serif", 13).into_font().color(&RGBColor(0x33, 0x33, 0x33)))
            .axis_desc_style(("sans-serif", 13).into_font().color(&RGBColor(0x33, 0x33, 0x33)))
            .draw()?;

        // Stacked sites, drawn from the top of the stack down so each band covers the next.
        let n = t.xs.len();
        let mut cum: Vec<Vec<u64>> = Vec::new();
        let mut run = vec![0u64; n];
        for s in &t.sites {
            for (r, v) in run.iter_mut().zip(&s.values) {
                *r += v;
            }
            cum.push(run.clone());
        }
        // Memory holds its value until the next event: draw steps, not slopes.
        let pts = |vals: &[u64]| -> Vec<(f64, f64)> {
            let mut p = Vec::with_capacity(vals.len() * 2);
            for (i, (x, v)) in t.xs.iter().zip(vals).enumerate() {
                let y = *v as f64 / u;
                p.push((*x, y));
                if let Some(next) = t.xs.get(i + 1) {
                    p.push((*next, y));
                }
            }
            p
        };
        // "Other sites": up to the allocated line.
        chart.draw_series(AreaSeries::new(pts(&t.allocated), 0.0, hex(OTHER_COLOR).filled()))?;
        for (j, c) in cum.iter().enumerate().rev() {
            chart.draw_series(AreaSeries::new(pts(c), 0.0, hex(SITE_COLORS[j % SITE_COLORS.len()]).filled()))?;
        }
        chart.draw_series(LineSeries::new(pts(&t.reserved), RESERVED.stroke_width(2)))?;
        chart.draw_series(LineSeries::new(pts(&t.active), ACTIVE.stroke_width(1)))?;
        if t.bucket_events >= MIN_LINE_BUCKET && t.allocated_min != t.allocated {
            chart.draw_series(LineSeries::new(pts(&t.allocated_min), ALLOCATED_MIN.stroke_width(1)))?;
        }
        chart.draw_series(LineSeries::new(pts(&t.allocated), ALLOCATED.stroke_width(2)))?;
        if !t.iteration_floor.is_empty() {
            // Dots, not a line: a line across a long first iteration would suggest a ramp.
            let floor: Vec<(f64, f64)> = t.iteration_floor.iter().map(|(x, v)| (*x, *v as f64 / u)).collect();
            if floor.len() <= 150 {
                chart.draw_series(floor.iter().map(|p| Circle::new(*p, 3, FLOOR.filled())))?;
            } else {
                chart.draw_series(LineSeries::new(floor, FLOOR.stroke_width(1)))?;
            }
        }
        // Evaluation windows are also marked by a strip along the top of the plot.
        chart.draw_series(t.evals.iter().map(|b| {
            Rectangle::new([(b.x0, ytop), (b.x1.max(b.x0 + span * 0.002), ytop * 0.985)], EVAL_STRIP.filled())
        }))?;
        // Labelled phases: a strip along the bottom of the plot.
        chart.draw_series(t.labels.iter().map(|b| {
            Rectangle::new([(b.x0, 0.0), (b.x1.max(b.x0 + span * 0.002), ytop * 0.02)], LABEL_STRIP.mix(0.7).filled())
        }))?;
        for (x, _) in &t.ooms {
            chart.draw_series(std::iter::once(PathElement::new(vec![(*x, 0.0), (*x, ytop)], OOM.stroke_width(2))))?;
        }
        let peak = (t.peak.0, t.peak.1 as f64 / u);
        chart.draw_series(std::iter::once(Circle::new(peak, 5, PEAK.stroke_width(2))))?;

        // Hover details, at the same coordinates.
        let (l, tp) = chart.backend_coord(&(x0, ytop));
        let (r, b) = chart.backend_coord(&(x1, 0.0));
        plot_area = (l, tp, r, b);
        let number_every = (t.iterations.len() / 40).max(1);
        for (j, band) in t.iterations.iter().enumerate() {
            let (a, _) = chart.backend_coord(&(band.x0, ytop));
            let (z, _) = chart.backend_coord(&(band.x1, ytop));
            let w = (z - a).max(1);
            let shade = if j % 2 == 1 {
                r##"fill="#1d3557" fill-opacity="0.07""##
            } else {
                r##"fill="#000000" fill-opacity="0""##
            };
            let _ = write!(
                overlay,
                r#"<g><title>{}</title><rect x="{a}" y="{tp}" width="{w}" height="{}" {shade}/>"#,
                escape(&band.title),
                b - tp
            );
            if j % number_every == 0 && w >= 12 {
                let _ = write!(
                    overlay,
                    r##"<text x="{}" y="{}" font-size="10" fill="#5b6068" text-anchor="middle">{}</text>"##,
                    a + w / 2,
                    tp - 3,
                    j + 1
                );
            }
            overlay.push_str("</g>\n");
        }
        for band in &t.evals {
            let (a, _) = chart.backend_coord(&(band.x0, ytop));
            let (z, _) = chart.backend_coord(&(band.x1, ytop));
            let _ = writeln!(
                overlay,
                r##"<rect x="{a}" y="{tp}" width="{}" height="{}" fill="#000000" fill-opacity="0"><title>{}</title></rect>"##,
                (z - a).max(2),
                b - tp,
                escape(&band.title)
            );
        }
        for band in &t.labels {
            let (a, strip_top) = chart.backend_coord(&(band.x0, ytop * 0.02));
            let (z, _) = chart.backend_coord(&(band.x1, ytop));
            let _ = writeln!(
                overlay,
                r##"<rect x="{a}" y="{}" width="{}" height="{}" fill="#000000" fill-opacity="0"><title>{}</title></rect>"##,
                strip_top - 4,
                (z - a).max(2),
                b - strip_top + 4,
                escape(&band.title)
            );
        }
        for (x, title) in &t.ooms {
            let (px, _) = chart.backend_coord(&(*x, ytop));
            let _ = writeln!(
                overlay,
                r##"<g><title>{}</title><rect x="{}" y="{tp}" width="7" height="{}" fill="#000000" fill-opacity="0"/><text x="{}" y="{}" font-size="11" font-weight="700" fill="#d62828">OOM</text></g>"##,
                escape(title),
                px - 3,
                b - tp,
                px + 4,
                tp + 12
            );
        }
        let (px, py) = chart.backend_coord(&peak);
        let label = format!("peak {}", fmt_bytes(t.peak.1));
        let lw = text_width(&label, 12.0);
        let lx = if (px as f64) + 8.0 + lw > r as f64 { px as f64 - 8.0 - lw } else { px as f64 + 8.0 };
        let _ = writeln!(
            overlay,
            r##"<g><title>{}</title><circle cx="{px}" cy="{py}" r="8" fill="#000000" fill-opacity="0"/><text x="{}" y="{}" font-size="12" font-weight="700" fill="#c01b1b" stroke="#ffffff" stroke-width="3" paint-order="stroke">{}</text></g>"##,
            escape(&t.peak.2),
            num(lx),
            py - 6,
            escape(&label)
        );
        root.present()?;
        Ok(())
    })();
    if drawn.is_err() {
        plot = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{plot_h}"><text x="10" y="20">chart could not be drawn</text></svg>"#
        );
    }
    let _ = plot_area;

    // Caption above, legend below.
    let mut s = String::new();
    let legend = legend_items(t);
    let legend_rows = layout_legend(&legend, width as f64 - 20.0);
    let legend_h = 20.0 * legend_rows.len() as f64 + 8.0;
    let total_h = caption_h + plot_h as f64 + legend_h;
    open_figure(&mut s, width as f64, total_h, "timeline");
    let _ = writeln!(
        s,
        r##"<text x="10" y="18" font-size="15" font-weight="600" fill="#1a1a1a">Memory over time, device {}</text>"##,
        t.device
    );
    let sampled = if t.bucket_events > 1 {
        format!(
            "{} events, drawn as {} points (each the highest value of {} consecutive events)",
            fmt_count(t.events as u64),
            t.xs.len(),
            fmt_count(t.bucket_events as u64)
        )
    } else {
        format!("{} events", fmt_count(t.events as u64))
    };
    let mut sub = sampled;
    if t.labels_not_drawn > 0 {
        let _ = write!(sub, "; {} not drawn", plural(t.labels_not_drawn as u64, "more label", "more labels"));
    }
    if t.iterations_not_drawn > 0 {
        let _ = write!(sub, "; {} iterations (too many to shade)", fmt_count(t.iterations_not_drawn as u64));
    }
    if t.ooms_total > t.ooms.len() {
        let _ = write!(sub, "; {} OOMs, first {} marked", t.ooms_total, t.ooms.len());
    }
    let _ = writeln!(s, r##"<text x="10" y="35" font-size="12" fill="#555555">{}</text>"##, escape(&sub));
    for (j, g) in t.growth_notes.iter().enumerate() {
        let _ = writeln!(
            s,
            r##"<text x="10" y="{}" font-size="12" font-weight="600" fill="#b3261e">{}</text>"##,
            num(52.0 + 16.0 * j as f64),
            escape(g)
        );
    }
    let _ = writeln!(s, r#"<g transform="translate(0,{})">"#, num(caption_h));
    s.push_str(&simplify_point_lists(&plot));
    s.push_str(&overlay);
    s.push_str("</g>\n");
    let mut y = caption_h + plot_h as f64 + 6.0;
    for row in legend_rows {
        let mut x = 10.0;
        for it in row {
            let _ = write!(s, "<g><title>{}</title>", escape(&it.title));
            match &it.swatch {
                Swatch::Fill(c) => {
                    let _ = write!(
                        s,
                        r##"<rect x="{}" y="{}" width="14" height="11" fill="{c}" stroke="#999999" stroke-width="0.5"/>"##,
                        num(x),
                        num(y + 2.0)
                    );
                }
                Swatch::Line(c, w) => {
                    let _ = write!(
                        s,
                        r#"<rect x="{}" y="{}" width="14" height="{w}" fill="{c}"/>"#,
                        num(x),
                        num(y + 7.0 - *w as f64 / 2.0)
                    );
                }
                Swatch::Dot(c) => {
                    let _ = write!(
                        s,
                        r#"<circle cx="{}" cy="{}" r="4" fill="none" stroke="{c}" stroke-width="2"/>"#,
                        num(x + 7.0),
                        num(y + 7.0)
                    );
                }
                Swatch::FilledDot(c) => {
                    let _ = write!(s, r#"<circle cx="{}" cy="{}" r="3" fill="{c}"/>"#, num(x + 7.0), num(y + 7.0));
                }
            }
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{}" font-size="12" fill="#222222">{}</text></g>"##,
                num(x + 19.0),
                num(y + 12.0),
                escape(&it.label)
            );
            x += it.width;
        }
        y += 20.0;
    }
    s.push_str("</svg>\n");
    s
}

/// Drop points that do not change what a polyline or polygon draws: repeats, and the middle of
/// three points on one vertical or horizontal line when it lies between the other two. Plotters
/// writes whole-pixel coordinates, so a 2,000-point series on a 1,000-pixel axis has many.
fn simplify_point_lists(svg: &str) -> String {
    let mut out = String::with_capacity(svg.len());
    let mut rest = svg;
    while let Some(i) = rest.find("points=\"") {
        let (head, tail) = rest.split_at(i + 8);
        out.push_str(head);
        let end = tail.find('"').unwrap_or(tail.len());
        let mut pts: Vec<(i64, i64)> = Vec::new();
        for p in tail[..end].split_ascii_whitespace() {
            let Some((x, y)) = p.split_once(',').and_then(|(x, y)| Some((x.parse().ok()?, y.parse().ok()?))) else {
                continue;
            };
            if pts.last() == Some(&(x, y)) {
                continue;
            }
            while pts.len() >= 2 {
                let (a, b) = (pts[pts.len() - 2], pts[pts.len() - 1]);
                let between = |a: i64, b: i64, c: i64| (a <= b && b <= c) || (c <= b && b <= a);
                let redundant = (a.0 == b.0 && b.0 == x && between(a.1, b.1, y))
                    || (a.1 == b.1 && b.1 == y && between(a.0, b.0, x));
                if redundant {
                    pts.pop();
                } else {
                    break;
                }
            }
            pts.push((x, y));
        }
        for (x, y) in pts {
            let _ = write!(out, "{x},{y} ");
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `950`, `12k`, `1.5M`: short tick labels.
fn compact(n: u64) -> String {
    if n < 10_000 {
        fmt_count(n)
    } else if n < 1_000_000 {
        format!("{}k", num(n as f64 / 1000.0))
    } else {
        format!("{}M", num(n as f64 / 1e6))
    }
}

fn hex(c: &str) -> RGBColor {
    let v = u32::from_str_radix(c.trim_start_matches('#'), 16).unwrap_or(0);
    RGBColor((v >> 16) as u8, (v >> 8) as u8, v as u8)
}

enum Swatch {
    Fill(String),
    Line(String, u32),
    Dot(String),
    FilledDot(String),
}

struct LegendItem {
    swatch: Swatch,
    label: String,
    title: String,
    width: f64,
}

fn legend_items(t: &Timeline) -> Vec<LegendItem> {
    let c = |c: RGBColor| format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2);
    let mut v = vec![
        (
            Swatch::Line(c(ALLOCATED), 3),
            "allocated".to_string(),
            "memory_allocated(): bytes in blocks held by tensors".to_string(),
        ),
        (
            Swatch::Line(c(ACTIVE), 2),
            "active".to_string(),
            "allocated plus blocks freed but still in use by another stream".to_string(),
        ),
        (
            Swatch::Line(c(RESERVED), 3),
            "reserved".to_string(),
            "memory_reserved(): bytes the caching allocator holds from CUDA".to_string(),
        ),
        (Swatch::Dot(c(PEAK)), "peak".to_string(), t.peak.2.clone()),
    ];
    if t.bucket_events >= MIN_LINE_BUCKET && t.allocated_min != t.allocated {
        v.insert(
            1,
            (
                Swatch::Line(c(ALLOCATED_MIN), 2),
                "allocated, lowest in each point".to_string(),
                "each point covers several events: the dark line is their highest allocated value, this one their lowest".to_string(),
            ),
        );
    }
    if !t.iteration_floor.is_empty() {
        v.push((
            Swatch::FilledDot("#3a3a3a".into()),
            "allocated at iteration start".into(),
            "a leak raises these dots iteration after iteration".into(),
        ));
    }
    if !t.iterations.is_empty() {
        v.push((
            Swatch::Fill(c(BAND)),
            "iterations (numbered; every other one shaded)".into(),
            format!("{} iterations", t.iterations.len()),
        ));
    }
    if !t.evals.is_empty() {
        v.push((
            Swatch::Fill(c(EVAL_STRIP)),
            "evaluation (forward, no backward)".into(),
            "forward passes with no backward".into(),
        ));
    }
    if !t.labels.is_empty() {
        v.push((
            Swatch::Fill(c(LABEL_STRIP)),
            "labelled phases (user_metadata, compile regions)".into(),
            format!("{} along the bottom; hover one for its name", count_of(t.labels.len() as u64, "label")),
        ));
    }
    if t.ooms_total > 0 {
        v.push((Swatch::Line(c(OOM), 3), "OOM".into(), format!("{} out-of-memory events", t.ooms_total)));
    }
    for (j, s) in t.sites.iter().enumerate() {
        let max = s.values.iter().copied().max().unwrap_or(0);
        v.push((
            Swatch::Fill(SITE_COLORS[j % SITE_COLORS.len()].into()),
            crate::text::fit(&s.label, 420.0, 12.0),
            format!("{}\nallocated by this site, up to {}", s.label, fmt_bytes(max)),
        ));
    }
    if !t.sites.is_empty() {
        v.push((
            Swatch::Fill(OTHER_COLOR.into()),
            "other sites".into(),
            "allocated bytes not from the sites above".into(),
        ));
    }
    v.into_iter()
        .map(|(swatch, label, title)| {
            let width = 19.0 + text_width(&label, 12.0) + 18.0;
            LegendItem { swatch, label, title, width }
        })
        .collect()
}

fn layout_legend(items: &[LegendItem], width: f64) -> Vec<Vec<&LegendItem>> {
    let mut rows: Vec<Vec<&LegendItem>> = vec![Vec::new()];
    let mut x = 0.0;
    for it in items {
        if x + it.width > width && !rows.last().unwrap().is_empty() {
            rows.push(Vec::new());
            x = 0.0;
        }
        rows.last_mut().unwrap().push(it);
        x += it.width;
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::simplify_point_lists;

    #[test]
    fn simplifies_without_changing_the_shape() {
        let svg = r#"<polyline points="0,5 1,5 2,5 2,5 2,3 2,1 2,4 3,4 "/>"#;
        // The vertical run 5 → 1 → 4 keeps its extreme (1); the flat runs keep their ends.
        assert_eq!(simplify_point_lists(svg), r#"<polyline points="0,5 2,5 2,1 2,4 3,4 "/>"#);
    }
}
