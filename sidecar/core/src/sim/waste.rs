//! Wasted reshapes, read off an event log ([`super::events`]): instances a
//! reconfiguration created that never ran a job.
//!
//! An instance is identified by its GPU and placement (profile shape and
//! start slot; two live instances of one GPU never share a placement). An
//! instance a reconfiguration created is
//!
//! - **used** if some run (a job, or an out-of-memory or early-restarted
//!   run: it held the instance too) started on it before it was destroyed;
//! - **wasted** if it never ran anything: either a later reconfiguration
//!   destroyed it unused (`destroyed_unused`: the reshape bought nothing
//!   and was undone), or it was still there unused when the log ends
//!   (`unused_at_end`). The log ends when the last job has ended (the
//!   simulator runs until the queue is empty), so an instance unused by
//!   then served no job of the run; counting it matters for policies that
//!   never undo a reshape (`greedy` destroys an idle instance only when
//!   another reshape needs its slots, so what a herd built stays). The two
//!   parts are reported apart, so a reader who prefers to forgive the end
//!   of the day can.
//!
//! The initial instances (the log's header) were installed by the admin
//! and are not counted. Records are read in file order, which is
//! simulation order (a job record is written when its run starts, a
//! reconfiguration when it is applied), so a destruction always comes after
//! every run that started on the instance. Pure; no allocation per record
//! beyond the map of live instances.

use rustc_hash::FxHashMap;
use serde::Serialize;

use super::events::Record;
use crate::mig::InstanceDesc;

/// What the reconfigurations of a log created, and what became of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Waste {
    /// Applied reconfigurations (records in the log).
    pub reconfigurations: u64,
    /// Instances they created.
    pub created: u64,
    /// Created instances that ran at least one job.
    pub used: u64,
    /// Created instances destroyed later without having run anything.
    pub destroyed_unused: u64,
    /// Created instances still there, unused, when the log ends.
    pub unused_at_end: u64,
    /// Reconfigurations that created at least one instance and none that
    /// was ever used (every one wasted or unused at the end).
    pub futile_reconfigurations: u64,
}

impl Waste {
    /// Created instances that never ran anything: `destroyed_unused +
    /// unused_at_end` (`created = used + wasted`).
    pub fn wasted(&self) -> u64 {
        self.destroyed_unused + self.unused_at_end
    }

    /// `wasted / created` (0 when nothing was created).
    pub fn wasted_share(&self) -> f64 {
        if self.created == 0 {
            0.0
        } else {
            self.wasted() as f64 / self.created as f64
        }
    }
}

/// `(gpu, start slot, compute, memory slices)`.
type Key = (usize, u8, u8, u8);

fn key(gpu: usize, d: &InstanceDesc) -> Key {
    (gpu, d.start, d.compute, d.memory_slices)
}

/// A live instance a reconfiguration created: the reconfiguration's index
/// and whether a run started on it.
#[derive(Clone, Copy)]
struct Live {
    reconfig: usize,
    used: bool,
}

/// Counts [`Waste`] over `records` (module docs).
pub fn count_waste(records: &[Record]) -> Waste {
    let mut w = Waste::default();
    let mut live: FxHashMap<Key, Live> = FxHashMap::default();
    // Per reconfiguration that created something: whether any of its
    // instances was used.
    let mut fruitful: Vec<bool> = Vec::new();
    let mut creating: Vec<bool> = Vec::new();
    fn ran_on(live: &mut FxHashMap<Key, Live>, fruitful: &mut [bool], k: Key) {
        if let Some(l) = live.get_mut(&k) {
            l.used = true;
            fruitful[l.reconfig] = true;
        }
    }
    for r in records {
        match r {
            Record::Reconfig(c) => {
                let index = fruitful.len();
                fruitful.push(false);
                creating.push(!c.created.is_empty());
                w.reconfigurations += 1;
                for d in &c.destroyed {
                    if let Some(l) = live.remove(&key(c.gpu, d)) {
                        if l.used {
                            w.used += 1;
                        } else {
                            w.destroyed_unused += 1;
                        }
                    }
                }
                for d in &c.created {
                    w.created += 1;
                    live.insert(
                        key(c.gpu, d),
                        Live {
                            reconfig: index,
                            used: false,
                        },
                    );
                }
            }
            Record::Job(j) => ran_on(
                &mut live,
                &mut fruitful,
                (
                    j.run.gpu,
                    j.run.start_slot,
                    j.run.compute,
                    j.run.memory_slices,
                ),
            ),
            Record::Oom(o) => ran_on(
                &mut live,
                &mut fruitful,
                (
                    o.run.gpu,
                    o.run.start_slot,
                    o.run.compute,
                    o.run.memory_slices,
                ),
            ),
            Record::Header(_) | Record::Unserved(_) | Record::Summary(_) => {}
        }
    }
    for l in live.values() {
        if l.used {
            w.used += 1;
        } else {
            w.unused_at_end += 1;
        }
    }
    w.futile_reconfigurations = creating
        .iter()
        .zip(&fruitful)
        .filter(|(c, f)| **c && !**f)
        .count() as u64;
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::{Geometry, GpuModel, Layout, Shape};
    use crate::sim::events::{JobRecord, ReconfigRecord, Run};
    use crate::workload::SpeedupCurve;

    fn g() -> &'static Geometry {
        Geometry::of(GpuModel::A100_40gb)
    }

    fn layout(parts: &[(u8, u8, u8)]) -> Layout {
        parts.iter().fold(Layout::EMPTY, |l, &(c, m, s)| {
            l.with(g().spot_id(Shape::new(c, m), s).expect("placement"))
        })
    }

    fn reconfig(time: f64, gpu: usize, from: Layout, to: Layout) -> Record {
        let t = g().transition(from, to);
        Record::Reconfig(ReconfigRecord {
            time,
            gpu,
            destroyed: g().describe(t.destroy),
            created: g().describe(t.create),
            duration: 4.0,
            ready: time + 4.0,
            kind: None,
        })
    }

    fn job(
        id: u64,
        gpu: usize,
        (compute, memory_slices, start_slot): (u8, u8, u8),
        start: f64,
    ) -> Record {
        Record::Job(JobRecord {
            run: Run {
                id,
                arrival: 0.0,
                deadline: 1e6,
                work: 10.0,
                memory_gb: 1.0,
                requested_slices: None,
                speedup: SpeedupCurve {
                    beta: 1.0,
                    saturation: 1.0,
                },
                gpu,
                profile: String::new(),
                compute,
                memory_slices,
                start_slot,
                instance_memory_gb: 5,
                speed: 1.0,
                start,
                gpus: 1,
            },
            end: start + 10.0,
        })
    }

    const G3A: (u8, u8, u8) = (3, 4, 0);
    const G3B: (u8, u8, u8) = (3, 4, 4);
    const G7: (u8, u8, u8) = (7, 8, 0);

    #[test]
    fn a_hand_built_log_counts_wasted_used_and_unused() {
        let whole = layout(&[G7]);
        let halves = layout(&[G3A, G3B]);
        let log = vec![
            // GPU 0: split, a job on one half, merged back: one used, one
            // wasted; the merged whole GPU is never used (at the end).
            reconfig(0.0, 0, whole, halves),
            job(1, 0, G3A, 10.0),
            reconfig(100.0, 0, halves, whole),
            // GPU 1: split and merged back with nothing run: a futile
            // reconfiguration; then split again, a job on each half.
            reconfig(0.0, 1, whole, halves),
            reconfig(50.0, 1, halves, whole),
            reconfig(60.0, 1, whole, halves),
            job(2, 1, G3A, 70.0),
            job(3, 1, G3B, 70.0),
            // A job on an initial instance counts nothing.
            job(4, 2, G7, 0.0),
        ];
        let w = count_waste(&log);
        assert_eq!(
            w,
            Waste {
                reconfigurations: 5,
                created: 2 + 1 + 2 + 1 + 2,
                // GPU 0: half A; GPU 1: both halves of the second split.
                used: 1 + 2,
                // GPU 0: half B; GPU 1: both halves, then the whole GPU.
                destroyed_unused: 1 + 2 + 1,
                // GPU 0's whole GPU at the end.
                unused_at_end: 1,
                // GPU 0's merge, GPU 1's first split and its merge.
                futile_reconfigurations: 3,
            }
        );
        assert_eq!(w.wasted(), 5);
        assert_eq!(w.used + w.wasted(), w.created);
        assert!((w.wasted_share() - 5.0 / 8.0).abs() < 1e-12);
        assert_eq!(count_waste(&[]), Waste::default());
        assert_eq!(Waste::default().wasted_share(), 0.0);
    }
}
