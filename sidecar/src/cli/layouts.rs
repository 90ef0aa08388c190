//! `smartmig layouts`: print the layouts of a GPU model.

use std::io::Write;

use serde::Serialize;

use crate::mig::{Geometry, GpuModel, InstanceDesc, Layout};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// GPU model: a30-24gb, a100-40gb, a100-80gb, h100-80gb, h100-94gb,
    /// h200-141gb, b200-180gb, gb200-186gb, b300-288gb, gb300-288gb,
    /// rtx-pro-6000-96gb, rtx-pro-5000-48gb (or a family naming one: b200).
    #[arg(long, default_value = "a100-40gb")]
    pub gpu: GpuModel,
    /// Only the maximal layouts (no instance can be added).
    #[arg(long, conflicts_with = "catalog")]
    pub maximal: bool,
    /// Only the catalog (the policies' action space).
    #[arg(long)]
    pub catalog: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
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
    let g = Geometry::of(args.gpu);
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
    let mut out = std::io::stdout().lock();
    if args.json {
        let listing = Listing {
            model: args.gpu,
            kind,
            count: rows.len(),
            layouts: rows,
        };
        serde_json::to_writer_pretty(&mut out, &listing)?;
        writeln!(out)?;
        return Ok(());
    }
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
    for row in &rows {
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
