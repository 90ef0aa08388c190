//! Time series of one run, derived from its event log only.
//!
//! The plots of a comparison are drawn from the same records that
//! `smartmig audit` re-checks (job starts and ends, reconfigurations, the
//! header's initial layouts and power models), not from simulator
//! internals, so anyone holding the event log can recompute every point.
//! The power series integrates to the run's energy (test:
//! `series_integrate_to_the_run_energy`).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::ReportError;
use crate::mig::{Geometry, InstanceDesc, Shape};
use crate::sim::events::{Header, ReconfigRecord, Record};
use crate::workload::gpu_load;

/// Layouts drawn by name in the layout-mix plot; the rest are `other`.
pub const MAX_LAYOUTS: usize = 8;

/// Per-bin means of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TimeSeries {
    /// Width of a bin, s (the last bin may be shorter: see `bin_len_s`).
    pub bin_s: f64,
    /// Start of each bin, s since time 0.
    pub start_s: Vec<f64>,
    /// Length of each bin, s.
    pub bin_len_s: Vec<f64>,
    /// Mean power of the whole cluster over the bin, W.
    pub power_w: Vec<f64>,
    /// Mean number of waiting jobs over the bin.
    pub queue: Vec<f64>,
    /// Mean number of GPUs in each layout over the bin, by layout picture
    /// (the [`MAX_LAYOUTS`] largest by GPU-time, then `other`).
    pub layouts: Vec<(String, Vec<f64>)>,
    /// Run horizon, s.
    pub horizon_s: f64,
}

impl TimeSeries {
    /// `sum power_w * bin_len_s`: the run's energy, J.
    pub fn energy_j(&self) -> f64 {
        self.power_w
            .iter()
            .zip(&self.bin_len_s)
            .map(|(p, l)| p * l)
            .sum()
    }
}

/// Adds `value` over `[a, b)` to the time-weighted bins of `acc`.
fn spread(acc: &mut [f64], bin_s: f64, a: f64, b: f64, value: f64) {
    if b.partial_cmp(&a) != Some(std::cmp::Ordering::Greater) || value == 0.0 || acc.is_empty() {
        return;
    }
    let first = ((a / bin_s).floor().max(0.0) as usize).min(acc.len() - 1);
    let mut i = first;
    while i < acc.len() {
        let lo = i as f64 * bin_s;
        let hi = lo + bin_s;
        let overlap = b.min(hi) - a.max(lo);
        if overlap > 0.0 {
            acc[i] += value * overlap;
        }
        if hi >= b {
            break;
        }
        i += 1;
    }
}

fn shape_key(d: &InstanceDesc) -> (u8, u8, u8) {
    (d.start, d.compute, d.memory_slices)
}

fn picture(header: &Header, gpu: usize, set: &BTreeSet<(u8, u8, u8)>) -> String {
    let g = Geometry::of(header.gpus[gpu].model);
    let pairs: Vec<(Shape, u8)> = set
        .iter()
        .map(|&(start, c, m)| (Shape::new(c, m), start))
        .collect();
    g.layout_from(&pairs)
        .map(|l| g.picture(l))
        .unwrap_or_else(|_| "invalid".to_string())
}

/// The bins of `[0, horizon]`: their starts and lengths (the last may be
/// shorter).
fn bins_of(horizon: f64, bin_s: f64) -> (Vec<f64>, Vec<f64>) {
    let bins = ((horizon / bin_s).ceil() as usize).max(1);
    let start_s: Vec<f64> = (0..bins).map(|i| i as f64 * bin_s).collect();
    let bin_len_s: Vec<f64> = start_s
        .iter()
        .map(|&s| (horizon.min(s + bin_s) - s).max(0.0))
        .collect();
    (start_s, bin_len_s)
}

fn check_bin(bin_s: f64) -> Result<(), ReportError> {
    if bin_s.is_finite() && bin_s > 0.0 {
        Ok(())
    } else {
        Err(ReportError::Invalid(format!(
            "bin width {bin_s} s is not > 0"
        )))
    }
}

/// Time-weighted sums -> means over each bin.
fn per_second(v: &mut [f64], bin_len_s: &[f64]) {
    v.iter_mut().zip(bin_len_s).for_each(|(x, l)| {
        *x = if *l > 0.0 { *x / l } else { 0.0 };
    });
}

/// The mean number of waiting jobs per bin from their waits alone,
/// `(arrival, start)` in seconds since time 0 (what a node's log shows
/// of a queue, e.g. `smartmig advise report`'s observed jobs); the other
/// series are empty.
pub fn waiting(waits: &[(f64, f64)], horizon: f64, bin_s: f64) -> Result<TimeSeries, ReportError> {
    check_bin(bin_s)?;
    let (start_s, bin_len_s) = bins_of(horizon, bin_s);
    let mut queue = vec![0.0; start_s.len()];
    for &(a, b) in waits {
        spread(&mut queue, bin_s, a, b.min(horizon), 1.0);
    }
    per_second(&mut queue, &bin_len_s);
    Ok(TimeSeries {
        bin_s,
        start_s,
        bin_len_s,
        queue,
        horizon_s: horizon,
        ..TimeSeries::default()
    })
}

/// Builds the per-bin series of a run from its event log.
pub fn from_records(records: &[Record], bin_s: f64) -> Result<TimeSeries, ReportError> {
    check_bin(bin_s)?;
    let Some(Record::Header(header)) = records.first() else {
        return Err(ReportError::Invalid(
            "the event log does not start with a header".into(),
        ));
    };
    let horizon = records
        .iter()
        .rev()
        .find_map(|r| match r {
            Record::Summary(s) => Some(s.horizon_s),
            _ => None,
        })
        .ok_or_else(|| ReportError::Invalid("the event log has no summary".into()))?;
    let n_gpus = header.gpus.len();
    let (start_s, bin_len_s) = bins_of(horizon, bin_s);
    let bins = start_s.len();

    // Power: per GPU, the load is piecewise constant between job starts and ends.
    let mut power = vec![0.0; bins];
    let mut changes: Vec<Vec<(f64, i32)>> = vec![Vec::new(); n_gpus];
    let mut queue = vec![0.0; bins];
    let mut reconfigs = Vec::new();
    for r in records {
        match r {
            Record::Job(j) => {
                let g = changes.get_mut(j.run.gpu).ok_or_else(|| {
                    ReportError::Invalid(format!("job {} on unknown GPU {}", j.run.id, j.run.gpu))
                })?;
                g.push((j.run.start, i32::from(j.run.compute)));
                g.push((j.end, -i32::from(j.run.compute)));
                spread(&mut queue, bin_s, j.run.arrival, j.run.start, 1.0);
            }
            Record::Unserved(u) if !u.reason.starts_with("fits no instance") => {
                spread(&mut queue, bin_s, u.arrival, horizon, 1.0);
            }
            Record::Reconfig(c) => reconfigs.push(c),
            _ => {}
        }
    }
    power_per_gpu(header, &mut changes, &mut power, bin_s, horizon)?;
    let per_layout = time_per_layout(header, reconfigs, bins, bin_s, horizon)?;
    let mut layouts = top_layouts(per_layout, bins);

    // Time-weighted sums -> means over each bin.
    per_second(&mut power, &bin_len_s);
    per_second(&mut queue, &bin_len_s);
    for (_, v) in &mut layouts {
        per_second(v, &bin_len_s);
    }
    Ok(TimeSeries {
        bin_s,
        start_s,
        bin_len_s,
        power_w: power,
        queue,
        layouts,
        horizon_s: horizon,
    })
}

/// Spreads each GPU's power into `power`: its load is piecewise constant
/// between the job starts and ends in `changes` (sorted here).
fn power_per_gpu(
    header: &Header,
    changes: &mut [Vec<(f64, i32)>],
    power: &mut [f64],
    bin_s: f64,
    horizon: f64,
) -> Result<(), ReportError> {
    for (gpu, ch) in changes.iter_mut().enumerate() {
        let model = header.gpus[gpu].model;
        let total = header.gpus[gpu].compute_slices;
        let pm = header
            .power
            .iter()
            .find(|p| p.model == model)
            .map(|p| p.power)
            .ok_or_else(|| ReportError::Invalid(format!("no power model for {model}")))?;
        ch.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut busy: i32 = 0;
        let mut t = 0.0;
        for &(time, delta) in ch.iter() {
            let load = gpu_load([busy.clamp(0, 255) as u8], total);
            spread(power, bin_s, t, time, pm.power_w(load));
            busy += delta;
            t = time;
        }
        spread(power, bin_s, t, horizon, pm.power_w(0.0));
    }

    Ok(())
}

/// The GPU time spent in each layout per bin: initial instances, then
/// each reconfiguration in time order.
fn time_per_layout(
    header: &Header,
    mut reconfigs: Vec<&ReconfigRecord>,
    bins: usize,
    bin_s: f64,
    horizon: f64,
) -> Result<BTreeMap<String, Vec<f64>>, ReportError> {
    let n_gpus = header.gpus.len();
    // Layouts: initial instances, then each reconfiguration in time order.
    reconfigs.sort_by(|a, b| a.time.total_cmp(&b.time).then(a.gpu.cmp(&b.gpu)));
    let mut sets: Vec<BTreeSet<(u8, u8, u8)>> = header
        .gpus
        .iter()
        .map(|g| g.initial.iter().map(shape_key).collect())
        .collect();
    let mut since = vec![0.0; n_gpus];
    let mut per_layout: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let close = |per_layout: &mut BTreeMap<String, Vec<f64>>,
                 gpu: usize,
                 set: &BTreeSet<_>,
                 a: f64,
                 b: f64| {
        let acc = per_layout
            .entry(picture(header, gpu, set))
            .or_insert_with(|| vec![0.0; bins]);
        spread(acc, bin_s, a, b, 1.0);
    };
    for c in reconfigs {
        if c.gpu >= n_gpus {
            return Err(ReportError::Invalid(format!(
                "reconfiguration of unknown GPU {}",
                c.gpu
            )));
        }
        close(&mut per_layout, c.gpu, &sets[c.gpu], since[c.gpu], c.time);
        for d in &c.destroyed {
            sets[c.gpu].remove(&shape_key(d));
        }
        for d in &c.created {
            sets[c.gpu].insert(shape_key(d));
        }
        since[c.gpu] = c.time;
    }
    for gpu in 0..n_gpus {
        close(&mut per_layout, gpu, &sets[gpu], since[gpu], horizon);
    }
    Ok(per_layout)
}

/// The `MAX_LAYOUTS` layouts with the most GPU time, the rest summed as
/// `other`.
fn top_layouts(per_layout: BTreeMap<String, Vec<f64>>, bins: usize) -> Vec<(String, Vec<f64>)> {
    let mut ranked: Vec<(String, Vec<f64>)> = per_layout.into_iter().collect();
    ranked.sort_by(|a, b| {
        let (sa, sb) = (a.1.iter().sum::<f64>(), b.1.iter().sum::<f64>());
        sb.total_cmp(&sa).then(a.0.cmp(&b.0))
    });
    let mut layouts: Vec<(String, Vec<f64>)> = Vec::new();
    for (i, (name, v)) in ranked.into_iter().enumerate() {
        if i < MAX_LAYOUTS {
            layouts.push((name, v));
        } else {
            if layouts.len() == MAX_LAYOUTS {
                layouts.push(("other".to_string(), vec![0.0; bins]));
            }
            if let Some(other) = layouts.last_mut() {
                other.1.iter_mut().zip(&v).for_each(|(o, x)| *o += x);
            }
        }
    }

    layouts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_is_the_mean_queue_per_bin_and_the_last_bin_is_shorter() {
        // One job waits over [0, 100), one over [50, 150), one not at all;
        // the horizon (250 s) cuts the third bin to 50 s.
        let s = waiting(&[(0.0, 100.0), (50.0, 150.0), (120.0, 120.0)], 250.0, 100.0).unwrap();
        assert_eq!(s.start_s, [0.0, 100.0, 200.0]);
        assert_eq!(s.bin_len_s, [100.0, 100.0, 50.0]);
        assert_eq!(s.queue, [1.5, 0.5, 0.0]);
        assert!(s.power_w.is_empty());
        assert!(waiting(&[], 10.0, 0.0).is_err());
    }
}
