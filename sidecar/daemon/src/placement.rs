//! The daemon's `placement` setting: when room frees on a GPU and several
//! allocates wait for it, which one goes first, and which profile it gets.
//!
//! Pure code: [`PlacementRule::next_turn`] looks at one GPU's book and the
//! jobs contending for it and names the job to serve; the server
//! ([`super::server`]) asks it under the GPU's lock and makes every other
//! contender wait for the next release. Rules:
//!
//! | setting | order | profile |
//! |---|---|---|
//! | `arrival` (default) | the allocate that arrived first | the smallest that fits ([`GpuBook::plan`]) |
//! | `edf` | the earliest deadline (Slurm `--deadline`, else the end of the job's time limit; unknown last), then arrival | the smallest that fits |
//! | `learned:FILE.onnx` | earliest deadline; the network may let a job wait behind the others (*defer*) | the network's choice among the profiles of the job's compute size (its shards) that block no more shards than it (a memory variant blocks its room's) with enough memory that can be made now (on an A100-40GB: 1g.5gb for one shard, never the 1g.10gb that blocks two) |
//!
//! Every rule is work-conserving: a job that fits is never kept waiting
//! for one that does not, and a deferred job is served when no other
//! contender fits. The learned placement reads the same features
//! ([`crate::sim::placement_features`]) as in the simulator, with what
//! Slurm tells about a job standing in for what the simulator knows: the
//! whole-GPU work is the time limit scaled by the default speed-up curve
//! (as the repartitioning policy's pending demand, `server/view.rs`), the
//! speed-up curve is the default one, and "the cluster" is this GPU.

use std::path::Path;

use crate::allocate::{GpuBook, Need, Plan, Refusal};
use crate::mig::{select_profile, GpuModel, ProfileSpec, MAX_PROFILES};
use crate::policy::onnx::PolicyLoadError;
use crate::policy::{PendingByProfile, PendingJob, MODEL_COUNT};
use crate::sim::heuristics::{Candidate, PlacementContext, PlacementHeuristic};
use crate::sim::placement_onnx::OnnxPlacement;
use crate::workload::{Job, JobClass, SpeedupCurve};

/// How contending allocates are ordered (the config's `placement`).
pub enum PlacementRule {
    Arrival,
    Edf,
    /// A learned placement file, with its spec as written.
    Learned {
        spec: String,
        runner: Box<OnnxPlacement>,
    },
}

impl std::fmt::Debug for PlacementRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Why the daemon will not run the placement its config names.
#[derive(Debug, thiserror::Error)]
pub enum PlacementChoiceError {
    #[error("unknown placement `{0}`: use `arrival`, `edf` or `learned:FILE.onnx`")]
    Unknown(String),
    #[error("`{spec}`: a learned placement serves one GPU model, but this node has {models}")]
    SeveralModels { spec: String, models: String },
    /// The file exists but is wrong for this node or build (another GPU
    /// model or feature spec, a repartitioning policy, not ONNX ...).
    #[error(transparent)]
    Learned(#[from] PolicyLoadError),
}

impl PlacementRule {
    /// The rule named by `spec` for a node with GPUs of `models` (empty:
    /// not known yet, e.g. before NVML answered: a learned file is then
    /// only checked for its metadata). A learned file that cannot run here
    /// (missing file or ONNX Runtime) is an error like any other: unlike
    /// the repartitioning policy there is no silent fallback, because the
    /// rule decides which job runs first.
    pub fn build(spec: &str, models: &[GpuModel]) -> Result<Self, PlacementChoiceError> {
        let s = spec.trim();
        match s {
            "arrival" => return Ok(PlacementRule::Arrival),
            "edf" => return Ok(PlacementRule::Edf),
            _ => {}
        }
        let Some(path) = s.strip_prefix("learned:") else {
            return Err(PlacementChoiceError::Unknown(s.to_string()));
        };
        let distinct = GpuModel::distinct(models);
        let expected = match distinct.as_slice() {
            [] => None,
            [one] => Some(*one),
            many => {
                return Err(PlacementChoiceError::SeveralModels {
                    spec: s.to_string(),
                    models: many.iter().map(|m| m.id()).collect::<Vec<_>>().join(", "),
                })
            }
        };
        let runner = OnnxPlacement::load(Path::new(path), expected)?;
        Ok(PlacementRule::Learned {
            spec: s.to_string(),
            runner: Box::new(runner),
        })
    }

    /// The name shown in status and logs.
    pub fn name(&self) -> String {
        match self {
            PlacementRule::Arrival => "arrival".into(),
            PlacementRule::Edf => "edf".into(),
            PlacementRule::Learned { spec, .. } => spec.clone(),
        }
    }

    /// The job to serve now among `contenders` on `book`'s GPU, with the
    /// profile and plan it gets; `None` when none of them fits. `now`:
    /// Unix seconds.
    pub fn next_turn(
        &mut self,
        book: &GpuBook,
        contenders: &[Contender],
        now: f64,
    ) -> Option<Turn> {
        let mut order: Vec<&Contender> = contenders.iter().collect();
        match self {
            PlacementRule::Arrival => {
                order.sort_by(|a, b| a.arrival_key().total_cmp(&b.arrival_key()));
            }
            PlacementRule::Edf | PlacementRule::Learned { .. } => order.sort_by(|a, b| {
                a.deadline
                    .total_cmp(&b.deadline)
                    .then(a.arrival_key().total_cmp(&b.arrival_key()))
            }),
        }
        match self {
            PlacementRule::Arrival | PlacementRule::Edf => order.into_iter().find_map(|c| {
                let (profile, plan) = c.plan(book).ok()?;
                Some(Turn {
                    job_id: c.job_id,
                    profile,
                    plan,
                })
            }),
            PlacementRule::Learned { runner, .. } => learned_turn(runner, book, &order, now),
        }
    }
}

/// A pending job's work in whole-GPU seconds, estimated as the sacct
/// reader does: its time limit on K slices, scaled by the default
/// speed-up of K slices. Unlimited jobs count one hour (Slurm sites
/// without time limits give the policy nothing better).
pub fn pending_work(time_limit_s: Option<u64>, shards: u8, speedup: &SpeedupCurve) -> f64 {
    let limit = time_limit_s.map_or(3600.0, |t| t as f64);
    limit * speedup.speed(shards, 7)
}

/// An allocate that wants room on a GPU: the one being decided and those
/// already waiting.
#[derive(Clone, Debug, PartialEq)]
pub struct Contender {
    pub job_id: u64,
    pub need: Need,
    /// `--mig-profile`: only this profile.
    pub exact: Option<&'static ProfileSpec>,
    /// Unix seconds (fractional) when the allocate arrived.
    pub arrival: f64,
    /// Unix seconds of the job's deadline: Slurm's `--deadline`, else the
    /// end of its time limit; infinite when Slurm did not say.
    pub deadline: f64,
    /// The job's time limit, s, when known.
    pub time_limit_s: Option<u64>,
}

impl Contender {
    fn arrival_key(&self) -> f64 {
        self.arrival + (self.job_id as f64) * 1e-9
    }

    /// The plan the rule-based placements give it.
    fn plan(&self, book: &GpuBook) -> Result<(&'static ProfileSpec, Plan), Refusal> {
        book.plan_exact_beside(self.need, self.exact, &crate::allocate::Beside::default())
    }

    /// The profiles the learned placement may give it now: those of its
    /// compute size with enough memory that the book can make (only the
    /// exact one under `--mig-profile`).
    fn candidates(&self, book: &GpuBook) -> Vec<ProfileOption> {
        let spec = book.geometry.spec;
        let Ok(smallest) = select_profile(spec, self.need.slices, self.need.memory_gb) else {
            return Vec::new();
        };
        let want = self.need.memory_gb.unwrap_or(0.0);
        spec.profiles
            .iter()
            .enumerate()
            .filter(|(_, p)| match self.exact {
                Some(e) => std::ptr::eq(*p, e),
                // Never more compute slices than the job's shards, nor a
                // memory variant blocking more shards than it (issue 55):
                // Slurm counts the rest of the GPU's shards as free and
                // would start jobs MIG then cannot place.
                None => {
                    p.shape.compute == smallest.shape.compute
                        && std::ptr::eq(spec.room_profile(p), spec.room_profile(smallest))
                        && f64::from(p.memory_gb) >= want
                }
            })
            .filter_map(|(i, p)| {
                let plan = book.plan_profile(p, want).ok()?;
                let free = book.idle_of(p).max(1);
                Some((
                    Candidate {
                        class: i as u16,
                        model: spec.model,
                        compute: p.shape.compute,
                        total_compute: spec.compute_slices,
                        memory_gb: p.memory_gb,
                        profile_index: i as u8,
                        free,
                    },
                    p,
                    plan,
                ))
            })
            .collect()
    }

    /// The job as the learned placement's features see it.
    fn as_job(&self, speedup: SpeedupCurve) -> Job {
        Job {
            id: self.job_id,
            arrival: self.arrival,
            work: pending_work(self.time_limit_s, self.need.slices, &speedup),
            speedup,
            memory_gb: self.need.memory_gb.unwrap_or(0.0),
            deadline: self.deadline,
            class: JobClass::Training,
            requested_slices: Some(self.need.slices),
            declared_memory_gb: None,
            template: None,
            memory_growth: None,
            gpus: 1,
        }
    }
}

/// One profile the learned placement may pick: as the network sees it,
/// the profile, and how the book would make it.
type ProfileOption = (Candidate, &'static ProfileSpec, Plan);

/// The decision: who, which profile, and how to make it.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    pub job_id: u64,
    pub profile: &'static ProfileSpec,
    pub plan: Plan,
}

/// The learned rule: in deadline order, the network picks a profile for
/// each job that fits, or defers it behind the others; when every fitting
/// job was deferred, the first of them is asked again without that choice.
fn learned_turn(
    runner: &mut OnnxPlacement,
    book: &GpuBook,
    order: &[&Contender],
    now: f64,
) -> Option<Turn> {
    let spec = book.geometry.spec;
    let speedup = SpeedupCurve::default();
    let fitting: Vec<(&Contender, Vec<ProfileOption>)> = order
        .iter()
        .map(|c| (*c, c.candidates(book)))
        .filter(|(_, cands)| !cands.is_empty())
        .collect();
    if fitting.is_empty() {
        return None;
    }
    let mut by_profile: PendingByProfile = [[0; MAX_PROFILES]; MODEL_COUNT];
    let waiting: Vec<PendingJob> = order
        .iter()
        .map(|c| {
            let job = c.as_job(speedup);
            let smallest = select_profile(spec, c.need.slices, c.need.memory_gb).ok();
            let mut shapes = [None; MODEL_COUNT];
            if let Some(p) = smallest {
                shapes[spec.model as usize] = Some(p.shape);
                if let Some(ix) = spec.profiles.iter().position(|q| std::ptr::eq(q, p)) {
                    by_profile[spec.model as usize][ix] += 1;
                }
            }
            PendingJob {
                id: c.job_id,
                arrival: c.arrival,
                deadline: c.deadline,
                work: job.work,
                memory_gb: job.memory_gb,
                min_compute: c.need.slices,
                speedup,
                shapes,
            }
        })
        .collect();
    let busy_compute: u32 = book
        .instances
        .iter()
        .filter(|i| i.job.is_some())
        .map(|i| u32::from(book.geometry.spot(i.placement).shape().compute))
        .sum();
    let may_defer_at_all = fitting.len() > 1;
    for may_defer in [may_defer_at_all, false] {
        let ctx = PlacementContext {
            now,
            gpus: 1,
            total_compute: u32::from(spec.compute_slices),
            busy_compute,
            waiting: &waiting,
            pending_by_profile: &by_profile,
            may_defer,
        };
        for (c, cands) in &fitting {
            let candidates: Vec<Candidate> = cands.iter().map(|(cand, _, _)| *cand).collect();
            let pick = runner.choose_in(&c.as_job(speedup), &candidates, &ctx);
            if pick.defer && may_defer {
                continue;
            }
            let (_, profile, plan) = cands.get(pick.candidate).or_else(|| cands.first())?;
            return Some(Turn {
                job_id: c.job_id,
                profile,
                plan: plan.clone(),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::{Geometry, Shape};

    /// An A100-40GB whose 3g.20gb at memory slot 4 is busy: slots 0-3 are
    /// free, room for one instance of up to four compute slices.
    fn half_busy() -> GpuBook {
        let g = Geometry::of(GpuModel::A100_40gb);
        let mut b = GpuBook::new(0, g, 0);
        let three = g.spot_id(Shape::new(3, 4), 4).expect("3g at 4");
        b.add_instance(three, "MIG-busy".into(), 0);
        b.assign("MIG-busy", crate::allocate::test_assignment(99));
        b
    }

    fn contender(job_id: u64, slices: u8, arrival: f64, deadline: f64) -> Contender {
        Contender {
            job_id,
            need: Need {
                slices,
                memory_gb: None,
            },
            exact: None,
            arrival,
            deadline,
            time_limit_s: Some(3600),
        }
    }

    #[test]
    fn names_are_parsed_and_unknown_ones_refused() {
        assert_eq!(
            PlacementRule::build("arrival", &[]).unwrap().name(),
            "arrival"
        );
        assert_eq!(PlacementRule::build(" edf ", &[]).unwrap().name(), "edf");
        let e = PlacementRule::build("fifo", &[]).unwrap_err().to_string();
        assert!(
            e.contains("unknown placement `fifo`") && e.contains("learned:FILE.onnx"),
            "{e}"
        );
        let e = PlacementRule::build("learned:/nonexistent.onnx", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent.onnx"), "{e}");
    }

    /// Arrival and EDF order the same two jobs differently.
    #[test]
    fn arrival_and_edf_disagree_on_who_goes_first() {
        let b = half_busy();
        let early_late = [contender(1, 2, 10.0, 9_000.0), contender(2, 2, 20.0, 500.0)];
        let mut arrival = PlacementRule::Arrival;
        let mut edf = PlacementRule::Edf;
        assert_eq!(arrival.next_turn(&b, &early_late, 30.0).unwrap().job_id, 1);
        let t = edf.next_turn(&b, &early_late, 30.0).unwrap();
        assert_eq!(t.job_id, 2);
        assert_eq!(t.profile.name(), "2g.10gb");
        // An unknown deadline (infinite) goes after known ones.
        let unknown = [
            contender(1, 2, 10.0, f64::INFINITY),
            contender(2, 2, 20.0, 9e9),
        ];
        assert_eq!(edf.next_turn(&b, &unknown, 30.0).unwrap().job_id, 2);
    }

    /// Work-conserving: the first in either order wants seven slices,
    /// which the busy 3g blocks, so the next one, which fits, goes.
    #[test]
    fn a_job_that_does_not_fit_does_not_block_one_that_does() {
        let b = half_busy();
        let cs = [contender(1, 7, 10.0, 100.0), contender(2, 1, 20.0, 9_000.0)];
        for mut rule in [PlacementRule::Arrival, PlacementRule::Edf] {
            assert_eq!(rule.next_turn(&b, &cs, 30.0).unwrap().job_id, 2);
        }
        let none = [contender(1, 7, 10.0, 100.0)];
        assert!(PlacementRule::Edf.next_turn(&b, &none, 30.0).is_none());
    }

    /// The learned placement chooses among the profiles of the job's
    /// compute size and room only: a bigger slice, or a memory variant
    /// whose room is bigger (1g.10gb for one shard, issue 55), would use
    /// shards Slurm counts as free.
    #[test]
    fn learned_candidates_keep_the_jobs_compute_size() {
        let b = half_busy();
        let names = |c: &Contender| -> Vec<String> {
            c.candidates(&b).iter().map(|(_, p, _)| p.name()).collect()
        };
        assert_eq!(names(&contender(1, 1, 0.0, 9e9)), ["1g.5gb"]);
        assert_eq!(names(&contender(2, 4, 0.0, 9e9)), ["4g.20gb"]);
        let roomy = Contender {
            need: Need {
                slices: 1,
                memory_gb: Some(8.0),
            },
            ..contender(3, 1, 0.0, 9e9)
        };
        assert_eq!(names(&roomy), ["1g.10gb"]);
        assert!(names(&contender(4, 7, 0.0, 9e9)).is_empty());
    }
}
