//! Holds on stranded shards (issue 42): what smartmigd asks Slurm to keep
//! off a GPU so that Slurm offers only what MIG can still build.
//!
//! Slurm counts a GPU's free shards; next to the busy instances some of
//! them may form no instance ([`crate::mig::Geometry::stranded`]). smartmigd
//! holds those shards with placeholder allocations of its own
//! (`salloc --no-shell --gres=shard:<gpu type>:<n>`, top priority, pinned to
//! this node; docs/slurm-integration.md §9), and gives them back when a
//! neighbour's end makes them usable again.
//!
//! Pure code: [`plan`] compares what each GPU should hold with the holds
//! that exist and returns the steps; the shell runs them (a new hold is
//! queued *before* an old one is cancelled, so a pending hold at the top
//! priority takes the shards the cancelled one frees, and no job slips in
//! between).

use crate::mig::{Geometry, Layout, OfferRule};

/// The GRES type of GPU `index` in gres.conf (`Type=mig<index>`): how a
/// hold names its GPU (and what `smartmig doctor` checks gres.conf for).
pub fn gres_type(index: u32) -> String {
    format!("mig{index}")
}

/// One GPU as the hold planner sees it.
#[derive(Clone, Copy, Debug)]
pub struct GpuShards {
    pub index: u32,
    pub geometry: &'static Geometry,
    /// Instances held by jobs (or being made for one).
    pub busy: Layout,
    /// Shards Slurm has given to jobs on this GPU: the busy instances'
    /// compute slices plus those of jobs still waiting for an instance.
    pub used: u8,
}

impl GpuShards {
    /// Shards this GPU should hold: its free shards in Slurm's count beyond
    /// what MIG can build next to the busy instances.
    pub fn target(&self, rule: OfferRule) -> u8 {
        let free = self.geometry.spec.compute_slices.saturating_sub(self.used);
        self.geometry.stranded(self.busy, free, rule)
    }
}

/// A hold that exists in Slurm (running or still pending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    pub job_id: u64,
    pub gpu: u32,
    pub shards: u8,
}

/// One step of [`plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Queue a new hold of `shards` on `gpu`.
    Hold { gpu: u32, shards: u8 },
    /// Cancel this hold.
    Release { job_id: u64 },
}

/// The steps that take `holds` to each GPU's [`GpuShards::target`]: new
/// holds first, then releases. A GPU that should hold more gets one new
/// hold of the difference; one that should hold less gives back holds,
/// largest first, and re-holds what it gave back beyond the excess.
pub fn plan(gpus: &[GpuShards], holds: &[Hold], rule: OfferRule) -> Vec<Step> {
    let mut add = Vec::new();
    let mut cancel = Vec::new();
    for g in gpus {
        let target = g.target(rule);
        let mut mine: Vec<&Hold> = holds.iter().filter(|h| h.gpu == g.index).collect();
        let held: u8 = mine.iter().map(|h| h.shards).sum();
        if held < target {
            add.push(Step::Hold {
                gpu: g.index,
                shards: target - held,
            });
            continue;
        }
        let mut excess = held - target;
        mine.sort_by_key(|h| std::cmp::Reverse((h.shards, h.job_id)));
        let mut regain = 0u8;
        for h in mine {
            if excess == 0 {
                break;
            }
            cancel.push(Step::Release { job_id: h.job_id });
            if h.shards > excess {
                regain = h.shards - excess;
                excess = 0;
            } else {
                excess -= h.shards;
            }
        }
        if regain > 0 {
            add.push(Step::Hold {
                gpu: g.index,
                shards: regain,
            });
        }
    }
    // Holds on GPUs this node does not know (a GPU gone from the books).
    for h in holds {
        if !gpus.iter().any(|g| g.index == h.gpu) {
            cancel.push(Step::Release { job_id: h.job_id });
        }
    }
    add.extend(cancel);
    add
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::{GpuModel, Shape};

    fn a100() -> &'static Geometry {
        Geometry::of(GpuModel::A100_40gb)
    }

    fn gpu(index: u32, inst: &[(u8, u8, u8)], waiting: u8) -> GpuShards {
        let g = a100();
        let busy = inst.iter().fold(Layout::EMPTY, |l, &(c, m, s)| {
            l.with(
                g.spot_id(
                    Shape {
                        compute: c,
                        memory: m,
                    },
                    s,
                )
                .expect("placement"),
            )
        });
        GpuShards {
            index,
            geometry: g,
            busy,
            used: g.compute_used(busy) + waiting,
        }
    }

    const NEXT: OfferRule = OfferRule::NextJob;

    #[test]
    fn two_3g_get_one_hold_and_nothing_more() {
        let g = [gpu(0, &[(3, 4, 0), (3, 4, 4)], 0), gpu(1, &[], 0)];
        assert_eq!(plan(&g, &[], NEXT), vec![Step::Hold { gpu: 0, shards: 1 }]);
        let held = [Hold {
            job_id: 9,
            gpu: 0,
            shards: 1,
        }];
        assert_eq!(plan(&g, &held, NEXT), vec![]);
    }

    #[test]
    fn a_job_waiting_on_the_stranded_shard_is_not_held_twice() {
        // Slurm already gave the seventh shard to a job that waits for room.
        let g = [gpu(0, &[(3, 4, 0), (3, 4, 4)], 1)];
        assert_eq!(plan(&g, &[], NEXT), vec![]);
    }

    #[test]
    fn a_neighbours_end_gives_the_hold_back() {
        let g = [gpu(0, &[(3, 4, 0)], 0)];
        // 3g@0 alone: slots 4-7 take a 3g, so one of the four free shards
        // stays stranded (no 4g fits): keep one, give one back.
        let held = [
            Hold {
                job_id: 5,
                gpu: 0,
                shards: 1,
            },
            Hold {
                job_id: 6,
                gpu: 0,
                shards: 1,
            },
        ];
        assert_eq!(plan(&g, &held, NEXT), vec![Step::Release { job_id: 6 }]);
        let empty = [gpu(0, &[], 0)];
        assert_eq!(
            plan(&empty, &held, NEXT),
            vec![Step::Release { job_id: 6 }, Step::Release { job_id: 5 }]
        );
    }

    #[test]
    fn a_hold_too_big_is_replaced_before_it_is_released() {
        let g = [gpu(0, &[(3, 4, 0)], 0)];
        let held = [Hold {
            job_id: 7,
            gpu: 0,
            shards: 3,
        }];
        assert_eq!(
            plan(&g, &held, NEXT),
            vec![
                Step::Hold { gpu: 0, shards: 1 },
                Step::Release { job_id: 7 }
            ]
        );
    }

    #[test]
    fn holds_of_unknown_gpus_are_released() {
        let held = [Hold {
            job_id: 3,
            gpu: 4,
            shards: 1,
        }];
        assert_eq!(
            plan(&[gpu(0, &[], 0)], &held, NEXT),
            vec![Step::Release { job_id: 3 }]
        );
    }
}
