//! `smartmig layouts`: print the layouts of a GPU model.

use std::io::Write;

use serde::Serialize;

use super::args::{GpuModelArg, JsonArg};
use crate::mig::{Geometry, GpuModel, InstanceDesc, Layout};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub gpu: GpuModelArg,
    /// Only the maximal layouts (no instance can be added).
    #[arg(long, conflicts_with = "catalog")]
    pub maximal: bool,
    /// Only the catalog (the policies' action space).
    #[arg(long)]
    pub catalog: bool,
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Serialize)]
struct LayoutRow {
    index: usize,
    picture: String,
    compute_used: u8,
    instances: Vec<InstanceDesc>,
}

#[derive(Serialize)]
struct Listing {
    model: GpuModel,
    kind: &'static str,
    count: usize,
    layouts: Vec<LayoutRow>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let g = Geometry::of(args.gpu.gpu_model);
    let (kind, layouts): (&str, &[Layout]) = if args.maximal {
        ("maximal", g.maximal())
    } else if args.catalog {
        ("catalog", g.catalog())
    } else {
        ("all", g.layouts())
    };
    let rows: Vec<LayoutRow> = layouts
        .iter()
        .enumerate()
        .map(|(index, &l)| LayoutRow {
            index,
            picture: g.picture(l),
            compute_used: g.compute_used(l),
            instances: g.describe(l),
        })
        .collect();
    if !args.json.to_stdout() {
        print_table(g, kind, &rows)?;
    }
    args.json.write(&Listing {
        model: args.gpu.gpu_model,
        kind,
        count: rows.len(),
        layouts: rows,
    })
}

fn print_table(g: &Geometry, kind: &str, rows: &[LayoutRow]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} layouts of {} ({} memory slots, {} compute slices): {}",
        kind,
        g.spec.display,
        g.spec.memory_slices,
        g.spec.compute_slices,
        rows.len()
    )?;
    let sources = g.spec.sources;
    for (what, p) in [
        ("profiles", sources.profiles),
        ("ids", sources.ids),
        ("placements", sources.placements),
    ] {
        if !p.confirmed() {
            writeln!(out, "{what}: {}: {}", p.label(), p.text())?;
        }
    }
    writeln!(out, "slot picture: digit = compute slices of the instance on that memory slot, | = boundary, . = free")?;
    writeln!(
        out,
        "{:>4}  {:<17} {:>7}  instances",
        "#", "slots", "compute"
    )?;
    for row in rows {
        let names: Vec<String> = row.instances.iter().map(ToString::to_string).collect();
        writeln!(
            out,
            "{:>4}  {:<17} {:>5}/{}  {}",
            row.index,
            row.picture,
            row.compute_used,
            g.spec.compute_slices,
            names.join(" ")
        )?;
    }
    Ok(())
}
