//! Per-job slice accounting (issue 22, part 3): which profile each job
//! had, on which GPU, how long it waited for it, how many slice-seconds it
//! held and how much memory it used.
//!
//! Two records, both written by smartmigd:
//!
//! - **Slurm's own job record.** When a job gets its instance, smartmigd
//!   adds a `smartmig:` word to the job's `AdminComment` (kept by slurmctld,
//!   stored by slurmdbd, shown by `scontrol show job` and `sacct -o
//!   AdminComment`): `smartmig:profile=1g.10gb,gpu=0,mem_gb=10,wait_s=3`.
//!   It must be written while the job runs: Slurm refuses to update a job
//!   that has finished ("Job has already finished"), which it already has
//!   when the epilog releases the instance. The end of the run is in
//!   Slurm's own `Elapsed`, so slice-seconds are `compute × Elapsed`. The
//!   site's own comment is kept: only the `smartmig:` word is replaced.
//! - **The node's usage log** (`<state_dir>/usage.jsonl`, one
//!   [`UsageRecord`] per released instance): the same, plus the end, the
//!   slice-seconds and the peak memory NVML showed, which only exists once
//!   the job ended.
//!
//! `smartmig usage` summarises either ([`summarise`]). Pure: formatting,
//! parsing and sums; the daemon does the IO.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The node's usage log, in the state directory.
pub const USAGE_LOG: &str = "usage.jsonl";
/// Size past which the usage log is moved to `usage.jsonl.1` (the one
/// before that is dropped): two files of at most this size.
pub const USAGE_LOG_MAX_BYTES: u64 = 32 << 20;

/// Where a usage log goes when it is rotated: `<path>.1`.
pub fn rotated(path: &Path) -> PathBuf {
    let mut old = path.as_os_str().to_owned();
    old.push(".1");
    PathBuf::from(old)
}

/// The files of the log at `path` that exist: the rotated one first, so
/// their records stay in time order (what `smartmig usage` and `smartmig
/// advise report` read). Reads only whether they exist.
pub fn existing_with_rotated(path: &Path) -> Vec<PathBuf> {
    [rotated(path), path.to_path_buf()]
        .into_iter()
        .filter(|p| p.exists())
        .collect()
}

/// The word smartmigd owns in a job's `AdminComment`.
pub const COMMENT_PREFIX: &str = "smartmig:";

/// What a job got, as written into its `AdminComment`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SliceTag {
    pub profile: String,
    pub gpu: u32,
    /// The instance's memory by its profile name (GB).
    pub memory_gb: u32,
    /// Seconds the job waited in smartmigd for its instance.
    pub wait_s: u64,
}

impl SliceTag {
    /// `smartmig:profile=1g.10gb,gpu=0,mem_gb=10,wait_s=3`: one word, no
    /// spaces, so it survives next to a site's own comment.
    pub fn to_word(&self) -> String {
        format!(
            "{COMMENT_PREFIX}profile={},gpu={},mem_gb={},wait_s={}",
            self.profile, self.gpu, self.memory_gb, self.wait_s
        )
    }

    /// The tag in an `AdminComment`, if it has one (the last, should a
    /// site have copied one around).
    pub fn find(comment: &str) -> Option<SliceTag> {
        comment
            .split_whitespace()
            .rev()
            .filter_map(|w| w.strip_prefix(COMMENT_PREFIX))
            .find_map(parse_word)
    }
}

fn parse_word(body: &str) -> Option<SliceTag> {
    let mut kv: BTreeMap<&str, &str> = BTreeMap::new();
    for pair in body.split(',') {
        let (k, v) = pair.split_once('=')?;
        kv.insert(k, v);
    }
    let profile = kv.get("profile")?;
    if profile.is_empty() {
        return None;
    }
    Some(SliceTag {
        profile: (*profile).to_string(),
        gpu: kv.get("gpu")?.parse().ok()?,
        memory_gb: kv.get("mem_gb")?.parse().ok()?,
        wait_s: kv.get("wait_s")?.parse().ok()?,
    })
}

/// `existing` with our word replaced (a requeued job's new run) or
/// appended; the rest of the site's comment is left as it was.
pub fn merge_comment(existing: &str, tag: &SliceTag) -> String {
    let mut words: Vec<&str> = existing
        .split_whitespace()
        .filter(|w| !w.starts_with(COMMENT_PREFIX))
        .collect();
    let ours = tag.to_word();
    words.push(&ours);
    words.join(" ")
}

/// The word smartmigd puts in the `AdminComment` of a job it requeued to
/// make room for an interactive step (issue 56): not [`COMMENT_PREFIX`],
/// so the next run's [`SliceTag`] leaves it.
pub const REQUEUE_PREFIX: &str = "smartmig-requeued:";

/// `smartmig-requeued:at=1764635412,for=interactive_job_14,gpu=0,next=runs_again_after_the_requeue_hold`:
/// one word, as [`SliceTag::to_word`].
pub fn requeue_word(at_unix: u64, for_job: u64, gpu: u32) -> String {
    format!(
        "{REQUEUE_PREFIX}at={at_unix},for=interactive_job_{for_job},gpu={gpu},next=runs_again_after_the_requeue_hold"
    )
}

/// The [`REQUEUE_PREFIX`] word of a job smartmigd requeued for its GPU
/// memory (issue 56): `smartmig-requeued:at=1764635412,why=out_of_gpu_memory,on=1g.5gb,gpu=0,next=runs_again_with_at_least_10gb_after_the_requeue_hold`
/// (`why=predicted_out_of_gpu_memory` for an early restart).
pub fn oom_requeue_word(
    at_unix: u64,
    gpu: u32,
    profile: &str,
    early: bool,
    next_gb: Option<u32>,
) -> String {
    let why = if early {
        "predicted_out_of_gpu_memory"
    } else {
        "out_of_gpu_memory"
    };
    let next = next_gb.map_or(
        "runs_again_on_a_larger_memory_size_after_the_requeue_hold".to_string(),
        |gb| format!("runs_again_with_at_least_{gb}gb_after_the_requeue_hold"),
    );
    format!("{REQUEUE_PREFIX}at={at_unix},why={why},on={profile},gpu={gpu},next={next}")
}

/// The [`REQUEUE_PREFIX`] word of a batch job that got no instance in time
/// and that the SPANK plugin requeues (issue 56):
/// `smartmig-requeued:at=1764635412,why=no_room_for_3g.20gb,gpu=0,next=requeued_by_the_plugin_unless_requeue=no`.
pub fn no_fit_requeue_word(at_unix: u64, gpu: u32, profile: &str) -> String {
    format!(
        "{REQUEUE_PREFIX}at={at_unix},why=no_room_for_{profile},gpu={gpu},next=requeued_by_the_plugin_unless_requeue=no"
    )
}

/// The [`REQUEUE_PREFIX`] word of a batch job refused at once because its
/// scheduling pass does not fit its GPU together (issue 56, item 2), which
/// the SPANK plugin then requeues:
/// `smartmig-requeued:at=1764635412,why=no_layout_holds_its_scheduling_pass,on=1g.5gb,gpu=0,next=requeued_by_the_plugin_unless_requeue=no`.
pub fn pass_refusal_word(at_unix: u64, gpu: u32, profile: &str) -> String {
    format!(
        "{REQUEUE_PREFIX}at={at_unix},why=no_layout_holds_its_scheduling_pass,on={profile},gpu={gpu},next=requeued_by_the_plugin_unless_requeue=no"
    )
}

/// `existing` with the last requeue word replaced by `word` (or `word`
/// appended); everything else is left as it was.
pub fn merge_requeue(existing: &str, word: &str) -> String {
    let mut words: Vec<&str> = existing
        .split_whitespace()
        .filter(|w| !w.starts_with(REQUEUE_PREFIX))
        .collect();
    words.push(word);
    words.join(" ")
}

/// One released instance, as the node's usage log keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UsageRecord {
    pub job_id: u64,
    pub uid: u32,
    /// The user's name when the daemon could look it up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The job's Slurm account, when the daemon read it from Slurm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    pub gpu: u32,
    pub profile: String,
    /// Compute slices of the profile.
    pub compute: u8,
    pub memory_gb: u32,
    /// Unix seconds the job got and released the instance.
    pub start: u64,
    pub end: u64,
    pub wait_s: u64,
    /// `compute × (end − start)`.
    pub slice_s: u64,
    /// Largest memory use sampled (GB; nvml backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_gb: Option<f64>,
}

/// Slice-seconds of `compute` slices held from `start` to `end`.
pub fn slice_seconds(compute: u8, start: u64, end: u64) -> u64 {
    u64::from(compute) * end.saturating_sub(start)
}

/// The compute slices of a profile name (`3g.20gb` -> 3).
pub fn compute_of(profile: &str) -> Option<u8> {
    profile.split_once('g')?.0.parse().ok().filter(|&c| c > 0)
}

/// The `sacct` fields [`records_from_sacct`] reads, in its order.
pub const SACCT_FIELDS: &str = "JobIDRaw,UID,User,Account,Start,End,AdminComment";

/// Records from `sacct -a -X -n -P -o` [`SACCT_FIELDS`] run with
/// `SLURM_TIME_FORMAT=%s` (Unix times): the jobs whose `AdminComment`
/// carries a [`SliceTag`]; slice-seconds are `compute × (End − Start)`
/// (the whole allocation: a job holds its instance from its step's start
/// to its end, so this is at most a few seconds more than the node's log
/// says); no peak (Slurm never had it). Lines that are not a tagged,
/// ended job are skipped.
pub fn records_from_sacct(text: &str) -> Vec<UsageRecord> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.splitn(7, '|').collect();
            let [id, uid, user, account, start, end, comment] = f.as_slice() else {
                return None;
            };
            let tag = SliceTag::find(comment)?;
            let compute = compute_of(&tag.profile)?;
            let start: u64 = start.trim().parse().ok()?;
            let end: u64 = end.trim().parse().ok()?;
            let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_string());
            Some(UsageRecord {
                job_id: id.trim().parse().ok()?,
                uid: uid.trim().parse().unwrap_or(u32::MAX),
                user: nonempty(user.trim()),
                account: nonempty(account.trim()),
                gpu: tag.gpu,
                profile: tag.profile.clone(),
                compute,
                memory_gb: tag.memory_gb,
                start,
                end,
                wait_s: tag.wait_s,
                slice_s: slice_seconds(compute, start, end),
                peak_gb: None,
            })
        })
        .collect()
}

/// What to group a summary by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    User,
    Account,
}

/// One line of `smartmig usage`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageLine {
    /// The user or account (`uid N` / `-` when unknown).
    pub who: String,
    pub jobs: u64,
    pub slice_hours: f64,
    /// Mean seconds waited for an instance.
    pub mean_wait_s: f64,
    /// Runs per profile.
    pub profiles: BTreeMap<String, u64>,
    /// Largest sampled peak, GB (absent when nothing was sampled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_peak_gb: Option<f64>,
}

/// The records that ended at or after `since` (Unix s), grouped and summed,
/// largest slice-hours first.
pub fn summarise(records: &[UsageRecord], by: GroupBy, since: u64) -> Vec<UsageLine> {
    let mut lines: BTreeMap<String, (UsageLine, u64)> = BTreeMap::new();
    for r in records.iter().filter(|r| r.end >= since) {
        let who = match by {
            GroupBy::User => r.user.clone().unwrap_or_else(|| format!("uid {}", r.uid)),
            GroupBy::Account => r.account.clone().unwrap_or_else(|| "-".to_string()),
        };
        let (line, wait_sum) = lines.entry(who.clone()).or_insert_with(|| {
            (
                UsageLine {
                    who,
                    ..UsageLine::default()
                },
                0,
            )
        });
        line.jobs += 1;
        line.slice_hours += r.slice_s as f64 / 3600.0;
        *wait_sum += r.wait_s;
        *line.profiles.entry(r.profile.clone()).or_default() += 1;
        if let Some(p) = r.peak_gb {
            line.max_peak_gb = Some(line.max_peak_gb.map_or(p, |m| m.max(p)));
        }
    }
    let mut out: Vec<UsageLine> = lines
        .into_values()
        .map(|(mut l, wait_sum)| {
            l.mean_wait_s = wait_sum as f64 / l.jobs as f64;
            l
        })
        .collect();
    out.sort_by(|a, b| {
        b.slice_hours
            .total_cmp(&a.slice_hours)
            .then_with(|| a.who.cmp(&b.who))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag() -> SliceTag {
        SliceTag {
            profile: "1g.10gb".into(),
            gpu: 1,
            memory_gb: 10,
            wait_s: 3,
        }
    }

    #[test]
    fn the_comment_word_round_trips_and_keeps_the_sites_comment() {
        let t = tag();
        assert_eq!(
            t.to_word(),
            "smartmig:profile=1g.10gb,gpu=1,mem_gb=10,wait_s=3"
        );
        assert_eq!(SliceTag::find(&t.to_word()), Some(t.clone()));
        let merged = merge_comment("site=abc  ticket=12", &t);
        assert_eq!(merged, format!("site=abc ticket=12 {}", t.to_word()));
        // A requeued job's next run replaces our word, not the site's.
        let next = SliceTag {
            profile: "3g.20gb".into(),
            ..t.clone()
        };
        let again = merge_comment(&merged, &next);
        assert_eq!(again, format!("site=abc ticket=12 {}", next.to_word()));
        assert_eq!(SliceTag::find(&again), Some(next));
        assert_eq!(merge_comment("", &t), t.to_word());
    }

    /// Issue 56: a job smartmigd requeued says so in its AdminComment, and
    /// the word stays when its next run is tagged; a second requeue
    /// replaces it.
    #[test]
    fn the_requeue_word_survives_the_next_runs_tag() {
        let t = tag();
        let first = requeue_word(100, 14, 0);
        assert_eq!(
            first,
            "smartmig-requeued:at=100,for=interactive_job_14,gpu=0,next=runs_again_after_the_requeue_hold"
        );
        let requeued = merge_requeue(&format!("site=abc {}", t.to_word()), &first);
        assert_eq!(requeued, format!("site=abc {} {first}", t.to_word()));
        let next = SliceTag {
            profile: "3g.20gb".into(),
            ..t.clone()
        };
        let rerun = merge_comment(&requeued, &next);
        assert_eq!(rerun, format!("site=abc {first} {}", next.to_word()));
        assert_eq!(SliceTag::find(&rerun), Some(next.clone()));
        let second = requeue_word(200, 15, 1);
        assert_eq!(
            merge_requeue(&rerun, &second),
            format!("site=abc {} {second}", next.to_word())
        );
    }

    /// Issue 56: an out-of-memory requeue says why in one word, which a
    /// later requeue replaces like any requeue word.
    #[test]
    fn an_oom_requeue_word_names_the_profile_and_what_comes_next() {
        let w = oom_requeue_word(100, 1, "1g.5gb", false, Some(10));
        assert_eq!(
            w,
            "smartmig-requeued:at=100,why=out_of_gpu_memory,on=1g.5gb,gpu=1,next=runs_again_with_at_least_10gb_after_the_requeue_hold"
        );
        assert!(!w.contains(' '));
        let early = oom_requeue_word(100, 0, "2g.10gb", true, None);
        assert!(early.contains("why=predicted_out_of_gpu_memory"), "{early}");
        assert_eq!(
            merge_requeue(&format!("site=x {w}"), &early),
            format!("site=x {early}")
        );
    }

    #[test]
    fn malformed_words_are_not_tags() {
        for c in [
            "",
            "site=abc",
            "smartmig:",
            "smartmig:profile=,gpu=0,mem_gb=5,wait_s=0",
            "smartmig:profile=1g.5gb,gpu=x,mem_gb=5,wait_s=0",
            "smartmig:profile=1g.5gb,gpu=0,mem_gb=5",
            "smartmig:profile=1g.5gb;gpu=0",
        ] {
            assert_eq!(SliceTag::find(c), None, "{c:?}");
        }
    }

    fn rec(
        user: &str,
        account: Option<&str>,
        profile: &str,
        compute: u8,
        secs: u64,
        end: u64,
    ) -> UsageRecord {
        UsageRecord {
            job_id: end,
            uid: 1000,
            user: Some(user.into()),
            account: account.map(String::from),
            gpu: 0,
            profile: profile.into(),
            compute,
            memory_gb: 10,
            start: end - secs,
            end,
            wait_s: 4,
            slice_s: slice_seconds(compute, end - secs, end),
            peak_gb: Some(f64::from(compute)),
        }
    }

    #[test]
    fn sacct_lines_with_a_tag_become_records() {
        let text = "\
101|1000|alice|phys|1000|4600|smartmig:profile=3g.20gb,gpu=1,mem_gb=20,wait_s=2
102|1001|bob|chem|1000|2000|site=x
103|1001|bob||5000|5600|ticket=7 smartmig:profile=1g.5gb,gpu=0,mem_gb=5,wait_s=0
104|1001|bob|chem|5000|Unknown|smartmig:profile=1g.5gb,gpu=0,mem_gb=5,wait_s=0
garbage
";
        let rs = records_from_sacct(text);
        assert_eq!(rs.len(), 2, "{rs:?}");
        assert_eq!(rs[0].job_id, 101);
        assert_eq!(rs[0].slice_s, 3 * 3600);
        assert_eq!(rs[0].account.as_deref(), Some("phys"));
        assert_eq!(rs[1].account, None);
        assert_eq!(rs[1].slice_s, 600);
        assert_eq!(compute_of("7g.40gb"), Some(7));
        assert_eq!(compute_of("x"), None);
    }

    #[test]
    fn summaries_sum_slice_hours_per_user_and_account() {
        let rs = vec![
            rec("alice", Some("phys"), "1g.10gb", 1, 3600, 10_000),
            rec("alice", Some("phys"), "3g.20gb", 3, 1200, 20_000),
            rec("bob", Some("chem"), "7g.40gb", 7, 3600, 30_000),
            rec("bob", None, "1g.10gb", 1, 7200, 8_000),
        ];
        let by_user = summarise(&rs, GroupBy::User, 0);
        assert_eq!(by_user.len(), 2);
        assert_eq!(by_user[0].who, "bob");
        assert!((by_user[0].slice_hours - 9.0).abs() < 1e-9);
        assert_eq!(by_user[1].who, "alice");
        assert!((by_user[1].slice_hours - 2.0).abs() < 1e-9);
        assert_eq!(by_user[1].profiles.get("3g.20gb"), Some(&1));
        assert_eq!(by_user[1].max_peak_gb, Some(3.0));
        assert!((by_user[1].mean_wait_s - 4.0).abs() < 1e-9);
        let by_account = summarise(&rs, GroupBy::Account, 0);
        let names: Vec<&str> = by_account.iter().map(|l| l.who.as_str()).collect();
        assert_eq!(names, ["chem", "-", "phys"]);
        // Only what ended since the cut.
        let recent = summarise(&rs, GroupBy::User, 15_000);
        assert_eq!(recent.iter().map(|l| l.jobs).sum::<u64>(), 2);
    }
}
