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

use crate::config::HoldRule;
use crate::mig::{Geometry, Layout, OfferPolicy, OfferRule};
use crate::slurm::GresGpu;

/// The GRES type of GPU `index` in gres.conf (`Type=mig<index>`): how a
/// hold names its GPU (and what `smartmig doctor` checks gres.conf for).
pub fn gres_type(index: u32) -> String {
    format!("mig{index}")
}

/// Whether Slurm's gres.conf lets a hold name each GPU, as `slurmd -G`
/// printed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GresTyping {
    /// Not known (yet): Slurm has not answered, or the check is not made.
    Unknown,
    /// slurmd lists no gpu GRES for this node.
    NoGpus,
    /// Every GPU i has `Type=mig<i>`.
    Typed { gpus: usize },
    /// Some GPU lacks its own type: what is wrong, in words.
    Untyped(String),
}

/// Reads the per-GPU types from slurmd's gpu GRES (Slurm copies a GPU's
/// type to its shards, and refuses a shard line of another type).
pub fn typing(gres: &[GresGpu]) -> GresTyping {
    if gres.is_empty() {
        return GresTyping::NoGpus;
    }
    let wrong: Vec<String> = gres
        .iter()
        .filter(|g| g.gres_type.as_deref() != Some(gres_type(g.index).as_str()))
        .map(|g| {
            format!(
                "GPU {} ({}) has {}",
                g.index,
                g.file,
                g.gres_type
                    .as_deref()
                    .map_or("no Type".to_string(), |t| format!("Type={t}"))
            )
        })
        .collect();
    if wrong.is_empty() {
        GresTyping::Typed { gpus: gres.len() }
    } else {
        GresTyping::Untyped(format!(
            "{} (holds need Type=mig<index> on each GPU's gpu and shard lines)",
            wrong.join(", ")
        ))
    }
}

/// What smartmigd does about stranded shards, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldsDecision {
    /// The rule the holds follow; `None`: no holds.
    pub rule: Option<OfferPolicy>,
    /// Why, in words (the start-up log line and `smartmig status`).
    pub reason: String,
    /// Whether smartmigd talks to Slurm at all (`slurm.enabled`): without
    /// Slurm there is nothing to hold, and no holds is no fault.
    pub slurm: bool,
}

impl HoldsDecision {
    /// `adaptive`, `any-mix`, `next-job`, `off`, or `no-slurm` (Slurm
    /// queries are off).
    pub fn state(&self) -> &'static str {
        match self.rule {
            Some(policy) => policy.name(),
            None if !self.slurm => "no-slurm",
            None => "off",
        }
    }
}

/// Where the migration of an untyped gres.conf is described.
pub const MIGRATION_DOC: &str = "docs/slurm-integration.md §9, \"Migrating an untyped gres.conf\"";

/// The holds smartmigd runs (issue 56): `auto` (the default) holds by
/// `adaptive` (issue 55) where gres.conf gives each GPU its own type and runs without
/// holds where it does not (an existing site's untyped gres.conf: a hold
/// could not name its GPU) or where Slurm has not said yet; an explicit
/// rule is followed unless gres.conf is known to be untyped.
pub fn decide(configured: HoldRule, typing: &GresTyping, slurm_enabled: bool) -> HoldsDecision {
    let off = |reason: String| HoldsDecision {
        rule: None,
        reason,
        slurm: slurm_enabled,
    };
    let asked = configured.name();
    if !slurm_enabled {
        return off("Slurm queries are off (slurm.enabled = false)".into());
    }
    if configured == HoldRule::Off {
        return off("holds = \"off\" in smartmig.toml: Slurm may place jobs on shards MIG cannot build (requeues, failed interactive steps)".into());
    }
    let rule = configured.offer_rule();
    match typing {
        GresTyping::Typed { gpus } => HoldsDecision {
            rule,
            slurm: true,
            reason: format!(
                "holds = \"{asked}\"{}; gres.conf gives each of the {gpus} GPU(s) its own type (mig0..mig{}), so smartmigd holds the shards MIG cannot build",
                if configured == HoldRule::Auto { " (the default)" } else { "" },
                gpus.saturating_sub(1)
            ),
        },
        GresTyping::Untyped(what) => off(format!(
            "holds = \"{asked}\", but gres.conf has no per-GPU types: {what}; smartmigd runs without holds, so Slurm may place jobs on shards MIG cannot build (requeues, failed interactive steps). To fix: {MIGRATION_DOC}"
        )),
        GresTyping::NoGpus => off(format!(
            "holds = \"{asked}\", but slurmd lists no gpu GRES for this node; smartmigd runs without holds"
        )),
        GresTyping::Unknown if configured == HoldRule::Auto => off(
            "holds = \"auto\": Slurm has not said yet whether gres.conf gives each GPU its own type (slurmd -G); no holds until it does".into(),
        ),
        GresTyping::Unknown => HoldsDecision {
            rule,
            slurm: true,
            reason: format!("holds = \"{asked}\" in smartmig.toml; gres.conf's types not checked (slurmd -G has not answered)"),
        },
    }
}

/// One GPU as the hold planner sees it.
#[derive(Clone, Copy, Debug)]
pub struct GpuShards {
    pub index: u32,
    pub geometry: &'static Geometry,
    /// Instances held by jobs (or being made for one).
    pub busy: Layout,
    /// Shards Slurm has given to jobs on this GPU: the bills of the jobs
    /// on busy instances (less than an instance's compute slices when it
    /// was lent) plus those of jobs still waiting for an instance.
    pub used: u8,
    /// Seconds since a job was last turned away or requeued on this GPU
    /// (`None`: not since smartmigd started): the adaptive holds' memory.
    pub since_collision_s: Option<u64>,
}

impl GpuShards {
    /// The offer rule this GPU's holds follow now under `policy`.
    pub fn rule(&self, policy: OfferPolicy) -> OfferRule {
        policy.on_gpu(self.since_collision_s)
    }

    /// Shards this GPU should hold: its free shards in Slurm's count beyond
    /// what MIG can build next to the busy instances.
    pub fn target(&self, policy: OfferPolicy) -> u8 {
        let free = self.geometry.spec.compute_slices.saturating_sub(self.used);
        self.geometry.stranded(self.busy, free, self.rule(policy))
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
pub fn plan(gpus: &[GpuShards], holds: &[Hold], rule: OfferPolicy) -> Vec<Step> {
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
            since_collision_s: None,
        }
    }

    const NEXT: OfferPolicy = OfferPolicy::Fixed(OfferRule::NextJob);

    fn slurmd(types: &[Option<&str>]) -> Vec<GresGpu> {
        types
            .iter()
            .enumerate()
            .map(|(i, t)| GresGpu {
                index: i as u32,
                file: format!("/dev/nvidia{i}"),
                mig_type: None,
                gres_type: t.map(str::to_string),
            })
            .collect()
    }

    #[test]
    fn typing_needs_mig_index_on_every_gpu() {
        assert_eq!(
            typing(&slurmd(&[Some("mig0"), Some("mig1")])),
            GresTyping::Typed { gpus: 2 }
        );
        assert_eq!(typing(&[]), GresTyping::NoGpus);
        let GresTyping::Untyped(why) = typing(&slurmd(&[None, None])) else {
            panic!("untyped gres.conf taken for typed");
        };
        assert!(why.contains("GPU 0 (/dev/nvidia0) has no Type"), "{why}");
        // Swapped or shared types name the wrong GPU: not typed.
        let GresTyping::Untyped(why) = typing(&slurmd(&[Some("mig1"), Some("mig0")])) else {
            panic!("swapped types taken for typed");
        };
        assert!(why.contains("GPU 0 (/dev/nvidia0) has Type=mig1"), "{why}");
        assert!(matches!(
            typing(&slurmd(&[Some("a100"), Some("a100")])),
            GresTyping::Untyped(_)
        ));
    }

    #[test]
    fn the_default_holds_adaptively_where_gres_conf_is_typed_and_not_elsewhere() {
        let typed = GresTyping::Typed { gpus: 2 };
        let untyped = GresTyping::Untyped("GPU 0 has no Type".into());
        let d = decide(HoldRule::Auto, &typed, true);
        assert_eq!(d.rule, Some(OfferPolicy::Adaptive));
        assert_eq!(d.state(), "adaptive");
        assert!(d.reason.contains("(the default)"), "{}", d.reason);
        let d = decide(HoldRule::Auto, &untyped, true);
        assert_eq!(d.rule, None);
        assert!(d.reason.contains("no per-GPU types"), "{}", d.reason);
        assert!(d.reason.contains(MIGRATION_DOC), "{}", d.reason);
        // Not known yet: no holds by default (a hold could not name its GPU).
        assert_eq!(
            decide(HoldRule::Auto, &GresTyping::Unknown, true).rule,
            None
        );
        assert_eq!(decide(HoldRule::Auto, &GresTyping::NoGpus, true).rule, None);
        // Without Slurm queries nothing is held, whatever the setting.
        assert_eq!(decide(HoldRule::AnyMix, &typed, false).rule, None);
        assert_eq!(decide(HoldRule::Auto, &typed, false).rule, None);
        assert_eq!(decide(HoldRule::Auto, &typed, false).state(), "no-slurm");
        assert_eq!(decide(HoldRule::Auto, &untyped, true).state(), "off");
    }

    #[test]
    fn an_explicit_rule_is_followed_unless_gres_conf_cannot_name_the_gpus() {
        let typed = GresTyping::Typed { gpus: 2 };
        assert_eq!(decide(HoldRule::NextJob, &typed, true).rule, Some(NEXT));
        assert_eq!(decide(HoldRule::Off, &typed, true).rule, None);
        let d = decide(HoldRule::AnyMix, &GresTyping::Untyped("x".into()), true);
        assert_eq!(d.rule, None);
        assert!(
            d.reason.starts_with("holds = \"any-mix\", but gres.conf"),
            "{}",
            d.reason
        );
        // Slurm not asked yet: the admin's explicit choice stands.
        assert_eq!(
            decide(HoldRule::AnyMix, &GresTyping::Unknown, true).rule,
            Some(OfferPolicy::Fixed(OfferRule::AnyMix))
        );
        assert_eq!(decide(HoldRule::AnyMix, &typed, true).state(), "any-mix");
    }

    /// Beside a busy `3g@4` a 4g fits but 3 + 1 does not: adaptive holds
    /// nothing there until a job was turned away on the GPU, then, for an
    /// hour, the shard that `any-mix` keeps back.
    #[test]
    fn adaptive_holds_the_any_mix_shard_only_after_a_collision() {
        let g = gpu(0, &[(3, 4, 4)], 0);
        assert_eq!(plan(&[g], &[], OfferPolicy::Adaptive), vec![]);
        let collided = GpuShards {
            since_collision_s: Some(10),
            ..g
        };
        assert_eq!(
            plan(&[collided], &[], OfferPolicy::Adaptive),
            vec![Step::Hold { gpu: 0, shards: 1 }]
        );
        let long_ago = GpuShards {
            since_collision_s: Some(crate::mig::COLLISION_MEMORY_S),
            ..g
        };
        assert_eq!(plan(&[long_ago], &[], OfferPolicy::Adaptive), vec![]);
    }

    /// A job billed 1 shard lent the whole 7g: Slurm counts 6 free shards,
    /// MIG can build nothing beside the busy 7g, so all 6 are held.
    #[test]
    fn a_lent_instance_holds_what_its_job_is_not_billed() {
        let lent = GpuShards {
            used: 1,
            ..gpu(0, &[(7, 8, 0)], 0)
        };
        assert_eq!(
            plan(&[lent], &[], NEXT),
            vec![Step::Hold { gpu: 0, shards: 6 }]
        );
        // Billed what it takes, nothing is stranded.
        assert_eq!(plan(&[gpu(0, &[(7, 8, 0)], 0)], &[], NEXT), vec![]);
    }

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
