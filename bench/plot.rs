//! Learning curves into one SVG: `val_bpb` against tokens, one line per `metrics.jsonl`,
//! plus single points (a swarm's final merged anchors).
//!
//! ```text
//! cargo test --bench plot -- OUT.svg "TITLE" LABEL=RUN_DIR/metrics.jsonl[*N] … [LABEL@TOKENS=BPB …]
//! ```
//! A series is split at its last `=` (labels may hold one). `*N` multiplies a curve's tokens
//! (one swarm peer's file, times the number of peers).
//! With `--x=wall` first, the x axis is wall-clock seconds (`wall_s` of each record; `*N`
//! is ignored, points are at seconds): speed scenarios such as `bench/hetero.sh`.
//! A series `LABEL=pts:X:Y,X:Y,…` is a line through given points (with markers); then
//! `--x-desc TEXT` and `--y-desc TEXT` name the axes (e.g. goodput against MTBF).
//! (`cargo test --bench` runs it without a release rebuild of burn and libp2p.)

use std::path::Path;

use atoll::metrics::{read_jsonl, MetricsRecord};
use plotters::prelude::*;

const COLORS: [RGBColor; 6] = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let wall = args.first().is_some_and(|a| a == "--x=wall");
    if wall {
        args.remove(0);
    }
    let mut x_desc = if wall { "wall-clock seconds" } else { "tokens (all peers)" }.to_owned();
    let mut y_desc = "validation bits per byte".to_owned();
    for (flag, desc) in [("--x-desc", &mut x_desc), ("--y-desc", &mut y_desc)] {
        if let Some(i) = args.iter().position(|a| a == flag) {
            *desc = args.get(i + 1).ok_or(format!("{flag} needs a value"))?.clone();
            args.drain(i..i + 2);
        }
    }
    let mut marked = Vec::new();
    let [out, title, series @ ..] = args.as_slice() else {
        return Err("usage: plot OUT.svg TITLE LABEL=metrics.jsonl … [LABEL@TOKENS=BPB …]".into());
    };
    let mut curves: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut points: Vec<(String, (f64, f64))> = Vec::new();
    for s in series {
        if let Some((label, rest)) = s.split_once('@') {
            let (tokens, bpb) = rest.split_once('=').ok_or(format!("bad point {s:?}"))?;
            points.push((label.to_owned(), (tokens.parse()?, bpb.parse()?)));
        } else {
            let (label, path) = s.rsplit_once('=').ok_or(format!("bad series {s:?}"))?;
            if let Some(pts) = path.strip_prefix("pts:") {
                let mut xy = Vec::new();
                for p in pts.split(',').filter(|p| !p.is_empty()) {
                    let (x, y) = p.split_once(':').ok_or(format!("bad point {p:?} in {s:?}"))?;
                    xy.push((x.parse()?, y.parse()?));
                }
                marked.push(curves.len());
                curves.push((label.to_owned(), xy));
                continue;
            }
            let (path, times) = match path.rsplit_once('*') {
                Some((p, n)) => (p, n.parse::<f64>()?),
                None => (path, 1.0),
            };
            let records: Vec<MetricsRecord> = read_jsonl(Path::new(path))?;
            let x = |r: &MetricsRecord| if wall { r.wall_s } else { r.tokens as f64 * times };
            let xy = records.iter().map(|r| (x(r), r.val_bpb)).collect();
            curves.push((label.to_owned(), xy));
        }
    }
    let all = curves.iter().flat_map(|(_, c)| c.iter().copied()).chain(points.iter().map(|p| p.1));
    let (mut x_max, mut y_min, mut y_max) = (1.0f64, f64::INFINITY, f64::NEG_INFINITY);
    for (x, y) in all {
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if !y_min.is_finite() {
        return Err("nothing to plot".into());
    }
    let pad = ((y_max - y_min) * 0.05).max(0.01);
    let root = SVGBackend::new(out, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max * 1.02, (y_min - pad)..(y_max + pad))?;
    chart.configure_mesh().x_desc(x_desc.as_str()).y_desc(y_desc.as_str()).draw()?;
    for (i, (label, xy)) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(xy.iter().copied(), color.stroke_width(2)))?
            .label(label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        if marked.contains(&i) {
            chart.draw_series(xy.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
    }
    for (i, (label, xy)) in points.iter().enumerate() {
        let color = COLORS[(curves.len() + i) % COLORS.len()];
        chart
            .draw_series(std::iter::once(Circle::new(*xy, 6, color.filled())))?
            .label(label.as_str())
            .legend(move |(x, y)| Circle::new((x + 9, y), 5, color.filled()));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    println!("wrote {out}");
    Ok(())
}
