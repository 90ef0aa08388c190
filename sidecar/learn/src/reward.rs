//! Reward bookkeeping for the trainer: the simulator does not hand energy
//! and tardiness per decision epoch to policies, so the [`Ledger`] rebuilds
//! them from the event log ([`LedgerSink`]) by integrating the power model
//! over each epoch interval.

use std::cell::RefCell;
use std::rc::Rc;

use crate::mig::GpuModel;
use crate::sim::events::{EventSink, Record};
use crate::sim::SimConfig;
use crate::workload::PowerModel;

/// Extra tardiness charged per job that never ran, s (reward only): the
/// yardstick ranks a run that leaves a job unserved behind every run that
/// serves them all (`sim::Standing`), which a sum of rewards can only
/// approach with a large fixed penalty. The job's own charge (on a whole
/// GPU after the horizon, `sim::metrics`) comes with the run's totals.
const UNSERVED_PENALTY_S: f64 = 86_400.0;

/// A started job as the event log reports it.
#[derive(Clone, Copy, Debug)]
struct Started {
    gpu: usize,
    compute: u8,
    start: f64,
    end: f64,
    tardiness: f64,
}

/// Energy and tardiness per epoch, from job-start records.
#[derive(Debug)]
pub(super) struct Ledger {
    started: Vec<Started>,
    consumed: usize,
    /// Jobs still running at the last epoch, per GPU.
    active: Vec<Vec<Started>>,
    power: Vec<PowerModel>,
    total: Vec<u8>,
    last: f64,
    /// Jobs that never ran.
    unserved: u64,
}

impl Ledger {
    pub(super) fn new(cluster: &[GpuModel], cfg: &SimConfig) -> Self {
        Ledger {
            started: Vec::new(),
            consumed: 0,
            active: vec![Vec::new(); cluster.len()],
            power: cluster.iter().map(|&m| cfg.power_for(m)).collect(),
            total: cluster.iter().map(|m| m.spec().compute_slices).collect(),
            last: 0.0,
            unserved: 0,
        }
    }

    /// Energy per GPU over `(last, now]` and tardiness per GPU of the jobs
    /// started since the last call.
    pub(super) fn advance(&mut self, now: f64) -> (Vec<f64>, Vec<f64>) {
        let n = self.active.len();
        let mut tard = vec![0.0; n];
        for s in &self.started[self.consumed..] {
            if let Some(t) = tard.get_mut(s.gpu) {
                *t += s.tardiness;
                self.active[s.gpu].push(*s);
            }
        }
        self.consumed = self.started.len();
        let mut energy = vec![0.0; n];
        let t0 = self.last;
        for (gpu, jobs) in self.active.iter_mut().enumerate() {
            let mut cuts: Vec<f64> = vec![t0, now];
            for j in jobs.iter() {
                for t in [j.start, j.end] {
                    if t > t0 && t < now {
                        cuts.push(t);
                    }
                }
            }
            cuts.sort_by(f64::total_cmp);
            let mut e = 0.0;
            for w in cuts.windows(2) {
                let (a, b) = (w[0], w[1]);
                if b <= a {
                    continue;
                }
                let mid = 0.5 * (a + b);
                let busy: u32 = jobs
                    .iter()
                    .filter(|j| j.start <= mid && mid < j.end)
                    .map(|j| u32::from(j.compute))
                    .sum();
                let load = (f64::from(busy) / f64::from(self.total[gpu])).min(1.0);
                e += self.power[gpu].energy_j(load, b - a);
            }
            energy[gpu] = e;
            jobs.retain(|j| j.end > now);
        }
        self.last = now;
        (energy, tard)
    }

    /// The ranking penalty for the jobs that never ran:
    /// [`UNSERVED_PENALTY_S`] each (their own charge is in the run's
    /// totals, which the episode's books are reconciled with).
    pub(super) fn starved_penalty(&self) -> f64 {
        self.unserved as f64 * UNSERVED_PENALTY_S
    }
}

/// The event sink the simulator writes to during an episode: it hands
/// every job start and every job that never ran to the shared [`Ledger`].
pub(super) struct LedgerSink(pub(super) Rc<RefCell<Ledger>>);

impl EventSink for LedgerSink {
    fn record(&mut self, record: &Record) -> std::io::Result<()> {
        match record {
            Record::Job(j) => self.0.borrow_mut().started.push(Started {
                gpu: j.run.gpu,
                compute: j.run.compute,
                start: j.run.start,
                end: j.end,
                tardiness: (j.end - j.run.deadline).max(0.0),
            }),
            Record::Unserved(_) => self.0.borrow_mut().unserved += 1,
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::events::{JobRecord, Run, UnservedRecord};
    use crate::workload::SpeedupCurve;

    const M: GpuModel = GpuModel::A100_40gb;

    /// A linear power model (100 W idle, 200 W with all 7 slices busy), so
    /// every energy below is a sum of `(100 + 100 * busy / 7) * seconds`.
    fn ledger(gpus: usize) -> Rc<RefCell<Ledger>> {
        let cfg = SimConfig {
            power: vec![(
                M,
                PowerModel {
                    idle_w: 100.0,
                    max_w: 200.0,
                    exponent: 1.0,
                },
            )],
            ..SimConfig::default()
        };
        Rc::new(RefCell::new(Ledger::new(&vec![M; gpus], &cfg)))
    }

    fn job(gpu: usize, compute: u8, start: f64, end: f64, deadline: f64) -> Record {
        Record::Job(JobRecord {
            run: Run {
                id: 0,
                arrival: 0.0,
                deadline,
                work: end - start,
                memory_gb: 1.0,
                requested_slices: None,
                speedup: SpeedupCurve::default(),
                gpu,
                profile: String::new(),
                compute,
                memory_slices: 1,
                start_slot: 0,
                instance_memory_gb: 5,
                speed: 1.0,
                start,
                gpus: 1,
            },
            end,
        })
    }

    fn watts(busy: u32) -> f64 {
        100.0 + 100.0 * f64::from(busy) / 7.0
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    /// Two GPUs and three jobs: the energy of each interval is the power
    /// of the busy slices integrated piecewise, a job's tardiness counts in
    /// the interval it started in, and a record for an unknown GPU is
    /// ignored.
    #[test]
    fn energy_and_tardiness_per_interval() {
        let l = ledger(2);
        let mut sink = LedgerSink(Rc::clone(&l));
        for r in [
            job(0, 4, 10.0, 30.0, 25.0), // 5 s late
            job(0, 3, 15.0, 25.0, 40.0), // on time
            job(1, 7, 5.0, 50.0, 45.0),  // 5 s late
            job(9, 7, 0.0, 60.0, 0.0),   // no such GPU
        ] {
            sink.record(&r).unwrap();
        }
        let (e, t) = l.borrow_mut().advance(20.0);
        let gpu0 = watts(0) * 10.0 + watts(4) * 5.0 + watts(7) * 5.0;
        let gpu1 = watts(0) * 5.0 + watts(7) * 15.0;
        assert!(close(&e, &[gpu0, gpu1]), "{e:?}");
        assert!(close(&t, &[5.0, 5.0]), "{t:?}");

        // Nothing new started: no tardiness; the running jobs go on.
        let (e, t) = l.borrow_mut().advance(40.0);
        let gpu0 = watts(7) * 5.0 + watts(4) * 5.0 + watts(0) * 10.0;
        assert!(close(&e, &[gpu0, watts(7) * 20.0]), "{e:?}");
        assert!(close(&t, &[0.0, 0.0]), "{t:?}");

        let (e, _) = l.borrow_mut().advance(60.0);
        assert!(close(
            &e,
            &[watts(0) * 20.0, watts(7) * 10.0 + watts(0) * 10.0]
        ));
    }

    /// More busy slices than the GPU has count as a full GPU.
    #[test]
    fn load_is_capped_at_the_whole_gpu() {
        let l = ledger(1);
        let mut sink = LedgerSink(Rc::clone(&l));
        sink.record(&job(0, 7, 0.0, 10.0, 10.0)).unwrap();
        sink.record(&job(0, 7, 0.0, 10.0, 10.0)).unwrap();
        let (e, _) = l.borrow_mut().advance(10.0);
        assert!(close(&e, &[watts(7) * 10.0]), "{e:?}");
    }

    /// Each job that never ran costs the fixed ranking penalty.
    #[test]
    fn unserved_jobs_are_charged() {
        let l = ledger(1);
        let mut sink = LedgerSink(Rc::clone(&l));
        for deadline in [30.0, 500.0] {
            sink.record(&Record::Unserved(UnservedRecord {
                id: 1,
                arrival: 0.0,
                deadline,
                work: 10.0,
                memory_gb: 1.0,
                requested_slices: None,
                reason: "test".into(),
                gpus: 1,
            }))
            .unwrap();
        }
        let p = l.borrow().starved_penalty();
        assert!((p - 2.0 * UNSERVED_PENALTY_S).abs() < 1e-9, "{p}");
        assert_eq!(ledger(1).borrow().starved_penalty(), 0.0);
    }
}
