//! What both engines keep of the gang jobs they started (issue 54): how
//! many pieces of each still run, so that a gang job's metrics are settled
//! once, at its first piece's start, and it is done at its last piece's
//! end. The rules of each engine are in `engine/gang.rs` and
//! `slurm_like/gang.rs`.

use std::collections::HashMap;

/// Pieces still running of each started gang job (job index -> count).
#[derive(Default)]
pub(crate) struct Pieces(HashMap<u32, u32>);

impl Pieces {
    /// A piece of job `i` starts: true for a gang job's first piece (whose
    /// start settles the job's metrics) and for every single-GPU job.
    pub(crate) fn started(&mut self, i: u32, gang: bool) -> bool {
        if !gang {
            return true;
        }
        let left = self.0.entry(i).or_insert(0);
        *left += 1;
        *left == 1
    }

    /// A piece of job `i` ends: true when the job is over (its last piece,
    /// or a single-GPU job).
    pub(crate) fn ended(&mut self, i: u32) -> bool {
        let Some(left) = self.0.get_mut(&i) else {
            return true;
        };
        *left -= 1;
        if *left > 0 {
            return false;
        }
        self.0.remove(&i);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gang_job_counts_at_its_first_start_and_its_last_end() {
        let mut p = Pieces::default();
        assert!(p.started(3, false) && p.ended(3));
        assert!(p.started(7, true));
        assert!(!p.started(7, true));
        assert!(!p.ended(7));
        assert!(p.ended(7));
    }
}
