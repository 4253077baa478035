//! rates.png and latencies.png, drawn with plotters into an RGB buffer and written as PNG.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::register_font;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::LoadtestError;
use crate::profile::Expected;
use crate::report::{Grade, Latencies, Report};

/// DejaVu Sans, bundled so charts have text on machines without fonts (license beside it).
static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

fn ensure_font() -> Result<(), String> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err("the bundled font cannot be read".into())
    }
}

/// The label of a profile on an axis: the account without its domain.
fn short(name: &str) -> &str {
    name.split_once('@').map_or(name, |(local, _)| local)
}

/// The smallest power of ten at or above `v`.
fn decade_above(v: f64) -> f64 {
    10f64.powf(v.log10().ceil())
}

/// The largest power of ten at or below `v`.
fn decade_below(v: f64) -> f64 {
    10f64.powf(v.log10().floor())
}

/// Compact numbers for labels: 0.1, 12, 1.5k, 2M.
fn compact(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.3}M", v / 1e6).replace(".000M", "M")
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3).replace(".0k", "k")
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Draws into an RGB buffer with `draw`, then writes it as PNG to `path`.
fn render(
    path: &Path,
    (width, height): (u32, u32),
    draw: impl FnOnce(DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>) -> DrawResult,
) -> Result<(), LoadtestError> {
    let chart_error = |reason: String| LoadtestError::Chart {
        path: path.to_path_buf(),
        reason,
    };
    ensure_font().map_err(chart_error)?;
    let mut pixels = vec![0u8; width as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| chart_error(e.to_string()))?;
        draw(root.clone()).map_err(|e| chart_error(e.to_string()))?;
        root.present().map_err(|e| chart_error(e.to_string()))?;
    }
    let write_error = |e: std::io::Error| LoadtestError::Write {
        path: path.to_path_buf(),
        source: e,
    };
    let file = File::create(path).map_err(write_error)?;
    let mut encoder = png::Encoder::new(BufWriter::new(file), width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder
        .write_header()
        .map_err(|e| chart_error(format!("PNG encoding: {e}")))?;
    writer
        .write_image_data(&pixels)
        .map_err(|e| chart_error(format!("PNG encoding: {e}")))?;
    writer
        .finish()
        .map_err(|e| chart_error(format!("PNG encoding: {e}")))
}

/// Allowed (steady) and denied requests per second for each profile, on a log scale, with
/// the expected rate marked.
pub(crate) fn rates(report: &Report, path: &Path) -> Result<(), LoadtestError> {
    struct Bar {
        label: String,
        allowed: f64,
        denied: f64,
        expected: Option<f64>,
        verdict: Grade,
    }
    let bars: Vec<Bar> = report
        .profiles
        .iter()
        .map(|p| {
            let rows = report.rows.iter().filter(|r| r.profile == p.profile);
            let (denied, secs) = rows.fold((0u64, 0f64), |(d, s), r| {
                (d + r.denied, s + r.duration.as_secs_f64())
            });
            Bar {
                label: short(&p.profile).to_string(),
                allowed: p.measured,
                denied: if secs > 0.0 { denied as f64 / secs } else { 0.0 },
                expected: match p.expected {
                    Expected::Rate(r) => Some(r),
                    Expected::Unlimited => None,
                },
                verdict: p.verdict,
            }
        })
        .collect();
    let floor = 0.01;
    let top = bars
        .iter()
        .flat_map(|b| [b.allowed, b.denied, b.expected.unwrap_or(0.0)])
        .fold(1.0f64, f64::max);
    let top = decade_above(top * 3.0);
    let n = bars.len().max(1) as f64;
    let trials = report.rows.iter().map(|r| r.trial).max().unwrap_or(0);
    let caption = format!(
        "Allowed (steady window) and denied requests per second, {trials} trial(s) of {:?}",
        report.duration
    );
    render(path, (1200, 640), |root| {
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, (FAMILY, 20))
            .margin(12)
            .x_label_area_size(52)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5f64..n - 0.5, (floor..top).log_scale())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(bars.len() + 1)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    bars.get(i as usize).map(|b| b.label.clone()).unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc("requests per second")
            .y_label_formatter(&|y| compact(*y))
            .label_style((FAMILY, 14))
            .axis_desc_style((FAMILY, 15))
            .draw()?;
        let green = RGBColor(46, 139, 87);
        let red = RGBColor(205, 60, 60);
        let visible = |v: f64| v >= floor;
        chart
            .draw_series(
                bars.iter()
                    .enumerate()
                    .filter(|(_, b)| visible(b.allowed))
                    .map(|(i, b)| {
                        let x = i as f64;
                        Rectangle::new([(x - 0.36, floor), (x - 0.02, b.allowed)], green.filled())
                    }),
            )?
            .label("allowed/s in the steady window")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], green.filled()));
        chart
            .draw_series(
                bars.iter()
                    .enumerate()
                    .filter(|(_, b)| visible(b.denied))
                    .map(|(i, b)| {
                        let x = i as f64;
                        Rectangle::new([(x + 0.02, floor), (x + 0.36, b.denied)], red.filled())
                    }),
            )?
            .label("denied/s")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], red.filled()));
        chart
            .draw_series(bars.iter().enumerate().filter_map(|(i, b)| {
                let e = b.expected.filter(|e| visible(*e))?;
                let x = i as f64;
                Some(PathElement::new(
                    vec![(x - 0.45, e), (x + 0.45, e)],
                    BLACK.stroke_width(3),
                ))
            }))?
            .label("expected/s")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLACK.stroke_width(3)));
        chart.draw_series(
            bars.iter()
                .enumerate()
                .filter(|(_, b)| visible(b.allowed))
                .map(|(i, b)| {
                    Text::new(
                        compact(b.allowed),
                        (i as f64 - 0.36, label_height(b.allowed, b.expected)),
                        (FAMILY, 12).into_font().color(&green),
                    )
                }),
        )?;
        // The verdict under each profile's name, red when it failed.
        for (i, b) in bars.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(i as f64, floor));
            let color = if b.verdict == Grade::Fail {
                red
            } else {
                RGBColor(90, 90, 90)
            };
            let style = (FAMILY, 12)
                .into_font()
                .color(&color)
                .pos(Pos::new(HPos::Center, VPos::Top));
            root.draw(&Text::new(b.verdict.to_string(), (x, y + 26), style))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FAMILY, 14))
            .draw()?;
        Ok(())
    })
}

/// Where a bar's value goes: just above it, or above the expected mark when that is close
/// above the bar (so the two do not overlap).
fn label_height(value: f64, expected: Option<f64>) -> f64 {
    match expected {
        Some(e) if e >= value && e < value * 2.0 => e * 1.3,
        _ => value * 1.3,
    }
}

/// The x position of a percentile on a "nines" axis: 90% at 1, 99% at 2, 99.9% at 3...
fn nines(percentile: f64) -> f64 {
    if percentile >= 100.0 {
        6.0
    } else {
        -(1.0 - percentile / 100.0).log10()
    }
}

/// Latency percentiles for each profile, one panel per trial, log scales.
pub(crate) fn latencies(report: &Report, path: &Path) -> Result<(), LoadtestError> {
    let trials = report.rows.iter().map(|r| r.trial).max().unwrap_or(0).max(1);
    let values = report
        .rows
        .iter()
        .flat_map(|r| r.latency_us.as_array())
        .filter(|v| *v > 0);
    let (low, high) = values.fold((u64::MAX, 0u64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (low, high) = if high == 0 {
        (1.0, 1000.0)
    } else {
        (decade_below(low as f64), decade_above(high as f64 * 1.5))
    };
    let names: Vec<&str> = report.profiles.iter().map(|p| p.profile.as_str()).collect();
    let panel_height = 420;
    render(path, (1200, panel_height * trials), |root| {
        let panels = root.split_evenly((trials as usize, 1));
        for (t, panel) in panels.iter().enumerate() {
            let trial = t as u32 + 1;
            let mut chart = ChartBuilder::on(panel)
                .caption(format!("Latency by percentile, trial {trial}"), (FAMILY, 20))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(-0.1f64..6.2, (low..high).log_scale())?;
            chart
                .configure_mesh()
                .x_labels(7)
                .x_label_formatter(&|x| {
                    const AT: [&str; 7] = ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%", "max"];
                    let i = x.round();
                    if (x - i).abs() < 1e-6 && (0.0..=6.0).contains(&i) {
                        AT[i as usize].to_string()
                    } else {
                        String::new()
                    }
                })
                .x_desc("percentile")
                .y_desc("latency (µs)")
                .y_label_formatter(&|y| compact(*y))
                .label_style((FAMILY, 14))
                .axis_desc_style((FAMILY, 15))
                .draw()?;
            for (i, name) in names.iter().enumerate() {
                let Some(row) = report
                    .rows
                    .iter()
                    .find(|r| r.trial == trial && r.profile == *name)
                else {
                    continue;
                };
                let points: Vec<(f64, f64)> = Latencies::PERCENTILES
                    .iter()
                    .zip(row.latency_us.as_array())
                    .skip(1) // min and p1 sit at the same place
                    .filter(|(_, v)| *v > 0)
                    .map(|(p, v)| (nines(*p), v as f64))
                    .collect();
                let color = Palette99::pick(i).to_rgba();
                chart
                    .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
                    .label(short(name).to_string())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
                chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
            }
            if t == 0 {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::LowerRight)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .label_font((FAMILY, 13))
                    .draw()?;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nines_and_labels() {
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.999) - 5.0).abs() < 1e-6);
        assert_eq!(nines(100.0), 6.0);
        assert_eq!(compact(1500.0), "1.5k");
        assert_eq!(compact(0.1), "0.1");
        assert_eq!(compact(2_000_000.0), "2M");
        assert_eq!(short("alice@example.com"), "alice");
        assert_eq!(decade_above(3.0), 10.0);
        assert_eq!(decade_below(30.0), 10.0);
    }
}
