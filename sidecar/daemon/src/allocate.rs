//! The allocation decision: which instance a request gets, as a pure function
//! of one GPU's state. No IO, no clocks: the shell ([`super::server`]) runs
//! the returned [`Plan`] against the backend and records the result with
//! [`GpuBook`]'s methods, so everything that can go wrong in the decision is
//! unit- and property-tested here.
//!
//! Order of preference (brief §2): reuse an idle instance of the right
//! compute size with the least sufficient memory, else create one in free
//! space at the fragmentation-aware spot ([`Geometry::best_spot`]), else
//! re-shape idle instances ([`Geometry::reshape_for`]), else no fit; among
//! these, the first that leaves room for what is [`Beside`] the request
//! ([`Geometry::choose_spot`]). All
//! geometry comes from [`crate::mig`]; nothing is re-implemented here.

use crate::health::GpuHealth;
use crate::mig::{
    select_profile, Geometry, GpuNow, Layout, Mix, OfferRule, ProfileSpec, SelectError, SpotId, Way,
};

pub use crate::formats::journal::Assignment;

/// Job `job_id` of uid 1000, since time 0, nothing else known: the unit
/// tests' holder.
#[cfg(test)]
pub(crate) fn test_assignment(job_id: u64) -> Assignment {
    Assignment {
        job_id,
        step: None,
        uid: 1000,
        since: 0,
        deadline: None,
        time_limit_s: None,
        wait_s: 0,
        billed: None,
    }
}

/// One MIG instance the daemon knows of.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    pub placement: SpotId,
    /// `MIG-<uuid>`, stable for the instance's life.
    pub uuid: String,
    /// The GPU-instance id the backend reports (DCGM's `GPU_I_ID`), if any.
    pub gi: Option<u32>,
    pub job: Option<Assignment>,
    /// Unix seconds since the instance is idle (creation or last release).
    pub idle_since: u64,
}

/// What a request needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Need {
    pub slices: u8,
    pub memory_gb: Option<f64>,
}

/// What to do to satisfy a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Hand out this idle instance.
    Reuse { uuid: String },
    /// Create an instance at this placement in free space.
    Create { placement: SpotId },
    /// Destroy these idle instances, then create at `placement`.
    Reshape {
        destroy: Vec<String>,
        placement: SpotId,
    },
}

/// What a choice of instance must leave room for besides the request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Beside {
    /// The other jobs Slurm placed on this GPU that hold no instance yet
    /// (the rest of a scheduling pass, allocates waiting for room).
    pub mates: Mix,
    /// With holds on, what Slurm may still send here is kept largest.
    pub holds: Option<OfferRule>,
    /// An idle bigger instance may be lent ([`GpuNow::lend`]; the rule
    /// lends only with holds on, which keep Slurm off the unbilled shards).
    pub lend: bool,
}

/// Why a request cannot be served now.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// No profile of this GPU serves the request at all (never will).
    #[error(transparent)]
    Select(#[from] SelectError),
    /// The profile exists but busy instances leave no room (may change on release).
    #[error("{reason}")]
    NoFit {
        profile: &'static ProfileSpec,
        reason: String,
    },
    /// The GPU is out of service after a GPU-fatal XID ([`crate::health`]).
    #[error("GPU {gpu} is out of service after XID {xid} (the node is drained: reset the GPU, then resume the node)")]
    Unhealthy { gpu: u32, xid: u64 },
}

/// The daemon's view of one GPU: its instances and who holds them.
#[derive(Clone, Debug)]
pub struct GpuBook {
    pub index: u32,
    pub geometry: &'static Geometry,
    pub instances: Vec<Instance>,
    /// Unix seconds when the GPU last became fully idle.
    pub idle_since: u64,
    /// XID marks: the GPU's and its instances' ([`crate::health`]).
    pub health: GpuHealth,
    /// Unix seconds when a job was last turned away or gave up waiting
    /// for room here: the adaptive holds hold strictly for a while after
    /// ([`crate::mig::OfferPolicy`]). Not journaled: a restart forgets it.
    pub collided_at: Option<u64>,
}

impl GpuBook {
    pub fn new(index: u32, geometry: &'static Geometry, now: u64) -> Self {
        GpuBook {
            index,
            geometry,
            instances: Vec::new(),
            idle_since: now,
            health: GpuHealth::default(),
            collided_at: None,
        }
    }

    /// A job was turned away or gave up waiting for room here at `now`
    /// (Unix seconds): the adaptive holds hold strictly for a while.
    pub fn mark_collision(&mut self, now: u64) {
        self.collided_at = Some(now);
    }

    /// Seconds since a job last collided here at `now` (Unix seconds).
    pub fn since_collision_s(&self, now: u64) -> Option<u64> {
        self.collided_at.map(|t| now.saturating_sub(t))
    }

    /// Every instance as a layout.
    pub fn layout(&self) -> Layout {
        self.instances.iter().map(|i| i.placement).collect()
    }

    /// The instances held by jobs.
    pub fn busy(&self) -> Layout {
        self.instances
            .iter()
            .filter(|i| i.job.is_some())
            .map(|i| i.placement)
            .collect()
    }

    /// Shards Slurm billed the jobs on this GPU's busy instances: each
    /// job's bill, which is less than its instance's compute slices when it
    /// was lent a bigger one (the instance's slices for records without
    /// a bill).
    pub fn billed_shards(&self) -> u8 {
        self.instances
            .iter()
            .filter_map(|i| {
                let a = i.job.as_ref()?;
                let compute = self.geometry.spot(i.placement).compute();
                Some(a.billed.map_or(compute, |b| b.min(compute)))
            })
            .fold(0u8, u8::saturating_add)
    }

    pub fn find_uuid(&self, uuid: &str) -> Option<&Instance> {
        self.instances.iter().find(|i| i.uuid == uuid)
    }

    /// The instance job `job_id` holds on this GPU.
    pub fn find_job(&self, job_id: u64) -> Option<&Instance> {
        self.instances
            .iter()
            .find(|i| i.job.as_ref().is_some_and(|a| a.job_id == job_id))
    }

    /// Decides how to serve `need` (see the module docs for the order).
    pub fn plan(&self, need: Need) -> Result<(&'static ProfileSpec, Plan), Refusal> {
        self.plan_beside(need, &Beside::default())
    }

    /// [`GpuBook::plan`], choosing among the ways to serve `need` the one
    /// that leaves room for what is `beside` it ([`Geometry::choose_spot`]).
    pub fn plan_beside(
        &self,
        need: Need,
        beside: &Beside,
    ) -> Result<(&'static ProfileSpec, Plan), Refusal> {
        self.plan_exact_beside(need, None, beside)
    }

    /// [`GpuBook::plan_beside`] for a job that asked for `exact` by name
    /// (`--mig-profile`), which is served as it is: a memory variant comes
    /// billed its room's shards (`need.slices` = 2 for `1g.10gb` on an
    /// A100-40GB, issue 55), for which the profile choice would give the
    /// room (`2g.10gb`) instead of the profile asked for.
    pub fn plan_exact_beside(
        &self,
        need: Need,
        exact: Option<&'static ProfileSpec>,
        beside: &Beside,
    ) -> Result<(&'static ProfileSpec, Plan), Refusal> {
        if let Some(mark) = self.health.fatal {
            return Err(Refusal::Unhealthy {
                gpu: self.index,
                xid: mark.xid,
            });
        }
        let profile = match exact {
            Some(p) => p,
            None => select_profile(self.geometry.spec, need.slices, need.memory_gb)?,
        };
        // A profile asked for by name is served exactly, never lent.
        let beside = Beside {
            lend: beside.lend && exact.is_none(),
            ..*beside
        };
        let plan = self.plan_profile_beside(profile, need.memory_gb.unwrap_or(0.0), &beside)?;
        let got = match &plan {
            Plan::Reuse { uuid } => self
                .find_uuid(uuid)
                .map_or(profile, |i| self.geometry.spot(i.placement).profile),
            _ => profile,
        };
        Ok((got, plan))
    }

    /// How to get an instance of `profile`'s compute size with at least
    /// `want_gb` of memory: reuse the idle one with the least sufficient
    /// memory, else create `profile` in free space, else re-shape idle
    /// instances for it. An unhealthy instance is never reused (it waits,
    /// idle, for its rebuild; a re-shape may destroy it).
    pub fn plan_profile(
        &self,
        profile: &'static ProfileSpec,
        want_gb: f64,
    ) -> Result<Plan, Refusal> {
        self.plan_profile_beside(profile, want_gb, &Beside::default())
    }

    /// [`GpuBook::plan_profile`] among every way to serve the profile,
    /// choosing as the shared serving rule does ([`Geometry::serve`], the
    /// rule the simulators model too).
    pub fn plan_profile_beside(
        &self,
        profile: &'static ProfileSpec,
        want_gb: f64,
        beside: &Beside,
    ) -> Result<Plan, Refusal> {
        let now = GpuNow {
            layout: self.layout(),
            taken: self.busy(),
            // An unhealthy instance is never reused (it waits, idle, for
            // its rebuild; a re-shape may destroy it).
            reusable: self
                .instances
                .iter()
                .filter(|i| i.job.is_none() && self.health.instance_ok(&i.uuid))
                .map(|i| i.placement)
                .collect(),
            may_build: true,
            lend: beside.lend,
        };
        let no_fit = || Refusal::NoFit {
            profile,
            reason: self.no_fit_reason(profile),
        };
        let (placement, way) = self
            .geometry
            .serve(now, profile, want_gb, &beside.mates, beside.holds)
            .ok_or_else(no_fit)?;
        let uuid_at = |id: SpotId| {
            self.instances
                .iter()
                .find(|i| i.placement == id)
                .map(|i| i.uuid.clone())
        };
        Ok(match way {
            Way::Reuse | Way::Lend => Plan::Reuse {
                uuid: uuid_at(placement).ok_or_else(no_fit)?,
            },
            Way::Create => Plan::Create { placement },
            Way::Reshape { destroy } => Plan::Reshape {
                destroy: destroy.iter().filter_map(uuid_at).collect(),
                placement,
            },
        })
    }

    /// Idle instances of exactly `profile`.
    pub fn idle_of(&self, profile: &ProfileSpec) -> u32 {
        self.instances
            .iter()
            .filter(|i| i.job.is_none())
            .filter(|i| self.geometry.spot(i.placement).profile.shape == profile.shape)
            .count() as u32
    }

    /// A sentence a user can act on: what blocks the profile on this GPU.
    /// It goes to the job's user, so it names the busy instances but not
    /// the jobs holding them (other users' job ids stay private, as with
    /// Slurm's `PrivateData=jobs`); [`GpuBook::holders`] gives those to the
    /// daemon's log.
    pub fn no_fit_reason(&self, profile: &ProfileSpec) -> String {
        let g = self.geometry;
        let busy: Vec<String> = self
            .instances
            .iter()
            .filter(|i| i.job.is_some())
            .map(|i| g.spot(i.placement).describe().to_string())
            .collect();
        format!(
            "no {} slice can be made on GPU {}: busy instances {}",
            profile.name(),
            self.index,
            if busy.is_empty() {
                "none".to_string()
            } else {
                busy.join(", ")
            }
        )
    }

    /// The jobs holding instances here, for the daemon's log.
    pub fn holders(&self) -> Vec<u64> {
        self.instances
            .iter()
            .filter_map(|i| i.job.as_ref().map(|a| a.job_id))
            .collect()
    }

    /// Records a new instance (after the backend created it).
    pub fn add_instance(&mut self, placement: SpotId, uuid: String, now: u64) {
        assert!(
            self.geometry.fits(self.layout(), placement),
            "instance does not fit the layout"
        );
        self.instances.push(Instance {
            placement,
            uuid,
            gi: None,
            job: None,
            idle_since: now,
        });
        self.instances.sort_by_key(|i| i.placement);
    }

    /// Records the GPU-instance id the backend gave instance `uuid`.
    pub fn set_gpu_instance_id(&mut self, uuid: &str, gi: Option<u32>) {
        if let Some(inst) = self.instances.iter_mut().find(|i| i.uuid == uuid) {
            inst.gi = gi;
        }
    }

    /// Forgets a destroyed instance. Panics if a job holds it: destroying a
    /// busy instance is the one thing the daemon must never do.
    pub fn remove_instance(&mut self, uuid: &str) -> Option<Instance> {
        let pos = self.instances.iter().position(|i| i.uuid == uuid)?;
        assert!(
            self.instances[pos].job.is_none(),
            "removing busy instance {uuid}"
        );
        self.health.forget(uuid);
        Some(self.instances.remove(pos))
    }

    /// Idle instances an XID marked unhealthy: destroy and rebuild them.
    pub fn rebuild_due(&self) -> Vec<(String, SpotId)> {
        self.instances
            .iter()
            .filter(|i| i.job.is_none() && !self.health.instance_ok(&i.uuid))
            .map(|i| (i.uuid.clone(), i.placement))
            .collect()
    }

    /// The instance NVML calls GPU instance `gi` here, if the daemon has it.
    pub fn find_gpu_instance(&self, gi: u32) -> Option<&Instance> {
        self.instances.iter().find(|i| i.gi == Some(gi))
    }

    /// Gives an idle instance to a job. Panics if the instance is held or the
    /// job already holds another one here: an instance is never shared.
    pub fn assign(&mut self, uuid: &str, assignment: Assignment) {
        assert!(
            self.find_job(assignment.job_id).is_none(),
            "job {} already holds an instance on GPU {}",
            assignment.job_id,
            self.index
        );
        let Some(inst) = self.instances.iter_mut().find(|i| i.uuid == uuid) else {
            panic!("assigning unknown instance {uuid}");
        };
        assert!(
            inst.job.is_none(),
            "instance {uuid} is already assigned to job {:?}",
            inst.job.as_ref().map(|a| a.job_id)
        );
        inst.job = Some(assignment);
    }

    /// Releases every instance of `job_id`; returns how many.
    pub fn release(&mut self, job_id: u64, now: u64) -> u32 {
        let mut n = 0;
        for inst in &mut self.instances {
            if inst.job.as_ref().is_some_and(|a| a.job_id == job_id) {
                inst.job = None;
                inst.idle_since = now;
                n += 1;
            }
        }
        if n > 0 && self.busy().is_empty() {
            self.idle_since = now;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::{GpuModel, Shape};
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn book() -> GpuBook {
        GpuBook::new(1, Geometry::of(GpuModel::A100_40gb), 0)
    }

    fn job(id: u64) -> Assignment {
        crate::allocate::test_assignment(id)
    }

    /// Runs a plan the way the shell does, with made-up uuids.
    fn apply(b: &mut GpuBook, plan: &Plan, serial: &mut u32) -> String {
        match plan {
            Plan::Reuse { uuid } => uuid.clone(),
            Plan::Create { placement } => {
                *serial += 1;
                let uuid = format!("MIG-{serial}");
                b.add_instance(*placement, uuid.clone(), 0);
                uuid
            }
            Plan::Reshape { destroy, placement } => {
                for u in destroy {
                    b.remove_instance(u).unwrap();
                }
                *serial += 1;
                let uuid = format!("MIG-{serial}");
                b.add_instance(*placement, uuid.clone(), 0);
                uuid
            }
        }
    }

    fn allocate(
        b: &mut GpuBook,
        id: u64,
        k: u8,
        mem: Option<f64>,
        s: &mut u32,
    ) -> Result<(String, Plan), Refusal> {
        let (_, plan) = b.plan(Need {
            slices: k,
            memory_gb: mem,
        })?;
        let uuid = apply(b, &plan, s);
        b.assign(&uuid, job(id));
        Ok((uuid, plan))
    }

    #[test]
    fn unhealthy_instances_are_not_reused_and_a_fatal_gpu_refuses() {
        let mut b = book();
        let mut s = 0;
        let need = Need {
            slices: 1,
            memory_gb: None,
        };
        let (sick, _) = allocate(&mut b, 1, 1, None, &mut s).unwrap();
        b.release(1, 0);
        b.health.record(94, Some(&sick), 0);
        // The idle, unhealthy 1g is not reused: a new one is made beside it.
        let (_, plan) = b.plan(need).unwrap();
        assert!(matches!(plan, Plan::Create { .. }), "{plan:?}");
        assert_eq!(b.rebuild_due().len(), 1);
        b.remove_instance(&sick).unwrap();
        assert!(b.rebuild_due().is_empty() && b.health.instance_ok(&sick));
        b.health.record(79, None, 0);
        assert_eq!(b.plan(need), Err(Refusal::Unhealthy { gpu: 1, xid: 79 }));
        b.health.clear();
        assert!(b.plan(need).is_ok());
    }

    #[test]
    fn a_burst_is_served_whole_when_each_allocate_knows_the_rest() {
        // One scheduling pass starts 2, 1, 1 and 3 shards on an empty
        // A100, in that order (measured on the real Slurm, issue 42).
        let burst = [2u8, 1, 1, 3];
        let serve = |aware: bool, idle_whole: bool| -> Result<usize, Refusal> {
            let mut b = book();
            let mut s = 0;
            if idle_whole {
                // The GPU a whole-GPU job just left: every way is a re-shape.
                allocate(&mut b, 99, 7, None, &mut s)?;
                b.release(99, 0);
            }
            for (n, &k) in burst.iter().enumerate() {
                let beside = Beside {
                    mates: if aware {
                        Mix::of(burst[n + 1..].iter().copied())
                    } else {
                        Mix::default()
                    },
                    holds: None,
                    lend: false,
                };
                let need = Need {
                    slices: k,
                    memory_gb: None,
                };
                let (_, plan) = b.plan_beside(need, &beside)?;
                let uuid = apply(&mut b, &plan, &mut s);
                b.assign(&uuid, job(n as u64 + 1));
            }
            Ok(b.busy().iter().count())
        };
        // One at a time, the 3g finds no room; told of the rest, all four
        // fit, on an empty GPU and on one whose idle 7g is re-shaped.
        for idle_whole in [false, true] {
            let alone = serve(false, idle_whole);
            assert!(matches!(alone, Err(Refusal::NoFit { .. })), "{alone:?}");
            assert_eq!(serve(true, idle_whole), Ok(4), "{idle_whole}");
        }
    }

    #[test]
    fn plan_beside_nothing_is_plan() {
        let mut b = book();
        let mut s = 0;
        allocate(&mut b, 1, 3, None, &mut s).unwrap();
        allocate(&mut b, 2, 1, None, &mut s).unwrap();
        b.release(2, 0);
        for k in [1u8, 2, 3, 4, 7] {
            let need = Need {
                slices: k,
                memory_gb: None,
            };
            assert_eq!(b.plan(need), b.plan_beside(need, &Beside::default()), "{k}");
        }
    }

    #[test]
    fn picks_profile_by_slices_and_memory() {
        let b = book();
        let (p, plan) = b
            .plan(Need {
                slices: 3,
                memory_gb: Some(15.0),
            })
            .unwrap();
        assert_eq!(p.name(), "3g.20gb");
        assert!(matches!(plan, Plan::Create { .. }));
        let (p, _) = b
            .plan(Need {
                slices: 5,
                memory_gb: None,
            })
            .unwrap();
        assert_eq!(p.name(), "7g.40gb");
        assert!(matches!(
            b.plan(Need {
                slices: 8,
                memory_gb: None
            }),
            Err(Refusal::Select(SelectError::TooManySlices { .. }))
        ));
    }

    #[test]
    fn seven_ones_fill_the_gpu_then_no_fit_names_the_blockers() {
        let mut b = book();
        let mut s = 0;
        for id in 1..=7 {
            allocate(&mut b, id, 1, None, &mut s).unwrap();
        }
        assert_eq!(b.geometry.picture(b.layout()), "1|1|1|1|1|1|1|.");
        let err = allocate(&mut b, 8, 1, None, &mut s).unwrap_err();
        let Refusal::NoFit { reason, .. } = err else {
            panic!()
        };
        assert!(
            reason.starts_with(
                "no 1g.5gb slice can be made on GPU 1: busy instances 1g.5gb@0, 1g.5gb@1"
            ),
            "{reason}"
        );
        assert!(!reason.contains("job"), "{reason}");
        let mut holders = b.holders();
        holders.sort_unstable();
        assert_eq!(holders, (1..=7).collect::<Vec<u64>>());
    }

    #[test]
    fn reuse_prefers_least_sufficient_memory() {
        let mut b = book();
        let g = b.geometry;
        let wide = g.spot_id(Shape::new(1, 2), 0).unwrap();
        let narrow = g.spot_id(Shape::new(1, 1), 6).unwrap();
        b.add_instance(wide, "MIG-wide".into(), 0);
        b.add_instance(narrow, "MIG-narrow".into(), 0);
        let (_, plan) = b
            .plan(Need {
                slices: 1,
                memory_gb: None,
            })
            .unwrap();
        assert_eq!(
            plan,
            Plan::Reuse {
                uuid: "MIG-narrow".into()
            }
        );
        let (_, plan) = b
            .plan(Need {
                slices: 1,
                memory_gb: Some(8.0),
            })
            .unwrap();
        assert_eq!(
            plan,
            Plan::Reuse {
                uuid: "MIG-wide".into()
            }
        );
        // A 2g request does not take a 1g, even if idle.
        let (_, plan) = b
            .plan(Need {
                slices: 2,
                memory_gb: None,
            })
            .unwrap();
        assert!(matches!(plan, Plan::Create { .. }));
    }

    #[test]
    fn idle_ones_are_reshaped_into_a_seven() {
        let mut b = book();
        let mut s = 0;
        for id in 1..=7 {
            allocate(&mut b, id, 1, None, &mut s).unwrap();
        }
        for id in 1..=7 {
            assert_eq!(b.release(id, 5), 1);
        }
        let (uuid, plan) = allocate(&mut b, 9, 7, None, &mut s).unwrap();
        let Plan::Reshape { destroy, .. } = plan else {
            panic!("{plan:?}")
        };
        assert_eq!(destroy.len(), 7);
        assert_eq!(b.geometry.picture(b.layout()), "77777777");
        assert_eq!(b.find_job(9).unwrap().uuid, uuid);
    }

    #[test]
    #[should_panic(expected = "already assigned")]
    fn assigning_twice_panics() {
        let mut b = book();
        let mut s = 0;
        let (uuid, _) = allocate(&mut b, 1, 1, None, &mut s).unwrap();
        b.assign(&uuid, job(2));
    }

    #[test]
    #[should_panic(expected = "removing busy instance")]
    fn removing_busy_panics() {
        let mut b = book();
        let mut s = 0;
        let (uuid, _) = allocate(&mut b, 1, 1, None, &mut s).unwrap();
        b.remove_instance(&uuid);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Alloc { job: u64, k: u8, mem: Option<u8> },
        Release { job: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..12, 1u8..=7, proptest::option::of(0u8..=40))
                .prop_map(|(job, k, mem)| Op::Alloc { job, k, mem }),
            (0u64..12).prop_map(|job| Op::Release { job }),
        ]
    }

    proptest! {
        /// Random allocate/release sequences: the layout stays valid, every
        /// busy instance survives every step with its job, and no instance is
        /// ever held by two jobs.
        #[test]
        fn never_shares_and_never_destroys_busy(ops in proptest::collection::vec(op(), 1..80), model in 0usize..6) {
            let mut b = GpuBook::new(0, Geometry::of(GpuModel::ALL[model]), 0);
            let mut s = 0;
            let mut held: HashMap<u64, String> = HashMap::new();
            for op in ops {
                match op {
                    Op::Alloc { job: id, k, mem } => {
                        if held.contains_key(&id) { continue; }
                        let busy_before: Vec<(String, u64)> = b.instances.iter()
                            .filter_map(|i| Some((i.uuid.clone(), i.job.as_ref()?.job_id))).collect();
                        let mem = mem.map(f64::from);
                        match b.plan(Need { slices: k, memory_gb: mem }) {
                            Ok((profile, plan)) => {
                                if let Plan::Reshape { destroy, .. } = &plan {
                                    for u in destroy {
                                        prop_assert!(b.find_uuid(u).unwrap().job.is_none());
                                    }
                                }
                                let uuid = apply(&mut b, &plan, &mut s);
                                let inst = b.find_uuid(&uuid).unwrap();
                                let got = b.geometry.spot(inst.placement).profile;
                                prop_assert_eq!(got.shape.compute, profile.shape.compute);
                                prop_assert!(got.shape.compute >= k);
                                prop_assert!(f64::from(got.memory_gb) >= mem.unwrap_or(0.0));
                                b.assign(&uuid, job(id));
                                held.insert(id, uuid);
                            }
                            Err(Refusal::Select(_)) => {}
                            Err(Refusal::NoFit { .. }) => {
                                // Truly no room: no placement of the profile, tried one
                                // by one, makes a valid layout with the busy instances
                                // (destroying every idle instance would not help).
                                let profile = select_profile(b.geometry.spec, k, mem).unwrap();
                                let g = b.geometry;
                                let busy = b.busy();
                                for id in g.ids().filter(|&id| g.spot(id).shape() == profile.shape) {
                                    prop_assert!(
                                        busy.contains(id) || !g.is_valid(busy.with(id)),
                                        "no fit for {} although {} fits beside the busy {}",
                                        profile.name(), g.spot(id).describe(), g.picture(busy)
                                    );
                                }
                            }
                            Err(Refusal::Unhealthy { .. }) => {
                                prop_assert!(false, "no XID was recorded, yet the GPU is unhealthy");
                            }
                        }
                        for (uuid, job_id) in busy_before {
                            let inst = b.find_uuid(&uuid);
                            prop_assert!(inst.is_some(), "busy instance destroyed");
                            prop_assert_eq!(inst.unwrap().job.as_ref().unwrap().job_id, job_id);
                        }
                    }
                    Op::Release { job: id } => {
                        let n = b.release(id, 1);
                        prop_assert_eq!(n, u32::from(held.remove(&id).is_some()));
                    }
                }
                prop_assert!(b.geometry.is_valid(b.layout()));
                let mut owners: Vec<u64> = b.instances.iter().filter_map(|i| Some(i.job.as_ref()?.job_id)).collect();
                let n = owners.len();
                owners.sort_unstable();
                owners.dedup();
                prop_assert_eq!(owners.len(), n, "a job holds two instances");
                prop_assert_eq!(n, held.len());
                for (id, uuid) in &held {
                    prop_assert_eq!(&b.find_job(*id).unwrap().uuid, uuid);
                }
            }
        }
    }
}
