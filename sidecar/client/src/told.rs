//! Told why (issue 56): the `smartmig-requeued:` word smartmig puts in a
//! requeued job's `AdminComment`, and the one line the job's next run
//! prints in its output.
//!
//! Both ends use this module, so the word has one grammar and the line one
//! formatter: smartmigd writes the word for the requeues it causes and
//! hands [`Requeued::line`] to the plugin as the next run's note; the SPANK
//! plugin writes the word itself when smartmigd is unreachable, and on a
//! rerun that smartmigd has no note for (smartmigd restarted meanwhile, or
//! the job now runs on another node) reads the word back from Slurm and
//! prints the same line.
//!
//! The word read back is hostile input: `AdminComment` is free text that
//! other admin tools write too, and on Slurm 22.05 it is cut out of
//! `scontrol show job` text whose other fields the job's user sets. So
//! [`find`] reads a bounded prefix of the comment, only words with
//! [`REQUEUE_PREFIX`], only known keys with short values of a small
//! character set, and the line is built from fixed text and those values
//! alone: a forged word can at most make a job's own output claim a
//! requeue, never run anything or write outside that line.

/// The prefix of the word (not `smartmig:`, the slice tag of each run, so
/// that a run's tag and the requeue word stay apart).
pub const REQUEUE_PREFIX: &str = "smartmig-requeued:";

/// How much of an `AdminComment` [`find`] reads (Slurm does not bound it).
pub const MAX_COMMENT_LEN: usize = 16 * 1024;

/// The longest word [`Requeued::parse`] accepts.
pub const MAX_WORD_LEN: usize = 512;

/// The longest value of one key.
const MAX_VALUE_LEN: usize = 96;

/// `next=`: the job starts again after Slurm's requeue hold.
pub const NEXT_AFTER_HOLD: &str = "runs_again_after_the_requeue_hold";
/// `next=`: the plugin requeues the batch job (unless `requeue=no`).
pub const NEXT_BY_PLUGIN: &str = "requeued_by_the_plugin_unless_requeue=no";
/// `next=`: smartmigd was unreachable; the job starts again elsewhere, or
/// here once smartmigd resumed the node.
pub const NEXT_ONCE_BACK: &str = "runs_again_on_another_node_or_once_smartmigd_is_back";

/// Why smartmig requeued the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// `for=interactive_job_N`: it gave way to an interactive step.
    GaveWay { for_job: u64 },
    /// `why=no_room_for_P`: no instance of profile `P` (`an_instance`
    /// when unknown) within `allocate_wait_s`.
    NoRoom { profile: String },
    /// `why=out_of_gpu_memory` or, `early`, `why=predicted_out_of_gpu_memory`.
    OutOfMemory { early: bool },
    /// `why=no_layout_holds_its_scheduling_pass`: the jobs Slurm started
    /// on its GPU together fit in no MIG layout, and smartmigd refused this
    /// one at once (issue 56, item 2); the plugin requeued it.
    PassRefused,
    /// `why=smartmigd_unreachable`: the plugin requeued it.
    Unreachable,
    /// Another `why=` (a newer smartmig's): shown as it is.
    Other(String),
}

/// One requeue word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requeued {
    /// `at=`: Unix seconds of the requeue.
    pub at: u64,
    pub why: Why,
    /// `on=`: the profile the run held or needed.
    pub profile: Option<String>,
    /// `gpu=`: the GPU's index on its node.
    pub gpu: Option<u32>,
    /// `node=`: the node's Slurm name.
    pub node: Option<String>,
    /// `next=`: what happens next (the `NEXT_*` constants, or
    /// `runs_again_with_at_least_<N>gb_after_the_requeue_hold`).
    pub next: Option<String>,
}

impl Requeued {
    /// Gave way on `gpu` to interactive job `for_job`, which needed `profile`.
    pub fn gave_way(at: u64, for_job: u64, gpu: u32, profile: &str) -> Self {
        Self {
            at,
            why: Why::GaveWay { for_job },
            profile: Some(profile.to_string()),
            gpu: Some(gpu),
            node: None,
            next: Some(NEXT_AFTER_HOLD.to_string()),
        }
    }

    /// Ran out of GPU memory on `profile` (`early`: predicted to); the next
    /// run gets at least `next_gb`.
    pub fn out_of_memory(
        at: u64,
        gpu: u32,
        profile: &str,
        early: bool,
        next_gb: Option<u32>,
    ) -> Self {
        let next = next_gb.map_or(
            "runs_again_on_a_larger_memory_size_after_the_requeue_hold".to_string(),
            |gb| format!("runs_again_with_at_least_{gb}gb_after_the_requeue_hold"),
        );
        Self {
            at,
            why: Why::OutOfMemory { early },
            profile: Some(profile.to_string()),
            gpu: Some(gpu),
            node: None,
            next: Some(next),
        }
    }

    /// A batch job that got no `profile` in time; the plugin requeues it.
    pub fn no_room(at: u64, gpu: u32, profile: &str) -> Self {
        Self {
            at,
            why: Why::NoRoom {
                profile: profile.to_string(),
            },
            profile: None,
            gpu: Some(gpu),
            node: None,
            next: Some(NEXT_BY_PLUGIN.to_string()),
        }
    }

    /// A batch job refused `profile` at once on `gpu` because its
    /// scheduling pass fits no layout there; the plugin requeues it.
    pub fn pass_refused(at: u64, gpu: u32, profile: &str) -> Self {
        Self {
            at,
            why: Why::PassRefused,
            profile: Some(profile.to_string()),
            gpu: Some(gpu),
            node: None,
            next: Some(NEXT_BY_PLUGIN.to_string()),
        }
    }

    /// smartmigd did not answer on `node`; the plugin requeues the job.
    pub fn unreachable(at: u64, node: Option<&str>, gpu: u32) -> Self {
        Self {
            at,
            why: Why::Unreachable,
            profile: None,
            gpu: Some(gpu),
            node: node.filter(|n| value_ok(n)).map(String::from),
            next: Some(NEXT_ONCE_BACK.to_string()),
        }
    }

    /// The word, without spaces: `smartmig-requeued:at=..,why=..,gpu=0,next=..`
    /// (`for=` instead of `why=` for [`Why::GaveWay`]).
    pub fn to_word(&self) -> String {
        let mut w = format!("{REQUEUE_PREFIX}at={}", self.at);
        match &self.why {
            Why::GaveWay { for_job } => w.push_str(&format!(",for=interactive_job_{for_job}")),
            why => w.push_str(&format!(",why={}", why_token(why))),
        }
        for (key, value) in [
            ("on", self.profile.clone()),
            ("gpu", self.gpu.map(|g| g.to_string())),
            ("node", self.node.clone()),
            ("next", self.next.clone()),
        ] {
            if let Some(v) = value {
                w.push_str(&format!(",{key}={v}"));
            }
        }
        w
    }

    /// Parses one word; `None` unless it is a well-formed requeue word
    /// (bounded, known keys once each, `at` and `why` or `for` present).
    /// Unknown keys are skipped (a newer smartmig's).
    pub fn parse(word: &str) -> Option<Self> {
        if word.len() > MAX_WORD_LEN {
            return None;
        }
        let body = word.strip_prefix(REQUEUE_PREFIX)?;
        let mut seen: Vec<&str> = Vec::new();
        let (mut at, mut why, mut out) = (None, None, Self::default_for_parse());
        for pair in body.split(',') {
            let (key, value) = pair.split_once('=')?;
            if !value_ok(value) {
                return None;
            }
            if seen.contains(&key) {
                return None;
            }
            seen.push(key);
            match key {
                "at" => at = Some(value.parse().ok()?),
                "for" => {
                    let job = value.strip_prefix("interactive_job_")?.parse().ok()?;
                    why = Some(Why::GaveWay { for_job: job });
                }
                "why" => why = Some(parse_why(value)),
                "on" => out.profile = Some(value.to_string()),
                "gpu" => out.gpu = Some(value.parse().ok()?),
                "node" => out.node = Some(value.to_string()),
                "next" => out.next = Some(value.to_string()),
                _ => {}
            }
        }
        if seen.contains(&"for") && seen.contains(&"why") {
            return None;
        }
        out.at = at?;
        out.why = why?;
        Some(out)
    }

    fn default_for_parse() -> Self {
        Self {
            at: 0,
            why: Why::Unreachable,
            profile: None,
            gpu: None,
            node: None,
            next: None,
        }
    }

    /// The line the job's next run prints (the plugin adds `smartmig: `):
    /// why, when and what happens next; `detail` (smartmigd's own reason,
    /// known only where the requeue happened) goes in parentheses after
    /// the why.
    pub fn line(&self, detail: Option<&str>) -> String {
        let state = match self.why {
            Why::OutOfMemory { early: false } => "FAILED",
            _ => "CANCELLED ... DUE TO JOB REQUEUE",
        };
        let detail = detail.map(|d| format!(" ({d})")).unwrap_or_default();
        format!(
            "this job was requeued by smartmig at {} (Slurm's \"{state}\" of its previous run): \
             its previous run {}{detail}; {}",
            utc(self.at),
            self.why_text(),
            next_text(self.next.as_deref())
        )
    }

    /// What happened to the previous run, in words.
    fn why_text(&self) -> String {
        let gpu = self.gpu.map_or("a GPU".to_string(), |g| format!("GPU {g}"));
        let node = self
            .node
            .as_ref()
            .map_or("the node it ran on".to_string(), |n| format!("node {n}"));
        let profile = self.profile.as_deref().unwrap_or("MIG instance");
        match &self.why {
            Why::GaveWay { for_job } => format!(
                "had started moments before on {gpu} of {node}, and interactive job {for_job} \
                 needed a {profile} there that MIG could not build beside it (an interactive \
                 step cannot be requeued, a batch job can)"
            ),
            Why::NoRoom { profile } => {
                let what = if profile == "an_instance" {
                    "it".to_string()
                } else {
                    format!("a {profile}")
                };
                format!(
                    "got no MIG instance on {gpu} of {node}: smartmigd found no room for {what} \
                     in time, because Slurm placed it on shards MIG could not build beside that \
                     GPU's busy instances (a batch job is requeued instead of failing)"
                )
            }
            Why::OutOfMemory { early: false } => {
                format!("ran out of GPU memory on its {profile} ({gpu} of {node})")
            }
            Why::OutOfMemory { early: true } => format!(
                "was restarted early: its GPU memory use was rising to more than its {profile} \
                 ({gpu} of {node})"
            ),
            Why::PassRefused => format!(
                "was refused a MIG instance on {gpu} of {node} at once: the jobs Slurm \
                 started on that GPU together fit in no MIG layout, and none of them ends \
                 within the wait, so this {profile} gave way to the rest (a batch job is \
                 requeued instead of waiting in vain)"
            ),
            Why::Unreachable => format!(
                "got no MIG instance on {node}: smartmigd, the node's MIG daemon, did not answer \
                 (stopped or restarting), so the smartmig SPANK plugin requeued the job instead \
                 of failing it"
            ),
            Why::Other(why) => format!("was requeued by smartmig (reason: {why})"),
        }
    }
}

/// The `why=` value of a reason ([`Why::GaveWay`] is written as `for=`).
fn why_token(why: &Why) -> String {
    match why {
        Why::GaveWay { for_job } => format!("gave_way_to_interactive_job_{for_job}"),
        Why::NoRoom { profile } => format!("no_room_for_{profile}"),
        Why::OutOfMemory { early: false } => "out_of_gpu_memory".to_string(),
        Why::OutOfMemory { early: true } => "predicted_out_of_gpu_memory".to_string(),
        Why::PassRefused => "no_layout_holds_its_scheduling_pass".to_string(),
        Why::Unreachable => "smartmigd_unreachable".to_string(),
        Why::Other(w) => w.clone(),
    }
}

fn parse_why(value: &str) -> Why {
    match value {
        "out_of_gpu_memory" => Why::OutOfMemory { early: false },
        "predicted_out_of_gpu_memory" => Why::OutOfMemory { early: true },
        "smartmigd_unreachable" => Why::Unreachable,
        "no_layout_holds_its_scheduling_pass" => Why::PassRefused,
        v => match v.strip_prefix("no_room_for_") {
            Some(p) if !p.is_empty() => Why::NoRoom {
                profile: p.to_string(),
            },
            _ => Why::Other(v.to_string()),
        },
    }
}

/// What happens next, in words.
fn next_text(next: Option<&str>) -> String {
    let gb = next
        .and_then(|n| n.strip_prefix("runs_again_with_at_least_"))
        .and_then(|n| n.strip_suffix("gb_after_the_requeue_hold"))
        .and_then(|n| n.parse::<u32>().ok());
    if let Some(gb) = gb {
        return format!("this is its next run, on a profile with at least {gb} GB");
    }
    match next {
        Some(NEXT_AFTER_HOLD) => "this is its next run, started after Slurm's requeue hold".into(),
        Some(NEXT_ONCE_BACK) => {
            "this is its next run, on another node or after smartmigd came back".into()
        }
        Some("runs_again_on_a_larger_memory_size_after_the_requeue_hold") => {
            "this is its next run, on a larger memory size".into()
        }
        _ => "this is its next run".into(),
    }
}

/// A value of the word: short, and only letters, digits and `._+-=` (no
/// space, comma, quote or control character: nothing a line can be bent with).
fn value_ok(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_VALUE_LEN
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-=".contains(&b))
}

/// The last well-formed requeue word of an `AdminComment` (the newest: a
/// requeue replaces the word, see [`merge`]), reading at most
/// [`MAX_COMMENT_LEN`] bytes of it.
pub fn find(admin_comment: &str) -> Option<Requeued> {
    let mut end = admin_comment.len().min(MAX_COMMENT_LEN);
    while !admin_comment.is_char_boundary(end) {
        end -= 1;
    }
    admin_comment[..end]
        .split_whitespace()
        .rev()
        .filter(|w| w.starts_with(REQUEUE_PREFIX))
        .find_map(Requeued::parse)
}

/// `existing` with any requeue word replaced by `word` (or `word`
/// appended); the rest of the comment (the site's words, the run's
/// `smartmig:` tag) is left as it was.
pub fn merge(existing: &str, word: &str) -> String {
    let mut words: Vec<&str> = existing
        .split_whitespace()
        .filter(|w| !w.starts_with(REQUEUE_PREFIX))
        .collect();
    words.push(word);
    words.join(" ")
}

/// `2026-12-02 07:10:03 UTC` for Unix seconds (proleptic Gregorian).
fn utc(unix: u64) -> String {
    let days = i64::try_from(unix / 86_400).unwrap_or(0);
    let secs = unix % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_are_right() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_764_635_412), "2025-12-02 00:30:12 UTC");
    }

    /// Every word smartmig writes reads back as itself.
    #[test]
    fn every_word_round_trips() {
        for w in [
            Requeued::gave_way(100, 14, 0, "1g.5gb"),
            Requeued::out_of_memory(100, 1, "1g.5gb", false, Some(10)),
            Requeued::out_of_memory(100, 0, "2g.10gb", true, None),
            Requeued::no_room(100, 0, "3g.20gb"),
            Requeued::no_room(100, 0, "an_instance"),
            Requeued::unreachable(100, Some("n1"), 1),
            Requeued::unreachable(100, None, 1),
        ] {
            let word = w.to_word();
            assert!(!word.contains(' ') && word.len() <= MAX_WORD_LEN, "{word}");
            assert_eq!(Requeued::parse(&word), Some(w.clone()), "{word}");
            assert_eq!(find(&format!("site=a {word} smartmig:profile=x")), Some(w));
        }
        assert_eq!(
            Requeued::gave_way(100, 14, 0, "1g.5gb").to_word(),
            "smartmig-requeued:at=100,for=interactive_job_14,on=1g.5gb,gpu=0,next=runs_again_after_the_requeue_hold"
        );
        assert_eq!(
            Requeued::unreachable(100, Some("n1"), 1).to_word(),
            "smartmig-requeued:at=100,why=smartmigd_unreachable,gpu=1,node=n1,next=runs_again_on_another_node_or_once_smartmigd_is_back"
        );
        // A node name that could bend the word is left out.
        assert_eq!(Requeued::unreachable(1, Some("a,b"), 0).node, None);
    }

    /// The words smartmigd wrote before this module (no `on=` for a job
    /// that gave way) still read.
    #[test]
    fn older_words_still_read() {
        let w = Requeued::parse(
            "smartmig-requeued:at=5,for=interactive_job_14,gpu=0,next=runs_again_after_the_requeue_hold",
        )
        .expect("parses");
        assert_eq!(w.why, Why::GaveWay { for_job: 14 });
        assert!(
            w.line(None).contains("needed a MIG instance there"),
            "{}",
            w.line(None)
        );
    }

    /// The line says why, when and what next, for every reason.
    #[test]
    fn each_line_says_why_and_what_next() {
        let cases = [
            (
                Requeued::unreachable(0, Some("n1"), 0),
                "did not answer",
                "on another node or after smartmigd came back",
            ),
            (
                Requeued::no_room(0, 0, "1g.5gb"),
                "got no MIG instance on GPU 0 of the node it ran on: smartmigd found no room for a 1g.5gb",
                "this is its next run",
            ),
            (
                Requeued::out_of_memory(0, 0, "1g.5gb", false, Some(10)),
                "its previous run ran out of GPU memory on its 1g.5gb (GPU 0",
                "at least 10 GB",
            ),
            (
                Requeued::out_of_memory(0, 0, "1g.5gb", true, None),
                "restarted early",
                "a larger memory size",
            ),
            (
                Requeued::gave_way(0, 14, 0, "1g.5gb"),
                "interactive job 14 needed a 1g.5gb there",
                "after Slurm's requeue hold",
            ),
        ];
        for (w, why, next) in cases {
            let line = w.line(Some("detail"));
            assert!(
                line.starts_with("this job was requeued by smartmig at 1970-01-01 00:00:00 UTC"),
                "{line}"
            );
            assert!(line.contains(why) && line.contains(next), "{line}");
            assert!(line.contains("(detail)"), "{line}");
            assert!(!line.contains('\n'), "{line}");
        }
        assert!(Requeued::out_of_memory(0, 0, "1g.5gb", false, None)
            .line(None)
            .contains("\"FAILED\""));
    }

    /// Hostile comments: other tools' words, forged or broken requeue
    /// words, oversized values and comments yield nothing (or the last
    /// good word); nothing outside the character set reaches the line.
    #[test]
    fn hostile_comments_yield_no_word() {
        for c in [
            "",
            "site=abc",
            "smartmig-requeued:",
            "smartmig-requeued:at=x,why=smartmigd_unreachable",
            "smartmig-requeued:why=smartmigd_unreachable",
            "smartmig-requeued:at=1",
            "smartmig-requeued:at=1,at=2,why=x",
            "smartmig-requeued:at=1,why=x,for=interactive_job_3",
            "smartmig-requeued:at=1,for=someone_else",
            "smartmig-requeued:at=1,why=x\u{1b}[2J",
            "smartmig-requeued:at=1,why=x;rm",
            "smartmig-requeued:at=1,why=x,gpu=-1",
            "smartmig-requeued:at=1,why=x,,",
            "smartmig-requeued:at=1,why=x,node=\"n\"",
            "xsmartmig-requeued:at=1,why=x",
        ] {
            assert_eq!(find(c), None, "{c:?}");
        }
        let long = format!(
            "smartmig-requeued:at=1,why={}",
            "a".repeat(MAX_VALUE_LEN + 1)
        );
        assert_eq!(find(&long), None);
        let far = format!(
            "{} smartmig-requeued:at=1,why=x",
            "w ".repeat(MAX_COMMENT_LEN)
        );
        assert_eq!(find(&far), None, "read past the bound");
        // Multi-byte text at the bound does not panic.
        assert_eq!(find(&"é".repeat(MAX_COMMENT_LEN)), None);
        // An unknown reason or key (a newer smartmig's) still reads.
        let w = find("a smartmig-requeued:at=1,why=bad_luck,color=red b").expect("reads");
        assert_eq!(w.why, Why::Other("bad_luck".into()));
        assert!(w.line(None).contains("(reason: bad_luck)"));
        // The last good word wins.
        let w =
            find("smartmig-requeued:at=1,why=x smartmig-requeued:at=2,why=y smartmig-requeued:bad")
                .expect("reads");
        assert_eq!(w.at, 2);
    }

    #[test]
    fn merge_replaces_only_the_requeue_word() {
        let first = Requeued::gave_way(100, 14, 0, "1g.5gb").to_word();
        let merged = merge("site=abc  smartmig:profile=1g.5gb", &first);
        assert_eq!(merged, format!("site=abc smartmig:profile=1g.5gb {first}"));
        let second = Requeued::unreachable(200, None, 1).to_word();
        assert_eq!(
            merge(&merged, &second),
            format!("site=abc smartmig:profile=1g.5gb {second}")
        );
        assert_eq!(merge("", &first), first);
    }
}
