//! `--plot FILE.svg`: throughput and the outcome mix over time, and the latency distribution.

use std::path::Path;

use plotters::prelude::*;

use crate::summary::Summary;

const FONT: &str = "sans-serif";

/// Draws `summary` into an SVG file at `path`.
///
/// # Errors
/// The drawing library's message (the file could not be written).
pub fn draw(summary: &Summary, path: &Path) -> Result<(), String> {
    draw_inner(summary, path).map_err(|e| format!("cannot draw {}: {e}", path.display()))
}

fn draw_inner(s: &Summary, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1000, 1050)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!(
            "idem-storm: {} store, {} mode — {} requests, {:.1} % duplicates, {} concurrent, double executions: {}",
            s.store,
            s.mode,
            s.requests,
            s.duplicate_rate * 100.0,
            s.concurrency,
            s.double_executions
        ),
        (FONT, 18),
    )?;
    let panels = root.split_evenly((3, 1));
    let end = s
        .timeline
        .last()
        .map_or(1.0, |l| l.at_s + l.width_s)
        .max(1e-3);

    // Throughput: requests started per second, per slice.
    let rate = |sl: &crate::summary::Slice| {
        (sl.executed + sl.replayed + sl.in_progress + sl.faulted + sl.errors) as f64 / sl.width_s
    };
    let top = s.timeline.iter().map(rate).fold(1.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&panels[0])
        .caption("Throughput", (FONT, 16))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..end, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("requests/s")
        .draw()?;
    chart.draw_series(LineSeries::new(
        s.timeline
            .iter()
            .map(|sl| (sl.at_s + sl.width_s / 2.0, rate(sl))),
        BLUE.stroke_width(2),
    ))?;

    // Outcome mix: each outcome's share of the requests that started in a slice, stacked.
    let mut chart = ChartBuilder::on(&panels[1])
        .caption("Outcome mix", (FONT, 16))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..end, 0.0..100.0)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("% of requests")
        .draw()?;
    type Part = fn(&crate::summary::Slice) -> u64;
    let layers: [(&str, RGBColor, Part); 5] = [
        ("executed", RGBColor(46, 125, 50), |sl| sl.executed),
        ("replayed", RGBColor(33, 150, 243), |sl| sl.replayed),
        ("in progress", RGBColor(255, 179, 0), |sl| sl.in_progress),
        ("faults, lease lost", RGBColor(142, 36, 170), |sl| {
            sl.faulted
        }),
        ("errors", RGBColor(211, 47, 47), |sl| sl.errors),
    ];
    // Draw the highest cumulative layer first so lower ones paint over it.
    for upto in (0..layers.len()).rev() {
        let (name, color, _) = layers[upto];
        let points: Vec<(f64, f64)> = s
            .timeline
            .iter()
            .map(|sl| {
                let total = rate(sl) * sl.width_s;
                let below: u64 = layers[..=upto].iter().map(|(_, _, part)| part(sl)).sum();
                let share = if total > 0.0 {
                    below as f64 * 100.0 / total
                } else {
                    0.0
                };
                (sl.at_s + sl.width_s / 2.0, share)
            })
            .collect();
        chart
            .draw_series(AreaSeries::new(points, 0.0, color.mix(0.85)).border_style(color))?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;

    // Latency distribution: a histogram up to the 99.9th percentile (the rest in the last bar).
    let lat = &s.latencies_us;
    let edge_us = lat
        .get(((lat.len().max(1) - 1) as f64 * 0.999) as usize)
        .copied()
        .unwrap_or(1)
        .max(1);
    const BINS: usize = 60;
    let width_ms = edge_us as f64 / 1000.0 / BINS as f64;
    let mut counts = [0u64; BINS];
    for &l in lat {
        let bin = ((l as f64 / 1000.0) / width_ms) as usize;
        counts[bin.min(BINS - 1)] += 1;
    }
    let peak = counts.iter().copied().max().unwrap_or(1).max(1) as f64 * 1.1;
    let mut chart = ChartBuilder::on(&panels[2])
        .caption(
            format!(
                "Latency: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                s.p50_ms, s.p99_ms, s.max_ms
            ),
            (FONT, 16),
        )
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..width_ms * BINS as f64, 0.0..peak)?;
    chart
        .configure_mesh()
        .x_desc("milliseconds")
        .y_desc("requests")
        .draw()?;
    chart.draw_series(counts.iter().enumerate().map(|(i, &n)| {
        let x0 = i as f64 * width_ms;
        Rectangle::new(
            [(x0, 0.0), (x0 + width_ms * 0.9, n as f64)],
            RGBColor(46, 125, 50).filled(),
        )
    }))?;
    root.present()?;
    Ok(())
}
