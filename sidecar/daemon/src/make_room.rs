//! Room for an interactive job (issue 42): an `srun` or `salloc` job cannot
//! be requeued, so when Slurm placed it on a GPU where MIG cannot build its
//! instance, it must not fail for it. That happens when one scheduling pass
//! places several jobs on a GPU before smartmigd's hold on the stranded
//! shards exists (three jobs of 3, 3 and 1 shards on an empty A100). The
//! batch jobs that started there moments ago can be requeued and have done
//! almost nothing; [`victims`] names the fewest of them whose requeue makes
//! room. The interactive job waits for that room (a requeued job's instance
//! is freed by its epilog), and the requeued batch job starts again later.
//!
//! Pure code: the caller says which busy instances belong to young batch
//! jobs (started within its race window, not `--no-requeue`).

use crate::mig::{Geometry, Layout, Shape, SpotId};

/// A busy instance whose batch job may be requeued to make room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Young {
    pub job_id: u64,
    pub placement: SpotId,
    /// Unix seconds the job got the instance.
    pub since: u64,
}

/// The fewest `young` jobs whose instances, once free, let a `shape`
/// instance be built next to the remaining busy instances (idle ones can
/// be re-shaped); among equal counts the ones that started last (they lose
/// the least). `None` when even requeueing all of them makes no room.
pub fn victims(
    geometry: &Geometry,
    busy: Layout,
    young: &[Young],
    shape: Shape,
) -> Option<Vec<u64>> {
    let n = young.len().min(16);
    let mut best: Option<(u32, u64, u32)> = None; // (count, -age sum, mask)
    for mask in 0u32..(1 << n) {
        let freed = (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .fold(Layout::EMPTY, |l, i| l.with(young[i].placement));
        let rest = busy.minus(freed);
        if geometry.candidates(rest, shape).next().is_none() {
            continue;
        }
        let count = mask.count_ones();
        let recency: u64 = (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| young[i].since)
            .sum();
        let key = (count, u64::MAX - recency, mask);
        if best.is_none_or(|b| key < b) {
            best = Some(key);
        }
    }
    best.map(|(_, _, mask)| {
        (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| young[i].job_id)
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::GpuModel;

    fn a100() -> &'static Geometry {
        Geometry::of(GpuModel::A100_40gb)
    }

    fn at(g: &Geometry, c: u8, m: u8, s: u8) -> SpotId {
        g.spot_id(Shape::new(c, m), s).expect("placement")
    }

    #[test]
    fn one_young_3g_makes_room_for_a_1g() {
        let g = a100();
        let (a, b) = (at(g, 3, 4, 0), at(g, 3, 4, 4));
        let busy = Layout::single(a).with(b);
        let young = [
            Young {
                job_id: 10,
                placement: a,
                since: 100,
            },
            Young {
                job_id: 11,
                placement: b,
                since: 101,
            },
        ];
        // Either frees room; the later start goes.
        assert_eq!(victims(g, busy, &young, Shape::new(1, 1)), Some(vec![11]));
        // Only an old job in the way: nothing to requeue.
        assert_eq!(victims(g, busy, &young[..0], Shape::new(1, 1)), None);
    }

    #[test]
    fn nothing_is_requeued_when_it_would_not_help() {
        let g = a100();
        // A 7g is busy with an old job; a young 1g elsewhere cannot exist,
        // and a young job that is not in the way is never named.
        let (a, b) = (at(g, 4, 4, 0), at(g, 3, 4, 4));
        let busy = Layout::single(a).with(b);
        let young = [Young {
            job_id: 5,
            placement: b,
            since: 1,
        }];
        // A 4g needs slot 0, held by the old 4g: requeueing the 3g is useless.
        assert_eq!(victims(g, busy, &young, Shape::new(4, 4)), None);
        // A 2g fits once the 3g is gone.
        assert_eq!(victims(g, busy, &young, Shape::new(2, 2)), Some(vec![5]));
    }
}
