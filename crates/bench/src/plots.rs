//! PNG plots of a run (plotters, bitmap backend; text in DejaVu Sans from
//! Debian's fonts-dejavu-core, which tests/setup installs).

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::report::{operator_runs, pairs};
use crate::results::Results;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const SIZE: (u32, u32) = (1000, 600);

fn register_font() -> anyhow::Result<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let bytes = std::fs::read(FONT)
            .map_err(|e| format!("{FONT}: {e} (apt-get install fonts-dejavu-core)"))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{FONT} is not a usable font"))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

type Plot = (String, String);

/// Draws every plot that has data; returns (title, file name) of each.
pub fn draw(dir: &Path, date: &str, r: &Results) -> anyhow::Result<Vec<Plot>> {
    register_font()?;
    let mut out = Vec::new();
    let file = format!("{date}-rollout-time.png");
    if rollout_time(&dir.join(&file), r)? {
        out.push(("Rollout time against nodes".to_string(), file));
    }
    let file = format!("{date}-reaction.png");
    if reaction(&dir.join(&file), r)? {
        out.push(("Reaction time distribution per fault".to_string(), file));
    }
    let file = format!("{date}-operator-rss.png");
    if operator_rss(&dir.join(&file), r)? {
        out.push(("Operator peak RSS against nodes".to_string(), file));
    }
    Ok(out)
}

fn log_range(values: impl Iterator<Item = f64>) -> Option<std::ops::Range<f64>> {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for v in values.filter(|v| v.is_finite() && *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return None;
    }
    // At least a decade, so a log axis always has labelled ticks.
    let (lo, hi) = (lo / 1.6, hi * 1.6);
    if hi / lo >= 10.0 {
        return Some(lo..hi);
    }
    let widen = (10.0 / (hi / lo)).sqrt();
    Some(lo / widen..hi * widen)
}

/// Tick labels of a log axis at 1, 2 and 5 times a power of ten only (the
/// others crowd each other).
fn log_label(v: &f64) -> String {
    let exp = v.log10().floor();
    let lead = v / 10f64.powf(exp);
    if [1.0, 2.0, 5.0].iter().any(|d| (lead - d).abs() < 0.05) {
        format!("{v:.0}")
    } else {
        String::new()
    }
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn rollout_time(path: &Path, r: &Results) -> anyhow::Result<bool> {
    // (label, points) per series.
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut add = |label: String, x: f64, y: f64| match series.iter_mut().find(|(l, _)| *l == label)
    {
        Some((_, pts)) => pts.push((x, y)),
        None => series.push((label, vec![(x, y)])),
    };
    for s in &r.sizes {
        for (native, sr) in pairs(s) {
            let k = &native.max_unavailable;
            add(
                format!("native RollingUpdate, maxUnavailable {k}"),
                s.nodes as f64,
                native.daemonset_complete_secs,
            );
            if let Some(t) = crate::report::net(sr) {
                add(
                    format!("saferollout (100% stage, net of soak), maxUnavailable {k}"),
                    s.nodes as f64,
                    t,
                );
            }
        }
    }
    if series.is_empty() {
        return Ok(false);
    }
    let xs = log_range(series.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x))).context("x")?;
    let ys = log_range(series.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y))).context("y")?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Rollout wall time: saferollout vs native DaemonSet",
            ("sans-serif", 26),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(xs.log_scale(), ys.log_scale())?;
    chart
        .configure_mesh()
        .x_desc("nodes")
        .y_desc("seconds (template write to done)")
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .x_label_formatter(&log_label)
        .y_label_formatter(&log_label)
        .draw()?;
    for (i, (label, mut pts)) in series.into_iter().enumerate() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = COLORS[i % COLORS.len()];
        let dashed = label.starts_with("native");
        let style = color.stroke_width(if dashed { 2 } else { 3 });
        chart
            .draw_series(LineSeries::new(pts.clone(), style))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 5, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(true)
}

fn reaction(path: &Path, r: &Results) -> anyhow::Result<bool> {
    let sizes: Vec<_> = r
        .sizes
        .iter()
        .filter(|s| s.reaction.iter().any(|f| f.revert.is_some()))
        .collect();
    if sizes.is_empty() {
        return Ok(false);
    }
    let all = sizes
        .iter()
        .flat_map(|s| &s.reaction)
        .flat_map(|f| f.trials.iter().filter_map(|t| t.revert_ms));
    let xs = log_range(all.chain([100.0, 500.0])).context("x")?;
    let root = BitMapBackend::new(path, (SIZE.0, SIZE.1 * sizes.len().div_ceil(2) as u32))
        .into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "Reaction: failing event to the revert write (cumulative share of trials)",
        ("sans-serif", 24),
    )?;
    let cols = sizes.len().min(2);
    let rows = sizes.len().div_ceil(cols);
    let panels = root.split_evenly((rows, cols));
    for (panel, s) in panels.iter().zip(&sizes) {
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{} nodes", s.nodes), ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(xs.clone().log_scale(), 0f64..1.0)?;
        chart
            .configure_mesh()
            .x_desc("ms (log scale)")
            .y_desc("share of trials")
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .x_label_formatter(&log_label)
            .draw()?;
        for (i, f) in s.reaction.iter().filter(|f| f.revert.is_some()).enumerate() {
            let mut v: Vec<f64> = f.trials.iter().filter_map(|t| t.revert_ms).collect();
            v.sort_by(f64::total_cmp);
            let n = v.len() as f64;
            let mut pts = Vec::new();
            for (j, x) in v.iter().enumerate() {
                pts.push((x.max(xs.start), j as f64 / n));
                pts.push((x.max(xs.start), (j + 1) as f64 / n));
            }
            let color = COLORS[i % COLORS.len()];
            let summary = f.revert.expect("filtered");
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(3)))?
                .label(format!(
                    "{} (p50 {:.0} ms, p99 {:.0} ms, n={})",
                    f.fault, summary.p50, summary.p99, summary.count
                ))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                });
        }
        for (target, share, label) in [
            (100.0, 0.5, "target: p50 <= 100 ms"),
            (500.0, 0.99, "target: p99 <= 500 ms"),
        ] {
            let grey = RGBColor(90, 90, 90);
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(target, 0.0), (target, share)],
                    8,
                    5,
                    grey.stroke_width(2),
                ))?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(2))
                });
            chart.draw_series([Circle::new((target, share), 5, grey.filled())])?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(true)
}

fn operator_rss(path: &Path, r: &Results) -> anyhow::Result<bool> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for s in &r.sizes {
        let runs = operator_runs(s);
        let single = runs
            .iter()
            .filter(|o| o.rollouts == 1)
            .map(|o| o.stat.peak_rss_mib)
            .reduce(f64::max);
        let multi = runs
            .iter()
            .filter(|o| o.rollouts > 1)
            .map(|o| (o.rollouts, o.stat.peak_rss_mib))
            .next();
        let mut add = |label: String, y: f64| match series.iter_mut().find(|(l, _)| *l == label) {
            Some((_, pts)) => pts.push((s.nodes as f64, y)),
            None => series.push((label, vec![(s.nodes as f64, y)])),
        };
        if let Some(y) = single {
            add("1 SafeRollout (worst run)".into(), y);
        }
        if let Some((n, y)) = multi {
            add(format!("{n} SafeRollouts"), y);
        }
    }
    if series.is_empty() {
        return Ok(false);
    }
    let xs = log_range(series.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x))).context("x")?;
    let ymax = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .fold(64.0, f64::max)
        * 1.2;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Operator peak RSS (VmHWM)", ("sans-serif", 26))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(xs.clone().log_scale(), 0f64..ymax)?;
    chart
        .configure_mesh()
        .x_desc("nodes")
        .y_desc("MiB")
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .x_label_formatter(&log_label)
        .draw()?;
    for (i, (label, mut pts)) in series.into_iter().enumerate() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 5, color.filled())))?;
    }
    chart
        .draw_series(LineSeries::new(
            vec![(xs.start, 64.0), (xs.end, 64.0)],
            RED.mix(0.6).stroke_width(2),
        ))?
        .label("target 64 MiB")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.mix(0.6)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(true)
}
