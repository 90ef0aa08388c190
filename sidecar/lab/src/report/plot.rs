//! SVG plots of a comparison (plotters, SVG backend only: no fonts or
//! bitmaps to install). Each function returns the SVG text; the CLI writes
//! the files, so plotting is testable without a file system.

use plotters::prelude::*;

use super::series::TimeSeries;
use super::ReportError;

const SIZE: (u32, u32) = (960, 540);

/// Colours of the policies, in the order of the comparison.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn plot_err<E: std::fmt::Debug>(e: E) -> ReportError {
    ReportError::Plot(format!("{e:?}"))
}

/// Bin centres in hours.
fn hours(s: &TimeSeries) -> impl Iterator<Item = f64> + '_ {
    s.start_s
        .iter()
        .zip(&s.bin_len_s)
        .map(|(a, l)| (a + l / 2.0) / 3600.0)
}

/// One line per run of `pick(series)` over the hours of the run.
pub fn lines(
    title: &str,
    y_label: &str,
    runs: &[(String, &TimeSeries)],
    pick: &dyn Fn(&TimeSeries) -> Vec<f64>,
) -> Result<String, ReportError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let x_max = runs
            .iter()
            .map(|(_, s)| s.horizon_s / 3600.0)
            .fold(1.0_f64, f64::max);
        let y_max = runs
            .iter()
            .flat_map(|(_, s)| pick(s))
            .fold(0.0_f64, f64::max)
            .max(1e-9)
            * 1.08;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("hours since start")
            .y_desc(y_label)
            .draw()
            .map_err(plot_err)?;
        for (i, (name, s)) in runs.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let ys = pick(s);
            chart
                .draw_series(LineSeries::new(hours(s).zip(ys), color.stroke_width(2)))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// Stacked areas: how many GPUs are in each layout over time.
pub fn layout_mix(title: &str, s: &TimeSeries, gpus: usize) -> Result<String, ReportError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let x_max = (s.horizon_s / 3600.0).max(1e-9);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max, 0.0..(gpus.max(1) as f64 * 1.02))
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("hours since start")
            .y_desc("GPUs in the layout")
            .draw()
            .map_err(plot_err)?;
        // Cumulative sums, drawn from the top band down so each band shows.
        let bins = s.start_s.len();
        let mut cumulative: Vec<Vec<f64>> = Vec::with_capacity(s.layouts.len());
        let mut acc = vec![0.0; bins];
        for (_, v) in &s.layouts {
            acc.iter_mut().zip(v).for_each(|(a, x)| *a += x);
            cumulative.push(acc.clone());
        }
        for (i, ((name, _), top)) in s.layouts.iter().zip(&cumulative).enumerate().rev() {
            let color = PALETTE[i % PALETTE.len()];
            // Step shape: each bin is flat over its width.
            let pts: Vec<(f64, f64)> = s
                .start_s
                .iter()
                .zip(&s.bin_len_s)
                .zip(top)
                .flat_map(|((a, l), y)| [(a / 3600.0, *y), ((a + l) / 3600.0, *y)])
                .collect();
            chart
                .draw_series(AreaSeries::new(pts, 0.0, color.mix(0.85)).border_style(color))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// Horizontal bars, one per `(label, value, colour index)` from the top
/// (the colour is `PALETTE[index]`, so a row keeps its line plots' colour).
pub fn bars(
    title: &str,
    x_label: &str,
    values: &[(String, f64, usize)],
) -> Result<String, ReportError> {
    let mut svg = String::new();
    {
        let n = values.len().max(1);
        let height = 120 + 40 * u32::try_from(n).unwrap_or(u32::MAX / 64);
        let root = SVGBackend::with_string(&mut svg, (SIZE.0, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let x_max = values
            .iter()
            .map(|v| v.1)
            .filter(|v| v.is_finite())
            .fold(0.0_f64, f64::max)
            .max(1e-9)
            * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(200)
            .build_cartesian_2d(0.0..x_max, (0..n).into_segmented())
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc(x_label)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => {
                    values.get(*i).map(|b| b.0.clone()).unwrap_or_default()
                }
                _ => String::new(),
            })
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(values.iter().enumerate().map(|(i, (_, v, c))| {
                Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (v.max(0.0), SegmentValue::Exact(i + 1)),
                    ],
                    PALETTE[c % PALETTE.len()].filled(),
                )
            }))
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}
