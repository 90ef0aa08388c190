//! Which node acts on which waiting job, so nodes that see the same queue
//! do not all reshape for it (issue 23, docs/architecture.md "Cluster
//! scale").
//!
//! Rendezvous (highest-random-weight) hashing: every node scores each
//! (job, node) pair with the same stable hash and the node with the highest
//! score claims the job. Each node computes it alone from the job id and
//! the list of node names, with no messages; a node joining or leaving
//! moves only the jobs it claims or would claim, and every job has exactly
//! one claimant. The hash is FNV-1a 64 followed by a SplitMix64 finaliser,
//! written here because it must never change between builds or Rust
//! versions (`std`'s `DefaultHasher` may), or two nodes on different
//! releases would disagree.

/// FNV-1a 64 of `bytes`.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64's finaliser: spreads the combined key over all 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The score of `node` for `job_id`; the highest score claims the job.
pub fn weight(job_id: u64, node: &str) -> u64 {
    mix(fnv1a(node.as_bytes()) ^ mix(job_id))
}

/// Index in `nodes` of the node that claims `job_id` (`None` when `nodes`
/// is empty). Ties (equal scores) go to the first name in sort order, so
/// the answer does not depend on the list's order.
pub fn claimant<S: AsRef<str>>(job_id: u64, nodes: &[S]) -> Option<usize> {
    nodes
        .iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| {
            let (a, b) = (a.as_ref(), b.as_ref());
            weight(job_id, a)
                .cmp(&weight(job_id, b))
                .then_with(|| b.cmp(a))
        })
        .map(|(i, _)| i)
}

/// Whether `node` claims `job_id` among `nodes`. A node missing from
/// `nodes` claims nothing.
pub fn claims<S: AsRef<str>>(job_id: u64, node: &str, nodes: &[S]) -> bool {
    claimant(job_id, nodes).is_some_and(|i| nodes[i].as_ref() == node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("gpu{i:03}")).collect()
    }

    #[test]
    fn exactly_one_claimant_per_job() {
        let nodes = names(16);
        for job in 0..2_000 {
            let n = nodes.iter().filter(|x| claims(job, x, &nodes)).count();
            assert_eq!(n, 1, "job {job}");
        }
    }

    #[test]
    fn order_of_the_list_does_not_matter() {
        let nodes = names(9);
        let mut rev = nodes.clone();
        rev.reverse();
        for job in 0..500 {
            let a = &nodes[claimant(job, &nodes).unwrap()];
            let b = &rev[claimant(job, &rev).unwrap()];
            assert_eq!(a, b);
        }
    }

    #[test]
    fn shares_are_even_and_a_leaving_node_moves_only_its_jobs() {
        let nodes = names(10);
        let mut counts = [0u32; 10];
        for job in 0..20_000 {
            counts[claimant(job, &nodes).unwrap()] += 1;
        }
        // 2,000 expected each; 4 standard deviations is about 170.
        assert!(
            counts.iter().all(|&c| (1_800..=2_200).contains(&c)),
            "{counts:?}"
        );
        let fewer: Vec<String> = nodes[1..].to_vec();
        for job in 0..5_000 {
            let before = &nodes[claimant(job, &nodes).unwrap()];
            let after = &fewer[claimant(job, &fewer).unwrap()];
            if before != "gpu000" {
                assert_eq!(before, after, "job {job} moved although its node stayed");
            }
        }
    }

    #[test]
    fn the_hash_is_frozen() {
        // Nodes on different releases must agree: these values never change.
        assert_eq!(fnv1a(b"node1"), 0xca4e_ba72_0723_2f14);
        assert!(claimant(1, &Vec::<String>::new()).is_none());
        assert!(!claims(1, "other", &names(3)));
    }
}
