//! `smartmig plan` and `smartmig apply ID`: the reconfigurations the
//! policy wants before they happen (issue 22, part 2). With `mode =
//! "confirm"` in smartmig.toml the daemon keeps each epoch's targets as
//! pending plans, one per GPU, until an admin applies one (root or
//! slurm_user) or it lapses after `plan_timeout_s`; with the default
//! `mode = "dynamic"` it carries them out at once and `plan` lists what it
//! did. Either way a plan never destroys a busy instance: `apply` checks
//! again against the GPU as it is then.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context;

use super::args::JsonArg;
use super::socket::SocketArgs;
use crate::daemon::protocol::{PlanEffect, PlanReply, PlanStatus};
use crate::daemon::Client;

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub socket: SocketArgs,
    #[command(flatten)]
    pub json: JsonArg,
}

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// The plan's id, as `smartmig plan` shows it.
    pub plan: u64,
    #[command(flatten)]
    pub socket: SocketArgs,
}

fn now() -> i64 {
    super::clock::unix_now() as i64
}

pub fn plan(args: &PlanArgs) -> anyhow::Result<()> {
    let client = Client::new(args.socket.socket()?).with_io_timeout(Duration::from_secs(10));
    let reply = client.plan().context("asking smartmigd for its plans")?;
    if !args.json.to_stdout() {
        print!("{}", render(&reply, now()));
    }
    args.json.write(&reply)
}

pub fn apply(args: &ApplyArgs) -> anyhow::Result<()> {
    let client = Client::new(args.socket.socket()?).with_io_timeout(Duration::from_secs(60));
    let done = client
        .apply(args.plan)
        .with_context(|| format!("applying plan {}", args.plan))?;
    println!("applied: {}", line(&done, now()));
    Ok(())
}

/// One plan on one line: `plan 3  GPU 0  7 -> 4444|3333  destroy 7g.40gb@0
/// create ...  keeps 3g.20gb@4 (job 17)  lapses in 9m58s`.
pub fn line(p: &PlanStatus, now: i64) -> String {
    let list = |v: &[String]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(" ")
        }
    };
    let mut s = format!(
        "plan {:<4} GPU {}  {} -> {}  destroy {}  create {}  keeps {}",
        p.id,
        p.gpu,
        p.from,
        p.to,
        list(&p.destroy),
        list(&p.create),
        list(&p.keeps_busy)
    );
    if let Some(e) = p.expires_at {
        let left = e as i64 - now;
        let _ = if left > 0 {
            write!(s, "  lapses in {}s", left)
        } else {
            write!(s, "  lapsed")
        };
    }
    if let Some(a) = p.applied_at {
        let _ = write!(s, "  applied {}s ago", (now - a as i64).max(0));
    }
    if let Some(e) = &p.effect {
        let _ = write!(s, "\n           {}", effect_line(e));
    }
    s
}

/// A plan's expected effect, held layouts -> plan applied.
pub fn effect_line(e: &PlanEffect) -> String {
    let mut s = format!(
        "expected for the {} waiting job(s) ({} running): mean wait {}s -> {}s, energy until drained {} -> {} kJ",
        e.waiting, e.running, e.wait_keep_s, e.wait_plan_s, e.energy_keep_kj, e.energy_plan_kj
    );
    if e.late_keep + e.late_plan > 0 {
        let _ = write!(s, ", late {} -> {}", e.late_keep, e.late_plan);
    }
    if e.unfit_keep + e.unfit_plan > 0 {
        let _ = write!(
            s,
            ", fitting no instance (reshaped on demand) {} -> {}",
            e.unfit_keep, e.unfit_plan
        );
    }
    s
}

fn render(r: &PlanReply, now: i64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "mode {}, policy {}{}",
        r.mode,
        r.policy,
        if r.mode == "confirm" {
            format!(", plans lapse after {} s", r.plan_timeout_s)
        } else {
            " (targets are applied each epoch; mode = \"confirm\" makes them wait)".to_string()
        }
    );
    let _ = writeln!(out, "\nPending (smartmig apply ID)");
    if r.pending.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for p in &r.pending {
        let _ = writeln!(out, "  {}", line(p, now));
    }
    let _ = writeln!(out, "\nApplied (newest last)");
    if r.applied.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for p in &r.applied {
        let _ = writeln!(out, "  {}", line(p, now));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(id: u64) -> PlanStatus {
        PlanStatus {
            id,
            gpu: 1,
            from: "7".into(),
            to: "4444|3333".into(),
            destroy: vec!["7g.40gb@0".into()],
            create: vec!["4g.20gb@0".into(), "3g.20gb@4".into()],
            keeps_busy: vec![],
            created_at: 100,
            expires_at: Some(700),
            applied_at: None,
            effect: None,
        }
    }

    #[test]
    fn pending_and_applied_plans_read_as_one_line_each() {
        let mut done = p(1);
        done.expires_at = None;
        done.applied_at = Some(90);
        let r = PlanReply {
            mode: "confirm".into(),
            policy: "greedy".into(),
            plan_timeout_s: 600,
            pending: vec![p(2)],
            applied: vec![done],
        };
        let t = render(&r, 100);
        assert!(
            t.starts_with("mode confirm, policy greedy, plans lapse after 600 s\n"),
            "{t}"
        );
        assert!(
            t.contains("plan 2    GPU 1  7 -> 4444|3333  destroy 7g.40gb@0  create 4g.20gb@0 3g.20gb@4  keeps -  lapses in 600s"),
            "{t}"
        );
        assert!(t.contains("applied 10s ago"), "{t}");
    }

    #[test]
    fn the_expected_effect_is_a_second_line() {
        let mut x = p(3);
        x.effect = Some(PlanEffect {
            waiting: 4,
            running: 1,
            wait_keep_s: 900,
            wait_plan_s: 120,
            energy_keep_kj: 1500,
            energy_plan_kj: 1400,
            late_keep: 0,
            late_plan: 0,
            unfit_keep: 4,
            unfit_plan: 0,
        });
        let t = line(&x, 100);
        assert!(
            t.ends_with("\n           expected for the 4 waiting job(s) (1 running): mean wait 900s -> 120s, energy until drained 1500 -> 1400 kJ, fitting no instance (reshaped on demand) 4 -> 0"),
            "{t}"
        );
    }
}
