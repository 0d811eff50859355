//! SVG charts (plotters, SVG backend only): throughput by depth per engine,
//! and latency CDFs per regime and depth.

use crate::report::{Cell, Report};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    C[i % C.len()]
}

fn err<E: std::fmt::Display>(e: E) -> String {
    format!("chart: {e}")
}

/// Draws `pts` as a line of colour `col`, named `label` in the legend.
fn labelled_line<'a, CT>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    pts: Vec<(f64, f64)>,
    label: &str,
    col: RGBColor,
) -> Result<(), String>
where
    CT: CoordTranslate<From = (f64, f64)>,
{
    chart
        .draw_series(LineSeries::new(pts, col.stroke_width(2)))
        .map_err(err)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
    Ok(())
}

/// Draws the legend (upper left) and writes the file.
fn legend_and_present<'a, CT: CoordTranslate>(
    mut chart: ChartContext<'a, SVGBackend<'a>, CT>,
    root: &DrawingArea<SVGBackend<'a>, Shift>,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// Writes every chart into `dir`; returns the file names written.
pub fn write_all(r: &Report, dir: &Path) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for &regime in &r.info.regimes {
        let cells: Vec<&Cell> = r
            .cells
            .iter()
            .filter(|c| c.regime == regime && c.ok() && c.reads > 0)
            .collect();
        if cells.is_empty() {
            continue;
        }
        let name = format!("throughput-{}.svg", regime.name());
        throughput(r, &cells, &dir.join(&name), regime.name())?;
        names.push(name);
        for &depth in &r.info.depths {
            let at: Vec<&Cell> = cells.iter().copied().filter(|c| c.depth == depth).collect();
            if at.is_empty() {
                continue;
            }
            let name = format!("latency-{}-depth{depth}.svg", regime.name());
            latency_cdf(
                r,
                &at,
                &dir.join(&name),
                &format!("{} depth {depth}", regime.name()),
            )?;
            names.push(name);
        }
    }
    Ok(names)
}

fn throughput(r: &Report, cells: &[&Cell], path: &Path, regime: &str) -> Result<(), String> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let dmin = *r.info.depths.iter().min().unwrap_or(&1) as f64;
    let dmax = (*r.info.depths.iter().max().unwrap_or(&1) as f64).max(dmin * 2.0);
    let ymax = cells.iter().map(|c| c.reads_per_sec).fold(0.0, f64::max) * 1.15 + 1.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("random 4 KiB reads, {regime}: reads/s by reads in flight"),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (dmin / 1.3..dmax * 1.3)
                .log_scale()
                .with_key_points(r.info.depths.iter().map(|&d| d as f64).collect::<Vec<_>>()),
            0.0..ymax,
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("reads in flight (log scale)")
        .y_desc("reads/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| crate::report::rate(*y))
        .draw()
        .map_err(err)?;
    for (i, e) in r.info.engines.iter().enumerate() {
        let mut pts: Vec<(f64, f64)> = cells
            .iter()
            .filter(|c| &c.engine == e)
            .map(|c| (c.depth as f64, c.reads_per_sec))
            .collect();
        if pts.is_empty() {
            continue;
        }
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let col = color(i);
        labelled_line(&mut chart, pts.clone(), e, col)?;
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, col.filled())))
            .map_err(err)?;
    }
    legend_and_present(chart, &root)
}

/// y = number of nines of the quantile: 1 = p90, 2 = p99, 3 = p99.9 ...
fn nines(q: f64) -> f64 {
    (-(1.0 - q).max(1e-6).log10()).min(6.0)
}

fn latency_cdf(r: &Report, cells: &[&Cell], path: &Path, what: &str) -> Result<(), String> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let pts = cells
        .iter()
        .flat_map(|c| c.cdf.iter().map(|p| p.0))
        .filter(|&x| x > 0.0);
    let xmin = pts.clone().fold(f64::INFINITY, f64::min).max(0.05);
    let xmax = pts.fold(0.0, f64::max).max(xmin * 10.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("latency CDF, {what} (tail stretched)"),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((xmin / 1.2..xmax * 1.2).log_scale(), 0.0..5.5)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency, µs (log scale)")
        .y_desc("percentile")
        .y_labels(12)
        .y_label_formatter(&|y: &f64| match (*y * 2.0).round() as i64 {
            0 => "p0".into(),
            1 => "p68".into(),
            2 => "p90".into(),
            4 => "p99".into(),
            6 => "p99.9".into(),
            8 => "p99.99".into(),
            10 => "p99.999".into(),
            _ => String::new(),
        })
        .x_label_formatter(&|x| {
            if *x >= 1000.0 {
                format!("{:.0}ms", x / 1000.0)
            } else if *x < 1.0 {
                format!("{x:.1}")
            } else {
                format!("{x:.0}")
            }
        })
        .draw()
        .map_err(err)?;
    for c in cells {
        let i = r
            .info
            .engines
            .iter()
            .position(|e| e == &c.engine)
            .unwrap_or(0);
        let col = color(i);
        let line: Vec<(f64, f64)> = c
            .cdf
            .iter()
            .filter(|p| p.0 > 0.0)
            .map(|&(x, q)| (x, nines(q)))
            .collect();
        labelled_line(&mut chart, line, &c.engine, col)?;
    }
    legend_and_present(chart, &root)
}

/// A horizontal bar chart of GB/s per method (`uring-bench lines`).
pub fn bars(rows: &[(String, f64)], path: &Path, regime: &str) -> Result<(), String> {
    let h = 60 + 28 * rows.len() as u32;
    let root = SVGBackend::new(path, (900, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let max = rows.iter().map(|r| r.1).fold(0.1, f64::max) * 1.1;
    let n = rows.len() as i32;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("lines: GB/s per method ({regime})"),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(250)
        .build_cartesian_2d(0.0..max, 0..n)
        .map_err(err)?;
    let labels: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("GB/s")
        .y_labels(rows.len().max(1))
        .y_label_formatter(&|y| {
            usize::try_from(n - 1 - *y)
                .ok()
                .and_then(|i| labels.get(i).cloned())
                .unwrap_or_default()
        })
        .draw()
        .map_err(err)?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, (name, g))| {
            let y = n - 1 - i as i32;
            let col = color(
                usize::from(name.starts_with("scan"))
                    + 2 * usize::from(name.starts_with("fio") || name.starts_with("wc")),
            );
            Rectangle::new([(0.0, y), (*g, y + 1)], col.filled())
        }))
        .map_err(err)?;
    root.present().map_err(err)
}
