//! SVG charts for the HTML report, drawn with plotters' SVG backend (no fonts needed: the
//! browser lays the text out).

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::trace::format_time;

const WIDTH: u32 = 920;
const HEIGHT: u32 = 300;
const ALLOWED: RGBColor = RGBColor(46, 125, 50);
const LIMITED: RGBColor = RGBColor(198, 40, 40);
/// Colours for series drawn side by side, in order.
pub const PALETTE: [RGBColor; 7] = [
    RGBColor(198, 40, 40),
    RGBColor(21, 101, 192),
    RGBColor(46, 125, 50),
    RGBColor(239, 108, 0),
    RGBColor(106, 27, 154),
    RGBColor(0, 131, 143),
    RGBColor(93, 64, 55),
];

fn svg(draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String>) -> String {
    let mut out = String::new();
    let result = {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| e.to_string())
            .and_then(|()| draw(&root))
            .and_then(|()| root.present().map_err(|e| e.to_string()))
    };
    match result {
        Ok(()) => out,
        Err(e) => format!(
            "<p class=\"note\">chart not drawn: {}</p>",
            super::markup::escape(&e)
        ),
    }
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A titled chart over `x` and `y`, with room for labels.
fn frame<'a, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    title: &str,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    y_label_width: u32,
) -> Result<Chart<'a, DB>, String> {
    ChartBuilder::on(root)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(y_label_width)
        .build_cartesian_2d(x, y)
        .map_err(|e| e.to_string())
}

/// The series' legend, boxed, at `position`.
fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(|e| e.to_string())
}

/// A time axis label: the time of day, or the date and hour for long spans.
fn time_label(start_us: i64, seconds: f64, long: bool) -> String {
    let text = format_time(start_us + (seconds * 1e6) as i64);
    match (text.get(11..19), text.get(5..13)) {
        (Some(_), Some(date_hour)) if long => format!("{}h", date_hour.replace('T', " ")),
        (Some(time), _) => time.to_owned(),
        _ => text,
    }
}

/// The time of day to the millisecond (UTC), without trailing zeros.
fn clock(time_us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(time_us).map_or_else(String::new, |t| {
        t.format("%H:%M:%S%.3f")
            .to_string()
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_owned()
    })
}

/// Admitted and limited requests per step, stacked.
pub fn allowed_and_limited(
    title: &str,
    start_us: i64,
    step_ms: u64,
    allowed: &[u64],
    limited: &[u64],
) -> String {
    let step_s = step_ms as f64 / 1000.0;
    let span = (allowed.len().max(1) as f64) * step_s;
    let top = allowed
        .iter()
        .zip(limited)
        .map(|(a, l)| a + l)
        .max()
        .unwrap_or(0)
        .max(1) as f64
        * 1.1;
    let long = span > 2.0 * 86_400.0;
    svg(|root| {
        let mut chart = frame(root, title, 0f64..span, 0f64..top, 50)?;
        chart
            .configure_mesh()
            .x_labels(8)
            .x_label_formatter(&|x| time_label(start_us, *x, long))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .y_desc(format!("requests per {}", super::tables::period(step_ms)))
            .draw()
            .map_err(|e| e.to_string())?;
        let steps = |values: &[u64], base: &[u64]| -> Vec<(f64, f64)> {
            values
                .iter()
                .zip(base)
                .enumerate()
                .flat_map(|(i, (v, b))| {
                    let y = (v + b) as f64;
                    [(i as f64 * step_s, y), ((i + 1) as f64 * step_s, y)]
                })
                .collect()
        };
        let zeros = vec![0; allowed.len()];
        chart
            .draw_series(AreaSeries::new(
                steps(limited, allowed),
                0.0,
                LIMITED.mix(0.8),
            ))
            .map_err(|e| e.to_string())?
            .label("limited")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], LIMITED.filled()));
        chart
            .draw_series(AreaSeries::new(
                steps(allowed, &zeros),
                0.0,
                ALLOWED.mix(0.8),
            ))
            .map_err(|e| e.to_string())?
            .label("admitted")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], ALLOWED.filled()));
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
}

/// Axes for bars over `categories`, one unit wide each, named at their centres.
fn category_axes<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    categories: &[String],
    y_desc: &str,
) -> Result<(), String> {
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(categories.len().max(1) * 2 + 1)
        .x_label_formatter(&|x| {
            let centre = x - x.floor();
            if (centre - 0.5).abs() < 0.01 {
                categories
                    .get(x.floor() as usize)
                    .cloned()
                    .unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y:.0}"))
        .y_desc(y_desc)
        .draw()
        .map_err(|e| e.to_string())
}

/// Bars per category, one bar per group side by side.
pub fn grouped_bars(title: &str, categories: &[String], groups: &[(&str, Vec<u64>)]) -> String {
    let top = groups
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1) as f64
        * 1.15;
    let n = categories.len().max(1);
    let width = 0.8 / groups.len().max(1) as f64;
    svg(|root| {
        let mut chart = frame(root, title, 0f64..n as f64, 0f64..top, 60)?;
        category_axes(&mut chart, categories, "requests")?;
        for (g, (label, values)) in groups.iter().enumerate() {
            let colour = PALETTE[g % PALETTE.len()];
            chart
                .draw_series(values.iter().enumerate().map(|(c, v)| {
                    let x0 = c as f64 + 0.1 + g as f64 * width;
                    Rectangle::new([(x0, 0.0), (x0 + width * 0.9, *v as f64)], colour.filled())
                }))
                .map_err(|e| e.to_string())?
                .label(*label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled())
                });
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
}

/// One bar of [`stacked_bars`]: its segments, bottom up, as (label, value per category).
pub struct Stack<'a> {
    /// The segments; a label drawn in several stacks gets one colour and one legend entry.
    pub segments: Vec<(&'a str, Vec<f64>)>,
}

/// Stacked bars per category, one bar per stack side by side, in the stacks' order.
pub fn stacked_bars(title: &str, y_desc: &str, categories: &[String], stacks: &[Stack]) -> String {
    let top = stacks
        .iter()
        .flat_map(|stack| {
            (0..categories.len())
                .map(move |c| stack.segments.iter().filter_map(|(_, v)| v.get(c)).sum())
        })
        .fold(1.0f64, f64::max)
        // Room above the tallest bar for the legend.
        * 1.3;
    let n = categories.len().max(1);
    let width = 0.8 / stacks.len().max(1) as f64;
    svg(|root| {
        let mut chart = frame(root, title, 0f64..n as f64, 0f64..top, 60)?;
        category_axes(&mut chart, categories, y_desc)?;
        // Labels in the order first drawn: each one's colour and legend entry.
        let mut labels: Vec<&str> = Vec::new();
        for (g, stack) in stacks.iter().enumerate() {
            let mut base = vec![0.0; n];
            for (label, values) in &stack.segments {
                let seen = labels.iter().position(|l| l == label);
                let fill = PALETTE[seen.unwrap_or(labels.len()) % PALETTE.len()];
                let bars = values.iter().enumerate().take(n).map(|(c, v)| {
                    let x0 = c as f64 + 0.1 + g as f64 * width;
                    let bar = Rectangle::new(
                        [(x0, base[c]), (x0 + width * 0.9, base[c] + v)],
                        fill.filled(),
                    );
                    base[c] += v;
                    bar
                });
                let drawn = chart.draw_series(bars).map_err(|e| e.to_string())?;
                if seen.is_none() {
                    labels.push(label);
                    drawn.label(*label).legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 14, y + 5)], fill.filled())
                    });
                }
            }
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
}

/// Step lines over time (x in µs since the epoch), with a dashed level for reference.
pub fn step_lines(
    title: &str,
    y_desc: &str,
    series: &[(String, Vec<(i64, u64)>)],
    level: Option<(&str, u64)>,
    from_us: i64,
    to_us: i64,
) -> String {
    let span = ((to_us - from_us).max(1)) as f64 / 1e6;
    let top = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|p| p.1))
        .chain(level.map(|l| l.1))
        .max()
        .unwrap_or(0)
        .max(1) as f64
        * 1.15;
    svg(|root| {
        let mut chart = frame(root, title, 0f64..span, 0f64..top, 50)?;
        chart
            .configure_mesh()
            .x_labels(8)
            .x_label_formatter(&|x| clock(from_us + (x * 1e6) as i64))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .y_desc(y_desc)
            .draw()
            .map_err(|e| e.to_string())?;
        if let Some((label, value)) = level {
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, value as f64), (span, value as f64)],
                    6,
                    4,
                    BLACK.stroke_width(1),
                ))
                .map_err(|e| e.to_string())?
                .label(label)
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLACK));
        }
        for (i, (label, points)) in series.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            let mut path = Vec::with_capacity(points.len() * 2);
            let mut last = 0.0;
            for &(t, v) in points {
                let x = (t - from_us) as f64 / 1e6;
                path.push((x, last));
                path.push((x, v as f64));
                last = v as f64;
            }
            path.push((span, last));
            chart
                .draw_series(LineSeries::new(path, colour.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 14, y)], colour.stroke_width(2))
                });
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(c: RGBColor) -> String {
        format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2)
    }

    #[test]
    fn stacked_bars_draw_every_segment_and_give_a_shared_label_one_colour() {
        let categories = vec!["16".to_owned(), "32".to_owned()];
        let stacks = [
            Stack {
                segments: vec![
                    ("client", vec![9.0, 8.0]),
                    ("server", vec![19.0, 16.0]),
                    ("Redis", vec![14.0, 12.0]),
                ],
            },
            Stack {
                segments: vec![
                    ("redis-benchmark", vec![12.0, 12.0]),
                    ("Redis", vec![19.0, 18.0]),
                ],
            },
        ];
        let svg = stacked_bars("CPU a decision", "µs", &categories, &stacks);
        assert!(svg.starts_with("<svg"), "{svg}");
        for label in ["client", "server", "Redis", "redis-benchmark"] {
            assert_eq!(
                svg.matches(&format!("\n{label}\n")).count(),
                1,
                "{label} in the legend"
            );
        }
        // Each segment's bar per category, and one legend swatch; Redis's colour in both stacks.
        let rects = |c: RGBColor| -> Vec<[f64; 4]> {
            svg.lines()
                .filter(|l| l.starts_with("<rect") && l.contains(&fill(c)))
                .map(|l| {
                    ["x", "y", "width", "height"].map(|a| {
                        let (_, rest) = l.split_once(&format!(" {a}=\"")).unwrap();
                        rest.split('"').next().unwrap().parse().unwrap()
                    })
                })
                .collect()
        };
        let (client, server) = (rects(PALETTE[0]), rects(PALETTE[1]));
        assert_eq!(client.len(), 2 + 1);
        assert_eq!(server.len(), 2 + 1);
        assert_eq!(rects(PALETTE[2]).len(), 2 * 2 + 1, "Redis");
        assert_eq!(rects(PALETTE[3]).len(), 2 + 1, "redis-benchmark");
        // The server's segment sits on the client's, as tall as 19 is to 9.
        let [cx, cy, _, ch] = client[0];
        let [sx, sy, _, sh] = server[0];
        assert_eq!(sx, cx);
        assert!(
            (sy + sh - cy).abs() <= 1.0,
            "server {server:?} on client {client:?}"
        );
        assert!((sh / ch - 19.0 / 9.0).abs() < 0.1, "heights {sh} and {ch}");
    }
}
