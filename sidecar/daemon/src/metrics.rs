//! Prometheus metrics, encoded with `prometheus-client` (OpenMetrics text).
//!
//! Counters and the latency histogram are updated where things happen; the
//! per-profile instance gauges and the energy gauges are recomputed at scrape
//! time from the daemon's books, so they can never drift from the truth.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconfLabel {
    gpu: String,
    op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstanceLabel {
    gpu: String,
    profile: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProfileLabel {
    profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UserLabel {
    user: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestartLabel {
    cause: String,
    decision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabel {
    task: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabel {
    gpu: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct XidLabel {
    gpu: String,
    xid: String,
    class: String,
}

/// A whole GPU labelled as dcgm-exporter labels it.
#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DcgmGpuLabel {
    gpu: String,
    UUID: String,
    Hostname: String,
}

/// One MIG instance labelled as dcgm-exporter labels its series, so that
/// a PromQL join on (`Hostname`, `gpu`, `GPU_I_ID`) pairs them.
#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DcgmLabel {
    gpu: String,
    UUID: String,
    GPU_I_PROFILE: String,
    GPU_I_ID: String,
    Hostname: String,
    /// The job holding it; empty (Prometheus: no label) while idle.
    hpc_job: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SliceLabel {
    gpu: String,
    profile: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunningLabel {
    policy: String,
    role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToLabel {
    to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    configured: String,
    running: String,
    fallback: String,
}

/// One MIG instance for the scrape-time series.
pub struct MigInstance {
    pub gpu: u32,
    /// The parent GPU's UUID (`GPU-...`), empty when the backend has none.
    pub gpu_uuid: String,
    pub profile: String,
    pub gi: Option<u32>,
    pub job: Option<u64>,
    pub compute: u8,
    /// No XID marked it unhealthy ([`crate::health`]).
    pub healthy: bool,
}

/// What the scrape-time gauges show, read from the books at the scrape.
#[derive(Default)]
pub struct Scrape {
    pub instances: Vec<MigInstance>,
    /// Energy used per GPU (J).
    pub energy: Vec<(u32, f64)>,
    /// Per GPU: its UUID and whether it is in service (no GPU-fatal XID).
    pub gpus_healthy: Vec<(u32, String, bool)>,
    pub epilog_missing: bool,
    /// The host name (DCGM's `Hostname`).
    pub hostname: String,
    /// Allocates waiting for room, by profile.
    pub waiting: Vec<(String, i64)>,
    /// Free compute slices that cannot host the largest waiting request,
    /// per GPU.
    pub fragmentation: Vec<(u32, i64)>,
    /// The `policy` setting and the policy running (its name as built).
    pub policy: (String, String),
    /// The policies the shadow chooses between, `(role, name, runs)`:
    /// `learned` (the configured policy) and, while the shadow is on,
    /// `fallback`.
    pub running: Vec<(String, String, bool)>,
}

/// The daemon's metrics.
pub struct Metrics {
    registry: Registry,
    allocations: Family<ResultLabel, Counter>,
    failures: Family<KindLabel, Counter>,
    latency: Histogram,
    reconfigurations: Family<ReconfLabel, Counter>,
    instances: Family<InstanceLabel, Gauge>,
    energy: Family<GpuLabel, Gauge<f64, AtomicU64>>,
    reaped: Counter,
    epilog_missing: Gauge,
    memory_restarts: Family<RestartLabel, Counter>,
    slice_seconds: Family<ProfileLabel, Counter>,
    user_slice_seconds: Family<UserLabel, Counter>,
    wait_seconds: Family<ProfileLabel, Counter>,
    jobs_served: Family<ProfileLabel, Counter>,
    pending_plans: Gauge,
    queue_reads: Family<SourceLabel, Counter>,
    summary_age: Gauge,
    panics: Family<TaskLabel, Counter>,
    epochs: Counter,
    dcgm: Family<DcgmLabel, Gauge>,
    slices: Family<SliceLabel, Gauge>,
    waiting: Family<ProfileLabel, Gauge>,
    fragmentation: Family<GpuLabel, Gauge>,
    reconfiguration_seconds: Family<OpLabel, Histogram>,
    policy: Family<PolicyLabel, Gauge>,
    policy_running: Family<RunningLabel, Gauge>,
    shadow_switches: Family<ToLabel, Counter>,
    xid_events: Family<XidLabel, Counter>,
    gpu_healthy: Family<DcgmGpuLabel, Gauge>,
    instance_healthy: Family<DcgmLabel, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Each family's name (after the `smartmig_` prefix) and help text.
mod help {
    pub const ALLOCATIONS: (&str, &str) = (
        "allocations",
        "Allocate requests by result (existing, reused, created, reshaped, no_fit, error)",
    );
    pub const FAILURES: (&str, &str) =
        ("failures", "Requests answered with an error, by error kind");
    pub const LATENCY: (&str, &str) = (
        "allocation_latency_seconds",
        "Time from an allocate request to its reply (waiting included)",
    );
    pub const RECONFIGURATIONS: (&str, &str) = (
        "reconfigurations",
        "MIG instances created or destroyed, by GPU and op",
    );
    pub const INSTANCES: (&str, &str) = (
        "instances",
        "MIG instances by GPU, profile and state (busy/idle)",
    );
    pub const ENERGY: (&str, &str) = (
        "energy_joules",
        "Energy used per GPU since the daemon started (modelled on the sim backend, NVML counter on real GPUs)",
    );
    pub const REAPED: (&str, &str) = (
        "reaped_releases",
        "Instances freed because Slurm showed the job ended and no release arrived",
    );
    pub const EPILOG_MISSING: (&str, &str) = (
        "epilog_missing",
        "1 when the reaper freed instances and the plugin's job_epilog never sent a release (slurmd needs a restart)",
    );
    pub const MEMORY_RESTARTS: (&str, &str) = (
        "memory_restarts",
        "Out-of-memory decisions by cause (oom: the job ran out; early: its rising use predicted it would) and decision (requeue_scheduled, retries_exhausted, ...)",
    );
    pub const SLICE_SECONDS: (&str, &str) = (
        "slice_seconds",
        "Compute-slice seconds held by jobs, by profile, counted when the instance is released",
    );
    pub const USER_SLICE_SECONDS: (&str, &str) = (
        "user_slice_seconds",
        "Compute-slice seconds held by jobs, by user, counted when the instance is released",
    );
    pub const WAIT_SECONDS: (&str, &str) = (
        "instance_wait_seconds",
        "Seconds jobs waited in smartmigd for their instance, by profile",
    );
    pub const JOBS_SERVED: (&str, &str) = ("jobs_served", "Instances released by jobs, by profile");
    pub const PENDING_PLANS: (&str, &str) = (
        "pending_plans",
        "Reconfigurations waiting for `smartmig apply` (mode = confirm)",
    );
    pub const QUEUE_READS: (&str, &str) = (
        "queue_reads",
        "How the node learned the Slurm queue, by source (summary: the publisher's file; squeue: asked slurmctld itself; none: held, nothing read)",
    );
    pub const SUMMARY_AGE: (&str, &str) = (
        "cluster_summary_age_seconds",
        "Age of the last cluster summary read (-1: none could be used)",
    );
    pub const PANICS: (&str, &str) = (
        "panics",
        "Panics caught, by task: a request's op (answered with an internal error), epoch, memory_sample or connection (a bug: the log has the details)",
    );
    pub const MIG_INSTANCE: (&str, &str) = (
        "mig_instance_busy",
        "1 while a job holds the MIG instance, 0 while idle; labelled like dcgm-exporter's series (gpu, UUID, GPU_I_PROFILE, GPU_I_ID, Hostname) with the job in hpc_job",
    );
    pub const SLICES: (&str, &str) = (
        "compute_slices",
        "Compute slices in MIG instances, by GPU, profile and state (busy/idle)",
    );
    pub const WAITING: (&str, &str) = (
        "waiting_allocations",
        "Allocates waiting in smartmigd for room, by the profile they would get",
    );
    pub const FRAGMENTATION: (&str, &str) = (
        "fragmented_compute_slices",
        "Free compute slices that cannot host the largest request waiting on the GPU (0: it fits, or none waits)",
    );
    pub const RECONFIGURATION_SECONDS: (&str, &str) = (
        "reconfiguration_duration_seconds",
        "Time of one MIG instance create or destroy (the backend call), by op",
    );
    pub const POLICY: (&str, &str) = (
        "policy_info",
        "1 for the repartitioning policy running: configured (the policy setting), running (what runs) and fallback (true when a learned policy could not load and greedy runs)",
    );
    pub const POLICY_RUNNING: (&str, &str) = (
        "policy_running",
        "1 for the policy whose decisions apply now, 0 for the other: role learned (the policy setting) or fallback (the shadow's, while it is on), with its name",
    );
    pub const SHADOW_SWITCHES: (&str, &str) = (
        "shadow_switches",
        "Hand-overs by the day's shadow, by the role that took over (fallback, learned)",
    );
    pub const XID_EVENTS: (&str, &str) = (
        "xid_events",
        "NVML XID events by GPU, XID and class (gpu_fatal: the GPU is out of service and the node drained; instance: the MIG instance is rebuilt; counted: logged only)",
    );
    pub const GPU_HEALTHY: (&str, &str) = (
        "gpu_healthy",
        "1 while the GPU is in service, 0 after a GPU-fatal XID until an admin resumes the node; labelled like dcgm-exporter's series (gpu, UUID, Hostname)",
    );
    pub const INSTANCE_HEALTHY: (&str, &str) = (
        "mig_instance_healthy",
        "1 for a healthy MIG instance, 0 after an XID marked it (rebuilt once idle); labelled like smartmig_mig_instance_busy",
    );
    pub const EPOCHS: (&str, &str) = (
        "epochs",
        "Epochs of the repartitioning loop that ran to the end",
    );
}

/// Registers `metric` under `name` and returns it (a family or counter is
/// a handle: the registry and the caller share it).
fn registered<M: Metric + Clone>(
    registry: &mut Registry,
    (name, help): (&str, &str),
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("smartmig");
        let r = &mut registry;
        Metrics {
            allocations: registered(r, help::ALLOCATIONS, Family::default()),
            failures: registered(r, help::FAILURES, Family::default()),
            // 50 us .. ~26 s
            latency: registered(
                r,
                help::LATENCY,
                Histogram::new(exponential_buckets(0.000_05, 2.0, 20)),
            ),
            reconfigurations: registered(r, help::RECONFIGURATIONS, Family::default()),
            instances: registered(r, help::INSTANCES, Family::default()),
            energy: registered(r, help::ENERGY, Family::default()),
            reaped: registered(r, help::REAPED, Counter::default()),
            epilog_missing: registered(r, help::EPILOG_MISSING, Gauge::default()),
            memory_restarts: registered(r, help::MEMORY_RESTARTS, Family::default()),
            slice_seconds: registered(r, help::SLICE_SECONDS, Family::default()),
            user_slice_seconds: registered(r, help::USER_SLICE_SECONDS, Family::default()),
            wait_seconds: registered(r, help::WAIT_SECONDS, Family::default()),
            jobs_served: registered(r, help::JOBS_SERVED, Family::default()),
            pending_plans: registered(r, help::PENDING_PLANS, Gauge::default()),
            queue_reads: registered(r, help::QUEUE_READS, Family::default()),
            summary_age: registered(r, help::SUMMARY_AGE, Gauge::default()),
            panics: registered(r, help::PANICS, Family::default()),
            epochs: registered(r, help::EPOCHS, Counter::default()),
            dcgm: registered(r, help::MIG_INSTANCE, Family::default()),
            slices: registered(r, help::SLICES, Family::default()),
            waiting: registered(r, help::WAITING, Family::default()),
            fragmentation: registered(r, help::FRAGMENTATION, Family::default()),
            // 1 ms .. ~33 s
            reconfiguration_seconds: registered(
                r,
                help::RECONFIGURATION_SECONDS,
                Family::new_with_constructor(|| {
                    Histogram::new(exponential_buckets(0.001, 2.0, 16))
                }),
            ),
            policy: registered(r, help::POLICY, Family::default()),
            policy_running: registered(r, help::POLICY_RUNNING, Family::default()),
            shadow_switches: registered(r, help::SHADOW_SWITCHES, Family::default()),
            xid_events: registered(r, help::XID_EVENTS, Family::default()),
            gpu_healthy: registered(r, help::GPU_HEALTHY, Family::default()),
            instance_healthy: registered(r, help::INSTANCE_HEALTHY, Family::default()),
            registry,
        }
    }

    /// A panic caught in `task` (a request's op, `epoch`, `memory_sample`,
    /// `connection`).
    pub fn panic(&self, task: &str) {
        self.panics
            .get_or_create(&TaskLabel {
                task: task.to_string(),
            })
            .inc();
    }

    /// The shadow handed over to `to` (`fallback` or `learned`).
    pub fn shadow_switch(&self, to: &str) {
        self.shadow_switches
            .get_or_create(&ToLabel { to: to.to_string() })
            .inc();
    }

    /// One epoch of the repartitioning loop ran to the end.
    pub fn epoch(&self) {
        self.epochs.inc();
    }

    /// Epochs run to the end so far (the status reply's `epochs`).
    pub fn epochs(&self) -> u64 {
        self.epochs.get()
    }

    pub fn allocation(&self, result: &str, seconds: f64) {
        self.allocations
            .get_or_create(&ResultLabel {
                result: result.to_string(),
            })
            .inc();
        self.latency.observe(seconds);
    }

    pub fn failure(&self, kind: &str) {
        self.failures
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// One instance created or destroyed (`op`), its backend call taking
    /// `seconds`.
    pub fn reconfiguration(&self, gpu: u32, op: &str, seconds: f64) {
        self.reconfigurations
            .get_or_create(&ReconfLabel {
                gpu: gpu.to_string(),
                op: op.to_string(),
            })
            .inc();
        self.reconfiguration_seconds
            .get_or_create(&OpLabel { op: op.to_string() })
            .observe(seconds);
    }

    /// An out-of-memory decision: `cause` is `oom` or `early`.
    pub fn memory_restart(&self, cause: &str, decision: &str) {
        self.memory_restarts
            .get_or_create(&RestartLabel {
                cause: cause.to_string(),
                decision: decision.to_string(),
            })
            .inc();
    }

    /// A released instance's accounting (the per-profile and per-user
    /// counters; the usage log has the record itself).
    pub fn usage(&self, r: &crate::usage::UsageRecord) {
        let profile = ProfileLabel {
            profile: r.profile.clone(),
        };
        self.slice_seconds.get_or_create(&profile).inc_by(r.slice_s);
        self.wait_seconds.get_or_create(&profile).inc_by(r.wait_s);
        self.jobs_served.get_or_create(&profile).inc();
        let user = UserLabel {
            user: r.user.clone().unwrap_or_else(|| r.uid.to_string()),
        };
        self.user_slice_seconds
            .get_or_create(&user)
            .inc_by(r.slice_s);
    }

    /// One read of the queue from `source` (`summary`, `squeue`, `none`),
    /// and the summary's age (`None`: no usable summary).
    pub fn queue_read(&self, source: &str, summary_age_s: Option<u64>) {
        self.queue_reads
            .get_or_create(&SourceLabel {
                source: source.into(),
            })
            .inc();
        self.summary_age
            .set(summary_age_s.map_or(-1, |a| i64::try_from(a).unwrap_or(i64::MAX)));
    }

    /// Plans waiting for `smartmig apply` now.
    pub fn pending_plans(&self, n: usize) {
        self.pending_plans.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One XID event on `gpu`, of `class` ([`crate::health`]).
    pub fn xid(&self, gpu: u32, xid: u64, class: &str) {
        self.xid_events
            .get_or_create(&XidLabel {
                gpu: gpu.to_string(),
                xid: xid.to_string(),
                class: class.into(),
            })
            .inc();
    }

    /// `n` instances freed by the reaper.
    pub fn reaped(&self, n: u64) {
        self.reaped.inc_by(n);
    }

    /// The OpenMetrics text, with the scrape-time gauges set from `now`.
    pub fn render(&self, now: &Scrape) -> String {
        self.epilog_missing.set(i64::from(now.epilog_missing));
        self.set_instances(now);
        for &(gpu, j) in &now.energy {
            self.energy
                .get_or_create(&GpuLabel {
                    gpu: gpu.to_string(),
                })
                .set(j);
        }
        self.gpu_healthy.clear();
        for (gpu, uuid, ok) in &now.gpus_healthy {
            self.gpu_healthy
                .get_or_create(&DcgmGpuLabel {
                    gpu: gpu.to_string(),
                    UUID: uuid.clone(),
                    Hostname: now.hostname.clone(),
                })
                .set(i64::from(*ok));
        }
        self.waiting.clear();
        for (profile, n) in &now.waiting {
            self.waiting
                .get_or_create(&ProfileLabel {
                    profile: profile.clone(),
                })
                .inc_by(*n);
        }
        for &(gpu, n) in &now.fragmentation {
            self.fragmentation
                .get_or_create(&GpuLabel {
                    gpu: gpu.to_string(),
                })
                .set(n);
        }
        self.policy.clear();
        let (configured, running) = &now.policy;
        let fallback = running.contains("(fallback");
        self.policy
            .get_or_create(&PolicyLabel {
                configured: configured.clone(),
                running: running.split(" (").next().unwrap_or(running).to_string(),
                fallback: fallback.to_string(),
            })
            .set(1);
        self.policy_running.clear();
        for (role, name, runs) in &now.running {
            self.policy_running
                .get_or_create(&RunningLabel {
                    policy: name.clone(),
                    role: role.clone(),
                })
                .set(i64::from(*runs));
        }
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out = "# metrics encoding failed\n".into();
        }
        out
    }

    /// The per-instance gauges: counts by profile and state, compute
    /// slices, and one DCGM-labelled series per instance.
    fn set_instances(&self, now: &Scrape) {
        self.instances.clear();
        self.slices.clear();
        self.dcgm.clear();
        self.instance_healthy.clear();
        for i in &now.instances {
            let state = if i.job.is_some() { "busy" } else { "idle" };
            self.instances
                .get_or_create(&InstanceLabel {
                    gpu: i.gpu.to_string(),
                    profile: i.profile.clone(),
                    state: state.into(),
                })
                .inc();
            self.slices
                .get_or_create(&SliceLabel {
                    gpu: i.gpu.to_string(),
                    profile: i.profile.clone(),
                    state: state.into(),
                })
                .inc_by(i64::from(i.compute));
            let label = DcgmLabel {
                gpu: i.gpu.to_string(),
                UUID: i.gpu_uuid.clone(),
                GPU_I_PROFILE: i.profile.clone(),
                GPU_I_ID: i.gi.map(|g| g.to_string()).unwrap_or_default(),
                Hostname: now.hostname.clone(),
                hpc_job: i.job.map(|j| j.to_string()).unwrap_or_default(),
            };
            self.instance_healthy
                .get_or_create(&label)
                .set(i64::from(i.healthy));
            self.dcgm
                .get_or_create(&label)
                .set(i64::from(i.job.is_some()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family() {
        let m = Metrics::new();
        m.allocation("created", 0.0004);
        m.failure("no_fit");
        m.reconfiguration(0, "create", 0.2);
        m.panic("status");
        m.epoch();
        m.shadow_switch("fallback");
        m.xid(0, 79, "gpu_fatal");
        let text = m.render(&Scrape {
            instances: vec![MigInstance {
                gpu: 0,
                gpu_uuid: "GPU-1".into(),
                profile: "3g.20gb".into(),
                gi: Some(2),
                job: Some(4711),
                compute: 3,
                healthy: false,
            }],
            energy: vec![(0, 12.5)],
            gpus_healthy: vec![(0, "GPU-1".into(), false)],
            epilog_missing: true,
            hostname: "n1".into(),
            waiting: vec![("7g.40gb".into(), 2)],
            fragmentation: vec![(0, 4)],
            policy: (
                "onnx:p.onnx".into(),
                "greedy (fallback: onnx:p.onnx unavailable)".into(),
            ),
            running: vec![
                ("learned".into(), "policy:p.onnx".into(), false),
                ("fallback".into(), "greedy".into(), true),
            ],
        });
        for needle in [
            "smartmig_allocations_total{result=\"created\"} 1",
            "smartmig_failures_total{kind=\"no_fit\"} 1",
            "smartmig_allocation_latency_seconds_bucket",
            "smartmig_reconfigurations_total{gpu=\"0\",op=\"create\"} 1",
            "smartmig_instances{gpu=\"0\",profile=\"3g.20gb\",state=\"busy\"} 1",
            "smartmig_energy_joules{gpu=\"0\"} 12.5",
            "smartmig_epilog_missing 1",
            "smartmig_panics_total{task=\"status\"} 1",
            "smartmig_epochs_total 1",
            "smartmig_mig_instance_busy{gpu=\"0\",UUID=\"GPU-1\",GPU_I_PROFILE=\"3g.20gb\",GPU_I_ID=\"2\",Hostname=\"n1\",hpc_job=\"4711\"} 1",
            "smartmig_compute_slices{gpu=\"0\",profile=\"3g.20gb\",state=\"busy\"} 3",
            "smartmig_waiting_allocations{profile=\"7g.40gb\"} 2",
            "smartmig_fragmented_compute_slices{gpu=\"0\"} 4",
            "smartmig_reconfiguration_duration_seconds_bucket{le=\"0.256\",op=\"create\"} 1",
            "smartmig_policy_info{configured=\"onnx:p.onnx\",running=\"greedy\",fallback=\"true\"} 1",
            "smartmig_policy_running{policy=\"policy:p.onnx\",role=\"learned\"} 0",
            "smartmig_policy_running{policy=\"greedy\",role=\"fallback\"} 1",
            "smartmig_shadow_switches_total{to=\"fallback\"} 1",
            "smartmig_xid_events_total{gpu=\"0\",xid=\"79\",class=\"gpu_fatal\"} 1",
            "smartmig_gpu_healthy{gpu=\"0\",UUID=\"GPU-1\",Hostname=\"n1\"} 0",
            "smartmig_mig_instance_healthy{gpu=\"0\",UUID=\"GPU-1\",GPU_I_PROFILE=\"3g.20gb\",GPU_I_ID=\"2\",Hostname=\"n1\",hpc_job=\"4711\"} 0",
        ] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
    }
}
