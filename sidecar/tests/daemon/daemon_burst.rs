//! One scheduling pass's jobs on one GPU, through a real smartmigd (sim
//! backend, or the NVML emulator) whose `squeue` and `scontrol` are
//! scripts in its directory (issue 56, item 2): a pass that no MIG layout
//! holds builds all but the job it turns away, which is refused at once
//! (well before `allocate_wait_s`) with its reason, an `AdminComment`
//! word and a note for its next run; a pass that fits together is built
//! whole in every arrival order.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::daemon_common::{batch_step as batch, running_on_n1 as queue, TestDaemon};
use smartmig::daemon::protocol::ErrorKind;
use smartmig::daemon::ClientError;

/// Long, so that a refusal that waited for it cannot pass for one made
/// at once.
const WAIT_S: u64 = 20;

/// smartmigd on node `n1` whose Slurm is `squeue` printing `jobs` and
/// `scontrol` logging its arguments, `allocate_wait_s` = [`WAIT_S`]; it
/// returns once an epoch has read that queue.
fn start(name: &str, jobs: &[(u64, u8)]) -> TestDaemon {
    let d = crate::daemon_common::with_fake_slurm_in(
        name,
        &format!("node_name = \"n1\"\nallocate_wait_s = {WAIT_S}\nepoch_s = 1\n"),
        "slurmd = \"/bin/false\"\n",
        &queue(jobs),
    );
    d.wait_epochs(0, 1);
    d
}

fn scontrol_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("scontrol.log")).unwrap_or_default()
}

/// 3 + 3 + 1 shards on an empty A100-40GB: the two 3g take all 8 memory
/// slices, so no layout holds the 1g beside them. Whether the 1g's
/// allocate comes first, between or last, the two 3g are built, and the 1g is
/// refused at once with a reason naming the GPU and what took the room;
/// its `AdminComment` says why, and its next run is told.
#[test]
fn a_pass_no_layout_holds_builds_the_rest_and_refuses_the_one_at_once() {
    for order in [[11u64, 12, 13], [11, 13, 12], [13, 11, 12]] {
        let d = start("burst-331", &[(11, 3), (12, 3), (13, 1)]);
        let c = d.client();
        for job in order {
            let slices = if job == 13 { 1 } else { 3 };
            let t0 = Instant::now();
            let got = c.allocate(batch(job, slices));
            let took = t0.elapsed();
            if job != 13 {
                let r = got.unwrap_or_else(|e| panic!("{order:?}: job {job}: {e}\n{}", d.log()));
                assert_eq!(r.profile, "3g.20gb", "{order:?}");
                continue;
            }
            let Err(ClientError::Daemon(e)) = got else {
                panic!("{order:?}: the 1g was not refused: {got:?}\n{}", d.log());
            };
            assert_eq!(e.kind, ErrorKind::NoFit, "{order:?}: {e:?}");
            assert!(
                took < Duration::from_secs(WAIT_S / 4),
                "{order:?}: refused after {took:?}, not at once"
            );
            for part in ["GPU 0", "1g.5gb", "3g.20gb", "scheduling pass", "requeued"] {
                assert!(e.message.contains(part), "{order:?}: {part}: {}", e.message);
            }
        }
        let held: Vec<String> = c.status().expect("status").gpus[0]
            .instances
            .iter()
            .filter(|i| i.job_id.is_some())
            .map(|i| i.profile.clone())
            .collect();
        assert_eq!(held, ["3g.20gb", "3g.20gb"], "{order:?}");
        d.wait_until("the AdminComment word", || {
            scontrol_log(&d.dir).contains("AdminComment=smartmig-requeued:at=")
                && scontrol_log(&d.dir)
                    .contains("why=no_layout_holds_its_scheduling_pass,on=1g.5gb,gpu=0")
        });
        // Job 11 ends; the requeued job 13 runs again and is told why.
        std::fs::write(d.dir.join("squeue.json"), queue(&[(12, 3), (13, 1)])).expect("queue");
        assert_eq!(c.release(11).expect("release 11").released, 1);
        let again = c.allocate(batch(13, 1)).expect("the 1g's next run");
        let note = again.note.unwrap_or_default();
        assert!(
            note.contains("refused a MIG instance on GPU 0") && note.contains("3g.20gb"),
            "{order:?}: {note}"
        );
    }
}

/// 4 + 2 + 1 shards on an empty A100-40GB fit together only when each is
/// placed leaving room for the others (a 2g or 1g at slot 0 or 2 rules
/// out the 4g): every arrival order is built whole, at once.
#[test]
fn a_pass_that_fits_together_is_built_whole_in_every_order() {
    let jobs = [(21u64, 4u8), (22, 2), (23, 1)];
    let orders = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    for order in orders {
        let d = start("burst-421", &jobs);
        let c = d.client();
        for i in order {
            let (job, k) = jobs[i];
            let t0 = Instant::now();
            let r = c
                .allocate(batch(job, k))
                .unwrap_or_else(|e| panic!("{order:?}: job {job}: {e}\n{}", d.log()));
            assert_eq!(r.compute, k, "{order:?}");
            assert!(t0.elapsed() < Duration::from_secs(WAIT_S / 4), "{order:?}");
        }
    }
}
