//! Scenario families: seeded synthetic workloads whose job mix *moves*.
//!
//! The diurnal generator keeps its training share fixed all day, so one
//! static MIG layout is near-optimal by construction and a repartitioning
//! policy has nothing to follow. Each family here changes what arrives, not
//! only how much:
//!
//! - `diurnal`: the diurnal generator unchanged (the control).
//! - `mix-shift`: inference by day, training by night (a night wave of
//!   training jobs on an inference-heavy day).
//! - `campaigns`: bursts of one job kind starting at random hours, which no
//!   clock schedule can follow.
//! - `big-night`: jobs needing more than 20 GB at night, on top of a daytime
//!   mix that fits small slices.
//! - `batch`: a bag of jobs all at t = 0 (makespan is its metric).
//!
//! Every family is the diurnal background ([`DiurnalConfig`]: its job sizes,
//! clock and, except for `batch`, its arrival rate) plus the family's own
//! stream, drawn by the same core (`diurnal::generate_overlaid`). Each comes
//! in two deadline regimes ([`DeadlineRegime`]). The shipped suite is
//! `scenarios.toml` ([`default_scenarios`]); `docs/workload.md` ("Scenario
//! families") has the reasons and the measured offered loads.
//!
//! Pure code: [`parse_scenarios`] reads a TOML string, the caller opens files.

use std::fmt;
use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::mig::GpuModel;
use crate::workload::diurnal::{bad, generate_overlaid, range, JobDrawer, Overlay, RateShape};
use crate::workload::{DiurnalConfig, Job, JobKind, WorkloadError};

/// The shipped scenarios file: the default suite, with every parameter
/// commented, for admins to copy and edit.
pub const DEFAULT_SCENARIOS_TOML: &str = include_str!("scenarios.toml");

/// The family names as spelled in TOML (`family = "..."`).
pub const FAMILIES: [&str; 5] = ["diurnal", "mix-shift", "campaigns", "big-night", "batch"];

/// How long a job may take: deadline = arrival + U(lo, hi) x its run time on
/// the whole GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeadlineRegime {
    /// U(1, 1.5), SMART-MIG's: a job started at once on a small slice
    /// almost never makes it, so sizing is a real trade-off.
    Tight,
    /// U(2, 4), the regime a Maskable-PPO study moved to because the tight
    /// one was not learnable.
    Loose,
}

impl DeadlineRegime {
    pub const ALL: [DeadlineRegime; 2] = [DeadlineRegime::Tight, DeadlineRegime::Loose];

    /// The `(lo, hi)` of the uniform deadline factor.
    pub fn factor(self) -> (f64, f64) {
        match self {
            DeadlineRegime::Tight => (1.0, 1.5),
            DeadlineRegime::Loose => (2.0, 4.0),
        }
    }

    /// `tight` / `loose`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadlineRegime::Tight => "tight",
            DeadlineRegime::Loose => "loose",
        }
    }
}

impl fmt::Display for DeadlineRegime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeadlineRegime {
    type Err = WorkloadError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeadlineRegime::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| bad("deadline", format!("{s:?} is not `tight` or `loose`")))
    }
}

/// `mix-shift`: a night wave of training jobs (the background's training
/// kind) on an inference-heavy background, so the training share follows
/// the hour of day.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixShiftConfig {
    /// Rate of the night training wave at its peak, jobs per hour per GPU
    /// (0 twelve hours later).
    pub night_training_rate: f64,
    /// Hour of day of the wave's peak, in [0, 24).
    pub night_peak_hour: f64,
}

/// `big-night`: a night wave of jobs of one kind (LLM fine-tuning: more
/// memory than the small slices hold) on the background.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BigNightConfig {
    /// Rate of the night wave at its peak, jobs per hour per GPU.
    pub night_rate: f64,
    /// Hour of day of the wave's peak, in [0, 24).
    pub night_peak_hour: f64,
    /// What the night wave's jobs are.
    pub job: JobKind,
}

/// `campaigns`: bursts of one job kind on the background.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CampaignsConfig {
    /// Expected campaigns per day: their start times are a Poisson process
    /// over the horizon, so neither their number nor their hour is known.
    pub campaigns_per_day: f64,
    /// Uniform range of a campaign's duration, hours.
    pub duration_h: (f64, f64),
    /// What a campaign can be; each campaign picks one uniformly.
    pub kinds: Vec<CampaignKind>,
}

/// One kind of campaign: a job kind and the rate it arrives at while the
/// campaign lasts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CampaignKind {
    /// Label for reports (e.g. `sweep`).
    pub name: String,
    /// Arrival rate during the campaign, jobs per hour per GPU.
    pub rate: f64,
    pub job: JobKind,
}

/// `batch`: a bag of jobs all submitted at t = 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Jobs per GPU (the bag holds `jobs_per_gpu x gpus`), drawn like the
    /// background's (class by `training_share`).
    pub jobs_per_gpu: u32,
}

/// A family and its own parameters (the background is [`Scenario::base`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Family {
    Diurnal,
    MixShift(MixShiftConfig),
    Campaigns(CampaignsConfig),
    BigNight(BigNightConfig),
    Batch(BatchConfig),
}

impl Family {
    /// The name as spelled in TOML (one of [`FAMILIES`]).
    pub fn name(&self) -> &'static str {
        match self {
            Family::Diurnal => "diurnal",
            Family::MixShift(_) => "mix-shift",
            Family::Campaigns(_) => "campaigns",
            Family::BigNight(_) => "big-night",
            Family::Batch(_) => "batch",
        }
    }
}

/// One campaign of a drawn schedule ([`Scenario::campaigns`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Campaign {
    /// Start, s since t = 0.
    pub start_s: f64,
    /// End, s (arrivals stop at the horizon even if the campaign does not).
    pub end_s: f64,
    /// Index into [`CampaignsConfig::kinds`].
    pub kind: usize,
}

impl CampaignsConfig {
    /// Draws the campaigns of `horizon_s`: start times by exponential gaps
    /// (a Poisson process), then per campaign a uniform duration and a
    /// uniformly chosen kind.
    fn schedule<R: Rng + ?Sized>(&self, horizon_s: f64, rng: &mut R) -> Vec<Campaign> {
        let per_s = self.campaigns_per_day / 86_400.0;
        let mut out = Vec::new();
        if !(per_s.is_finite() && per_s > 0.0 && horizon_s.is_finite()) || self.kinds.is_empty() {
            return out;
        }
        let mut t = 0.0_f64;
        loop {
            let u: f64 = rng.random();
            t += -(1.0 - u).ln() / per_s;
            if t >= horizon_s {
                return out;
            }
            let (lo, hi) = self.duration_h;
            let d = (lo + (hi - lo) * rng.random::<f64>()) * 3600.0;
            let kind = rng.random_range(0..self.kinds.len());
            out.push(Campaign {
                start_s: t,
                end_s: t + d,
                kind,
            });
        }
    }
}

/// One named scenario: a family plus its parameters and a deadline regime.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Unique in a suite, e.g. `mix-shift/tight`.
    pub name: String,
    pub family: Family,
    pub deadline: DeadlineRegime,
    /// The background (and, for `batch`, the bag's job mix). Its
    /// `deadline_factor` is ignored: `deadline` sets it.
    pub base: DiurnalConfig,
}

impl Scenario {
    /// The background with the regime's deadline factor.
    fn base_cfg(&self) -> DiurnalConfig {
        DiurnalConfig {
            deadline_factor: self.deadline.factor(),
            ..self.base.clone()
        }
    }

    /// The jobs on `gpus` GPUs of `model`: sorted by arrival, ids `0..n`, a
    /// pure function of the arguments (`ChaCha8Rng` seeded with `seed`; a
    /// campaign schedule is drawn from it first). The `diurnal` family gives
    /// exactly [`crate::workload::generate_diurnal`]'s jobs with the regime's
    /// deadline factor. Call [`Scenario::validate`] first; an invalid
    /// scenario does not panic but its output is unspecified.
    pub fn generate(&self, model: GpuModel, gpus: usize, seed: u64) -> Vec<Job> {
        let base = self.base_cfg();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let night = |kind: JobKind, peak_rate: f64, peak_hour: f64| Overlay {
            kind,
            shape: RateShape::Wave {
                peak_rate,
                peak_hour,
            },
        };
        let overlays = match &self.family {
            Family::Diurnal => Vec::new(),
            Family::MixShift(c) => vec![night(
                base.training_kind(),
                c.night_training_rate,
                c.night_peak_hour,
            )],
            Family::BigNight(c) => vec![night(c.job, c.night_rate, c.night_peak_hour)],
            Family::Campaigns(c) => c
                .schedule(base.horizon_s, &mut rng)
                .into_iter()
                .map(|k| Overlay {
                    kind: c.kinds[k.kind].job,
                    shape: RateShape::Window {
                        start_s: k.start_s,
                        end_s: k.end_s,
                        rate: c.kinds[k.kind].rate,
                    },
                })
                .collect(),
            Family::Batch(c) => {
                let drawer = JobDrawer::new(&base, model);
                let n = (c.jobs_per_gpu as usize).saturating_mul(gpus);
                return (0..n as u64)
                    .map(|id| {
                        let kind = base.background_kind(&mut rng);
                        drawer.draw(&mut rng, &kind, id, 0.0)
                    })
                    .collect();
            }
        };
        generate_overlaid(&base, &overlays, model, gpus, &mut rng)
    }

    /// The campaigns [`Scenario::generate`] draws for `seed` (empty for the
    /// other families): for plots and for checking a policy's reaction.
    pub fn campaigns(&self, seed: u64) -> Vec<Campaign> {
        match &self.family {
            Family::Campaigns(c) => {
                c.schedule(self.base.horizon_s, &mut ChaCha8Rng::seed_from_u64(seed))
            }
            _ => Vec::new(),
        }
    }

    /// The arrival window, s (`SimConfig::workload_horizon_s`); 0 for `batch`.
    pub fn horizon_s(&self) -> f64 {
        if self.is_batch() {
            0.0
        } else {
            self.base.horizon_s
        }
    }

    /// Hour of day at t = 0 (`SimConfig::start_hour`).
    pub fn start_hour(&self) -> f64 {
        self.base.start_hour
    }

    /// True for `batch`, whose metric is the makespan (no arrivals to follow).
    pub fn is_batch(&self) -> bool {
        matches!(self.family, Family::Batch(_))
    }

    /// Checks every parameter; the error names the field as spelled in TOML.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.name.trim().is_empty() {
            return Err(bad("name", "is empty".into()));
        }
        self.base_cfg().validate()?;
        let rate = |field: &'static str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(bad(field, format!("{v} is not a finite value >= 0")))
            }
        };
        let hour = |field: &'static str, v: f64| {
            if (0.0..24.0).contains(&v) {
                Ok(())
            } else {
                Err(bad(field, format!("{v} is not in [0, 24)")))
            }
        };
        match &self.family {
            Family::Diurnal => Ok(()),
            Family::MixShift(c) => {
                rate("night_training_rate", c.night_training_rate)?;
                hour("night_peak_hour", c.night_peak_hour)
            }
            Family::BigNight(c) => {
                rate("night_rate", c.night_rate)?;
                hour("night_peak_hour", c.night_peak_hour)?;
                c.job.validate().map_err(|e| nest("job", e))
            }
            Family::Campaigns(c) => {
                rate("campaigns_per_day", c.campaigns_per_day)?;
                range("duration_h", c.duration_h, f64::MIN_POSITIVE)?;
                if c.kinds.is_empty() && c.campaigns_per_day > 0.0 {
                    return Err(bad("kinds", "is empty but campaigns_per_day > 0".into()));
                }
                for k in &c.kinds {
                    let named = |e: WorkloadError| match e {
                        WorkloadError::Invalid { field, message } => {
                            bad(field, format!("kind {:?}: {message}", k.name))
                        }
                        other => other,
                    };
                    rate("kinds.rate", k.rate).map_err(named)?;
                    k.job.validate().map_err(|e| named(nest("kinds.job", e)))?;
                }
                Ok(())
            }
            Family::Batch(c) => {
                if c.jobs_per_gpu == 0 {
                    Err(bad("jobs_per_gpu", "0 is not >= 1".into()))
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// Puts a nested table's field under `prefix` (`job` + `memory_gb`:
/// "invalid job: memory_gb: ...").
fn nest(prefix: &'static str, e: WorkloadError) -> WorkloadError {
    match e {
        WorkloadError::Invalid { field, message } => bad(prefix, format!("{field}: {message}")),
        other => other,
    }
}

/// The scenarios of `all` that `only` names (all of them when `only` is
/// empty), in `all`'s order. A name selects itself and, as a family name,
/// both its deadline regimes (`mix-shift` selects `mix-shift/tight` and
/// `mix-shift/loose`). A name that selects nothing is an error listing the
/// known ones.
pub fn select_scenarios(
    all: Vec<Scenario>,
    only: &[String],
) -> Result<Vec<Scenario>, WorkloadError> {
    if only.is_empty() {
        return Ok(all);
    }
    let selects = |s: &Scenario, o: &str| s.name == o || s.name.split('/').next() == Some(o);
    if let Some(o) = only.iter().find(|o| !all.iter().any(|s| selects(s, o))) {
        let known: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        return Err(WorkloadError::NoSuchScenario {
            asked: o.clone(),
            known: known.join(", "),
        });
    }
    Ok(all
        .into_iter()
        .filter(|s| only.iter().any(|o| selects(s, o)))
        .collect())
}

/// The default suite: every family x both deadline regimes (10 scenarios,
/// named `<family>/<regime>`), parsed from the shipped `scenarios.toml`.
pub fn default_scenarios() -> Vec<Scenario> {
    // The shipped file is a build input, checked by the test `default_suite`.
    parse_scenarios(DEFAULT_SCENARIOS_TOML).expect("the shipped scenarios.toml is valid")
}

/// Diurnal parameters that mean nothing when every job arrives at t = 0.
const BATCH_IGNORES: [&str; 4] = ["horizon_s", "base_rate", "peak_rate", "peak_hour"];

/// Parses a scenarios file: an array of tables `[[scenario]]`, each with
/// `name`, `family` (one of [`FAMILIES`]), `deadline` (`"tight"`,
/// `"loose"`, or a list of both: one scenario per regime, named
/// `<name>/<regime>`), any diurnal parameter for the background (defaults:
/// [`DiurnalConfig::default`]; not `deadline_factor`) and the family's own
/// parameters (all required). Unknown fields are rejected; every error
/// names the scenario and the field. Names must be unique.
pub fn parse_scenarios(toml_text: &str) -> Result<Vec<Scenario>, WorkloadError> {
    let mut doc: toml::Table =
        toml::from_str(toml_text).map_err(|e| WorkloadError::ScenarioFile(e.to_string()))?;
    let list = doc.remove("scenario");
    if let Some(k) = doc.keys().next() {
        return Err(WorkloadError::ScenarioFile(format!(
            "unknown top-level key `{k}` (expected only [[scenario]] tables)"
        )));
    }
    let tables = match list {
        Some(toml::Value::Array(a)) if !a.is_empty() => a,
        Some(toml::Value::Array(_)) | None => {
            return Err(WorkloadError::ScenarioFile(
                "no [[scenario]] table".to_string(),
            ))
        }
        Some(_) => {
            return Err(WorkloadError::ScenarioFile(
                "`scenario` must be an array of tables ([[scenario]])".to_string(),
            ))
        }
    };
    let mut out: Vec<Scenario> = Vec::new();
    for (i, v) in tables.into_iter().enumerate() {
        let label = format!("#{}", i + 1);
        let toml::Value::Table(t) = v else {
            return Err(WorkloadError::Scenario {
                scenario: label,
                message: "not a table".to_string(),
            });
        };
        for s in parse_one(&label, t)? {
            if out.iter().any(|o| o.name == s.name) {
                return Err(WorkloadError::Scenario {
                    scenario: s.name,
                    message: "name defined twice".to_string(),
                });
            }
            out.push(s);
        }
    }
    Ok(out)
}

/// One `[[scenario]]` table: one scenario, or one per regime of a list.
fn parse_one(label: &str, mut t: toml::Table) -> Result<Vec<Scenario>, WorkloadError> {
    let name = match t.remove("name") {
        Some(toml::Value::String(s)) if !s.trim().is_empty() => s,
        Some(_) => return Err(in_scenario(label, "invalid name: not a non-empty string")),
        None => return Err(in_scenario(label, "missing field `name`")),
    };
    let err = |m: String| in_scenario(&name, &m);
    let family_name = match t.remove("family") {
        Some(toml::Value::String(s)) => s,
        Some(v) => return Err(err(format!("invalid family: {v} is not a string"))),
        None => return Err(err("missing field `family`".to_string())),
    };
    if !FAMILIES.contains(&family_name.as_str()) {
        return Err(err(format!(
            "invalid family: {family_name:?} is not one of {}",
            FAMILIES.join(", ")
        )));
    }
    let regime = |v: &toml::Value| match v {
        toml::Value::String(s) => s.parse::<DeadlineRegime>().map_err(|e| err(e.to_string())),
        other => Err(err(format!("invalid deadline: {other} is not a string"))),
    };
    let (regimes, suffixed) = match t.remove("deadline") {
        Some(toml::Value::Array(a)) if !a.is_empty() => {
            (a.iter().map(regime).collect::<Result<Vec<_>, _>>()?, true)
        }
        Some(toml::Value::Array(_)) => return Err(err("invalid deadline: empty list".into())),
        Some(v) => (vec![regime(&v)?], false),
        None => {
            return Err(err(
                "missing field `deadline` (\"tight\", \"loose\" or [\"tight\", \"loose\"])".into(),
            ))
        }
    };

    // Split the rest: the diurnal generator's parameters go to the
    // background, everything else to the family.
    let is_batch = family_name == "batch";
    let base_keys = match toml::Value::try_from(DiurnalConfig::default()) {
        Ok(toml::Value::Table(k)) => k,
        _ => toml::Table::new(),
    };
    let mut base_t = toml::Table::new();
    for key in base_keys.keys() {
        if let Some(v) = t.remove(key) {
            if key == "deadline_factor" {
                return Err(err(
                    "deadline_factor is set by `deadline` (tight or loose)".into()
                ));
            }
            if is_batch && BATCH_IGNORES.contains(&key.as_str()) {
                return Err(err(format!(
                    "{key} does not apply to the batch family (every job arrives at t = 0)"
                )));
            }
            base_t.insert(key.clone(), v);
        }
    }
    let base: DiurnalConfig = typed(base_t).map_err(|e| err(e.to_string()))?;
    // An unknown key of the family's own table may be a misspelt diurnal
    // parameter (those share the table); one in a sub-table is not.
    let family_of = |e: TableError| match &e {
        TableError::Whole { message }
        | TableError::Line {
            message,
            table: None,
            ..
        } if message.starts_with("unknown field") => {
            err(format!("{e}; or any parameter of the diurnal generator"))
        }
        _ => err(e.to_string()),
    };
    let family = match family_name.as_str() {
        "diurnal" => match t.keys().next() {
            Some(k) => {
                return Err(err(format!(
                    "unknown field `{k}` (the diurnal family takes the diurnal generator's parameters only)"
                )))
            }
            None => Family::Diurnal,
        },
        "mix-shift" => Family::MixShift(typed(t).map_err(family_of)?),
        "campaigns" => Family::Campaigns(typed(t).map_err(family_of)?),
        "big-night" => Family::BigNight(typed(t).map_err(family_of)?),
        _ => Family::Batch(typed(t).map_err(family_of)?),
    };
    regimes
        .into_iter()
        .map(|deadline| {
            let s = Scenario {
                name: if suffixed {
                    format!("{name}/{deadline}")
                } else {
                    name.clone()
                },
                family: family.clone(),
                deadline,
                base: base.clone(),
            };
            s.validate()
                .map_err(|e| in_scenario(&s.name, &e.to_string()))?;
            Ok(s)
        })
        .collect()
}

/// Why a scenario's (sub)table does not deserialize: serde's message and
/// the line of the table (as TOML text) it points at.
#[derive(Debug, thiserror::Error)]
enum TableError {
    /// The table cannot be written back as TOML text (it was read from
    /// TOML, so this is not expected).
    #[error(transparent)]
    Encode(#[from] toml::ser::Error),
    /// No line to show (a missing field: its span is the whole table's).
    #[error("{message}")]
    Whole { message: String },
    /// On a sub-table's header line (`header` is `[...]`).
    #[error("{message}, in {header}")]
    Header { message: String, header: String },
    /// On a `key = value` line, of a sub-table (`table`, its header) or
    /// of the scenario's own table (`None`).
    #[error("{message}, at `{line}`{}", .table.as_ref().map(|h| format!(" in {h}")).unwrap_or_default())]
    Line {
        message: String,
        line: String,
        table: Option<String>,
    },
}

/// Deserializes a scenario's (sub)table. Through TOML text rather than
/// `Value::try_into`, because only the text deserializer reports where an
/// error is: the message then quotes the offending line (which names the
/// field) and the table header above it.
fn typed<T: serde::de::DeserializeOwned>(t: toml::Table) -> Result<T, TableError> {
    let text = toml::to_string(&t)?;
    toml::from_str(&text).map_err(|e| {
        let message = e.message().trim().to_string();
        // A missing field has no line of its own (the span is the table's).
        let span = e.span().filter(|_| !message.starts_with("missing field"));
        let Some(before) = span.and_then(|sp| text.get(..sp.start)) else {
            return TableError::Whole { message };
        };
        let start = before.rfind('\n').map_or(0, |i| i + 1);
        let line = text[start..].lines().next().unwrap_or("").trim();
        let header = before[..start]
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('['));
        match header {
            _ if line.starts_with('[') => TableError::Header {
                message,
                header: line.to_string(),
            },
            None if line.is_empty() => TableError::Whole { message },
            table => TableError::Line {
                message,
                line: line.to_string(),
                table: table.map(|h| h.trim().to_string()),
            },
        }
    })
}

fn in_scenario(scenario: &str, message: &str) -> WorkloadError {
    WorkloadError::Scenario {
        scenario: scenario.to_string(),
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{generate_diurnal, offered_load, JobClass};

    const M: GpuModel = GpuModel::A100_40gb;

    fn scenario(name: &str) -> Scenario {
        default_scenarios()
            .into_iter()
            .find(|s| s.name == name)
            .unwrap()
    }

    /// Hour of day of every job (the default suite starts at 00 h).
    fn hour(j: &Job) -> usize {
        ((j.arrival / 3600.0).floor() as usize) % 24
    }

    #[test]
    fn default_suite() {
        let all = default_scenarios();
        assert_eq!(all.len(), 12);
        let mut names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 12);
        for family in FAMILIES {
            for regime in DeadlineRegime::ALL {
                let s = scenario(&format!("{family}/{regime}"));
                assert_eq!(s.family.name(), family);
                assert_eq!(s.deadline, regime);
                s.validate().unwrap();
                assert_eq!(s.is_batch(), family == "batch");
                assert_eq!(s.start_hour(), 0.0);
                let horizon = if family == "batch" { 0.0 } else { 86_400.0 };
                assert_eq!(s.horizon_s(), horizon);
            }
        }
    }

    #[test]
    fn multi_gpu_night_brings_gang_jobs_of_whole_gpus() {
        let s = scenario("multi-gpu-night/tight");
        let (mut gangs, mut gpu_s, mut all_s) = (0usize, 0.0, 0.0);
        for seed in 0..20 {
            for j in s.generate(M, 16, seed) {
                j.validate(M).unwrap();
                all_s += j.most_efficient_profile(M).map_or(0.0, |(_, a)| a);
                if j.is_gang() {
                    assert!((2..=4).contains(&j.gpus), "{j:?}");
                    assert_eq!(j.requested_slices, Some(7), "{j:?}");
                    gangs += 1;
                    gpu_s += j.work * f64::from(j.gpus);
                }
            }
            // Capped to the cluster: two GPUs never get a job of three.
            assert!(s.generate(M, 2, seed).iter().all(|j| j.gpus <= 2));
        }
        // About 8 gang jobs a day on 16 GPUs, near a quarter of the GPU-time.
        let per_day = gangs as f64 / 20.0;
        assert!((5.0..=11.0).contains(&per_day), "{per_day} gang jobs a day");
        let share = gpu_s / all_s;
        assert!(
            (0.15..=0.35).contains(&share),
            "gang share of GPU-time {share}"
        );
        // The other scenarios have none.
        for other in default_scenarios()
            .iter()
            .filter(|o| !o.name.starts_with("multi-gpu"))
        {
            assert!(
                other.generate(M, 16, 1).iter().all(|j| j.gpus == 1),
                "{}",
                other.name
            );
        }
    }

    #[test]
    fn same_seed_same_jobs_other_seed_other_jobs() {
        for s in default_scenarios() {
            let a = s.generate(M, 8, 5);
            assert!(!a.is_empty(), "{}", s.name);
            assert_eq!(a, s.generate(M, 8, 5), "{}", s.name);
            assert_ne!(a, s.generate(M, 8, 6), "{}", s.name);
        }
    }

    #[test]
    fn jobs_are_valid_sorted_and_follow_the_regime() {
        for s in default_scenarios() {
            let (lo, hi) = s.deadline.factor();
            for model in [M, GpuModel::A30_24gb, GpuModel::H100_80gb] {
                let total = model.spec().compute_slices;
                let jobs = s.generate(model, 8, 3);
                let mut factors = (f64::INFINITY, 0.0_f64);
                for (i, j) in jobs.iter().enumerate() {
                    let ctx = format!("{} on {model}, job {i}", s.name);
                    assert_eq!(j.id, i as u64, "{ctx}");
                    j.validate(model).expect(&ctx);
                    assert!(j.arrival >= 0.0, "{ctx}");
                    assert!(j.arrival < s.horizon_s() || j.arrival == 0.0, "{ctx}");
                    // deadline = arrival + U(lo, hi) x run time on the whole GPU.
                    let f = (j.deadline - j.arrival) / j.runtime_on(total, total);
                    assert!(f >= lo - 1e-9 && f <= hi + 1e-9, "{ctx}: factor {f}");
                    factors = (factors.0.min(f), factors.1.max(f));
                    if let Some(k) = j.requested_slices {
                        assert!(j.arrival + j.runtime_on(k, total) <= j.deadline + 1e-6);
                    }
                }
                assert!(jobs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
                // The draws span the regime's range, not a corner of it.
                let span = hi - lo;
                assert!(factors.0 < lo + 0.1 * span && factors.1 > hi - 0.1 * span);
            }
        }
    }

    #[test]
    fn diurnal_family_is_the_diurnal_generator() {
        for seed in [0, 42] {
            let tight = scenario("diurnal/tight").generate(M, 8, seed);
            assert_eq!(
                tight,
                generate_diurnal(&DiurnalConfig::default(), M, 8, seed)
            );
            let loose = DiurnalConfig {
                deadline_factor: (2.0, 4.0),
                ..DiurnalConfig::default()
            };
            assert_eq!(
                scenario("diurnal/loose").generate(M, 8, seed),
                generate_diurnal(&loose, M, 8, seed)
            );
        }
    }

    #[test]
    fn tight_deadlines_rule_out_one_slice() {
        // Share of jobs that would meet their deadline on one compute slice
        // if started at once (memory permitting or not): what makes the
        // regimes differ for a sizing policy.
        let share = |name: &str| {
            let (mut ok, mut n) = (0usize, 0usize);
            for seed in 0..20 {
                for j in scenario(name).generate(M, 8, seed) {
                    n += 1;
                    ok += usize::from(j.arrival + j.runtime_on(1, 7) <= j.deadline);
                }
            }
            ok as f64 / n as f64
        };
        let (tight, loose) = (share("diurnal/tight"), share("diurnal/loose"));
        eprintln!("on time on 1g if started at once: tight {tight:.4}, loose {loose:.4}");
        assert!(tight < 0.01, "{tight}");
        assert!(loose > 0.2, "{loose}");
    }

    /// Training share of the arrivals in hours `[from, to)`, over seeds.
    fn training_share(s: &Scenario, from: usize, to: usize) -> f64 {
        let (mut train, mut all) = (0usize, 0usize);
        for seed in 0..20 {
            for j in s.generate(M, 8, seed) {
                if (from..to).contains(&hour(&j)) {
                    all += 1;
                    train += usize::from(j.class == JobClass::Training);
                }
            }
        }
        train as f64 / all as f64
    }

    #[test]
    fn mix_shift_trains_by_night() {
        let s = scenario("mix-shift/tight");
        let (night, day) = (training_share(&s, 0, 6), training_share(&s, 12, 18));
        eprintln!("mix-shift training share: night {night:.3} day {day:.3}");
        assert!(night >= 3.0 * day, "night {night} day {day}");
        assert!(night > 0.3 && day < 0.1, "night {night} day {day}");
        // The control does not shift.
        let d = scenario("diurnal/tight");
        let (night, day) = (training_share(&d, 0, 6), training_share(&d, 12, 18));
        assert!(
            night < 1.5 * day && day < 1.5 * night,
            "night {night} day {day}"
        );
    }

    /// Mean over hours of the variance between seeds of the hour's training
    /// share (32 GPUs: enough arrivals per hour that sampling noise is small).
    fn hourly_mix_variance(s: &Scenario) -> f64 {
        let seeds = 20;
        let mut shares = vec![Vec::new(); 24];
        for seed in 0..seeds {
            let mut count = [(0usize, 0usize); 24];
            for j in s.generate(M, 32, seed) {
                let c = &mut count[hour(&j)];
                c.0 += usize::from(j.class == JobClass::Training);
                c.1 += 1;
            }
            for (h, (t, n)) in count.iter().enumerate() {
                if *n > 0 {
                    shares[h].push(*t as f64 / *n as f64);
                }
            }
        }
        let var = |v: &Vec<f64>| {
            let m = v.iter().sum::<f64>() / v.len() as f64;
            v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64
        };
        shares.iter().map(var).sum::<f64>() / 24.0
    }

    #[test]
    fn campaigns_make_the_hourly_mix_unpredictable() {
        let c = hourly_mix_variance(&scenario("campaigns/tight"));
        let d = hourly_mix_variance(&scenario("diurnal/tight"));
        eprintln!(
            "variance between seeds of the hourly training share: campaigns {c:.5} diurnal {d:.5}"
        );
        assert!(c > 10.0 * d, "campaigns {c} diurnal {d}");
    }

    #[test]
    fn campaign_schedules() {
        let s = scenario("campaigns/loose");
        let Family::Campaigns(cfg) = &s.family else {
            panic!("{:?}", s.family)
        };
        let seeds = 200;
        let mut n = 0;
        let mut kinds = vec![0; cfg.kinds.len()];
        for seed in 0..seeds {
            let c = s.campaigns(seed);
            n += c.len();
            for k in &c {
                let d = (k.end_s - k.start_s) / 3600.0;
                assert!((1.0..=4.0).contains(&d), "{d}");
                assert!((0.0..86_400.0).contains(&k.start_s));
                kinds[k.kind] += 1;
            }
            // The jobs of a campaign arrive inside it: each window holds
            // jobs of its kind's memory range.
            if let Some(k) = c.first() {
                let mem = cfg.kinds[k.kind].job.memory_gb;
                let jobs = s.generate(M, 8, seed);
                assert!(jobs
                    .iter()
                    .any(|j| (k.start_s..k.end_s).contains(&j.arrival)
                        && j.class == cfg.kinds[k.kind].job.class
                        && (mem.0..=mem.1).contains(&j.memory_gb)));
            }
        }
        let per_day = n as f64 / f64::from(seeds as u32);
        assert!((2.6..=3.4).contains(&per_day), "{per_day}");
        assert!(kinds.iter().all(|&k| k > 150), "{kinds:?}");
    }

    #[test]
    fn big_night_jobs_arrive_at_night() {
        let s = scenario("big-night/tight");
        let (mut night, mut all) = (0usize, 0usize);
        for seed in 0..20 {
            for j in s.generate(M, 8, seed).iter().filter(|j| j.memory_gb > 20.0) {
                all += 1;
                let h = hour(j);
                night += usize::from(!(8..20).contains(&h));
                // On A100-40GB only the whole GPU holds them.
                assert_eq!(j.most_efficient_profile(M).unwrap().0.shape.compute, 7);
            }
        }
        let share = night as f64 / all as f64;
        eprintln!("big-night: {all} jobs > 20 GB over 20 days, {share:.3} between 20 h and 08 h");
        assert!(all > 200, "{all}");
        assert!(share >= 0.75, "{share}");
    }

    #[test]
    fn batch_is_a_bag_at_time_zero() {
        let s = scenario("batch/tight");
        let Family::Batch(cfg) = &s.family else {
            panic!("{:?}", s.family)
        };
        for gpus in [1, 8, 13] {
            let jobs = s.generate(M, gpus, 1);
            assert_eq!(jobs.len(), cfg.jobs_per_gpu as usize * gpus);
            assert!(jobs.iter().all(|j| j.arrival == 0.0));
            let train = jobs
                .iter()
                .filter(|j| j.class == JobClass::Training)
                .count();
            assert!(train > 0 && train < jobs.len());
        }
    }

    /// Seed-averaged hourly offered load of one day on 8 A100-40GB, and
    /// the mean number of jobs.
    fn hourly_load(s: &Scenario) -> ([f64; 24], f64) {
        let seeds = 200;
        let mut sum = [0.0; 24];
        let mut n = 0;
        for seed in 0..seeds {
            let jobs = s.generate(M, 8, seed);
            n += jobs.len();
            for (h, l) in offered_load(&jobs, M, 8, 3600.0)
                .into_iter()
                .enumerate()
                .take(24)
            {
                sum[h] += l / seeds as f64;
            }
        }
        (sum, n as f64 / seeds as f64)
    }

    #[test]
    fn calibrated_offered_load() {
        // (family, band of the peak 3 h's load, band of the night's 00-06 h).
        let bands = [
            ("diurnal", (0.80, 0.90), (0.20, 0.30)),
            ("mix-shift", (0.70, 0.90), (0.55, 0.80)),
            ("campaigns", (0.70, 0.90), (0.25, 0.40)),
            ("big-night", (0.70, 0.90), (0.55, 0.80)),
        ];
        for (family, peak_band, night_band) in bands {
            let (load, jobs) = hourly_load(&scenario(&format!("{family}/tight")));
            // The busiest 3 hours: a single hour's mean still carries the
            // noise of the heavy-tailed training work.
            let peak = (0..24)
                .map(|h| (0..3).map(|i| load[(h + i) % 24]).sum::<f64>() / 3.0)
                .fold(0.0, f64::max);
            let night = load[0..6].iter().sum::<f64>() / 6.0;
            let day = load.iter().sum::<f64>() / 24.0;
            eprintln!(
                "{family}: {jobs:.0} jobs/day; peak 3 h {peak:.3}, night(0-6h) {night:.3}, day mean {day:.3}; hourly {:?}",
                load.iter().map(|l| (l * 100.0).round() / 100.0).collect::<Vec<_>>()
            );
            assert!(
                (peak_band.0..=peak_band.1).contains(&peak),
                "{family} peak {peak}"
            );
            assert!(
                (night_band.0..=night_band.1).contains(&night),
                "{family} night {night}"
            );
        }
        // What one campaign adds while it lasts: its rate x the mean
        // GPU-seconds of its jobs on their best slices.
        let s = scenario("campaigns/tight");
        let Family::Campaigns(cfg) = &s.family else {
            panic!("{:?}", s.family)
        };
        let drawer = JobDrawer::new(&s.base_cfg(), M);
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        for k in &cfg.kinds {
            let n = 20_000;
            let area: f64 = (0..n)
                .map(|i| {
                    let j = drawer.draw(&mut rng, &k.job, i, 0.0);
                    j.most_efficient_profile(M).map_or(j.work, |(_, a)| a)
                })
                .sum();
            let added = k.rate * area / n as f64 / 3600.0;
            eprintln!("campaign {:?} adds {added:.2} of load while active", k.name);
            assert!((0.2..=1.0).contains(&added), "{} {added}", k.name);
        }
        // Batch: GPU-hours per GPU of the bag, on the best slices and on
        // whole GPUs (their ratio bounds what slicing can gain).
        let s = scenario("batch/tight");
        let (mut best, mut whole, mut inf_best, mut inf_whole) = (0.0, 0.0, 0.0, 0.0);
        for seed in 0..200 {
            for j in s.generate(M, 8, seed) {
                let b = j.most_efficient_profile(M).map_or(j.work, |(_, a)| a);
                best += b;
                whole += j.work;
                if j.class == JobClass::Inference {
                    inf_best += b;
                    inf_whole += j.work;
                }
            }
        }
        let (best, whole) = (best / 200.0 / 8.0 / 3600.0, whole / 200.0 / 8.0 / 3600.0);
        eprintln!(
            "batch: {best:.2} GPU-hours per GPU on the best slices, {whole:.2} on whole GPUs \
             (ratio {:.2}; inference alone {:.2})",
            whole / best,
            inf_whole / inf_best
        );
        assert!((6.0..=10.0).contains(&best), "{best}");
        assert!(whole / best > 1.2, "{}", whole / best);
    }

    #[test]
    fn custom_files_parse() {
        let text = r#"
            [[scenario]]
            name = "my-shift"
            family = "mix-shift"
            deadline = "loose"
            peak_rate = 6.0
            night_training_rate = 0.3
            night_peak_hour = 1.0

            [[scenario]]
            name = "bag"
            family = "batch"
            deadline = ["loose"]
            training_share = 0.0
            jobs_per_gpu = 3
        "#;
        let all = parse_scenarios(text).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].name, "my-shift");
        assert_eq!(all[0].deadline, DeadlineRegime::Loose);
        assert_eq!(all[0].base.peak_rate, 6.0);
        assert_eq!(all[0].base.base_rate, DiurnalConfig::default().base_rate);
        assert_eq!(
            all[0].family,
            Family::MixShift(MixShiftConfig {
                night_training_rate: 0.3,
                night_peak_hour: 1.0
            })
        );
        assert_eq!(all[1].name, "bag/loose");
        let jobs = all[1].generate(M, 2, 0);
        assert_eq!(jobs.len(), 6);
        assert!(jobs.iter().all(|j| j.class == JobClass::Inference));
    }

    #[test]
    fn parse_errors_name_the_scenario_and_field() {
        let head = "[[scenario]]\nname = \"s1\"\n";
        let shift = "family = \"mix-shift\"\nnight_training_rate = 0.3\nnight_peak_hour = 1.0\n";
        let cases: Vec<(String, &str, &str)> = vec![
            // (file, scenario named in the error, words the message must hold)
            (format!("{head}{shift}deadline = \"tight\"\nnight_rat = 1.0"), "s1", "night_rat"),
            (format!("{head}{shift}deadline = \"medium\""), "s1", "deadline"),
            (format!("{head}{shift}deadline = [\"tight\", \"lose\"]"), "s1", "\"lose\""),
            (format!("{head}{shift}"), "s1", "missing field `deadline`"),
            (
                format!("{head}family = \"daily\"\ndeadline = \"tight\""),
                "s1",
                "invalid family: \"daily\"",
            ),
            (
                format!("{head}family = \"mix-shift\"\ndeadline = \"tight\"\nnight_peak_hour = 1.0"),
                "s1",
                "night_training_rate",
            ),
            (format!("{head}{shift}deadline = \"tight\"\npeak_rate = \"high\""), "s1", "peak_rate"),
            (format!("{head}{shift}deadline = \"tight\"\npeak_rate = 0.5"), "s1", "peak_rate"),
            (
                format!("{head}{shift}deadline = \"tight\"\ndeadline_factor = [1.0, 2.0]"),
                "s1",
                "deadline_factor",
            ),
            (
                format!(
                    "{head}family = \"mix-shift\"\nnight_training_rate = 0.3\n\
                     night_peak_hour = 25.0\ndeadline = \"tight\""
                ),
                "s1",
                "night_peak_hour",
            ),
            (
                format!("{head}family = \"diurnal\"\ndeadline = \"tight\"\njobs_per_gpu = 3"),
                "s1",
                "jobs_per_gpu",
            ),
            (
                format!("{head}family = \"batch\"\ndeadline = \"tight\"\njobs_per_gpu = 3\npeak_rate = 5.0"),
                "s1",
                "peak_rate",
            ),
            (
                format!("{head}family = \"batch\"\ndeadline = \"tight\"\njobs_per_gpu = 0"),
                "s1",
                "jobs_per_gpu",
            ),
            (
                format!(
                    "{head}family = \"big-night\"\ndeadline = \"tight\"\nnight_rate = 0.1\n\
                     night_peak_hour = 2.0\n[scenario.job]\nclass = \"training\"\n\
                     work = {{ dist = \"lognormal\", median_s = 1.0, sigma = 0.5, mean_s = 2.0 }}\n\
                     memory_gb = [24.0, 40.0]"
                ),
                "s1",
                "mean_s",
            ),
            (
                format!(
                    "{head}family = \"big-night\"\ndeadline = \"tight\"\nnight_rate = 0.1\n\
                     night_peak_hour = 2.0\n[scenario.job]\nclass = \"training\"\n\
                     work = {{ dist = \"lognormal\", median_s = 1.0, sigma = 0.5 }}\n\
                     memory_gb = [40.0, 24.0]"
                ),
                "s1",
                "invalid job: memory_gb: (40, 24)",
            ),
            (
                format!(
                    "{head}family = \"campaigns\"\ndeadline = \"tight\"\ncampaigns_per_day = 1.0\n\
                     duration_h = [1.0, 2.0]\n[[scenario.kinds]]\nname = \"k\"\nrate = -1.0\n\
                     job = {{ class = \"inference\", work = {{ dist = \"exponential\", mean_s = 9.0 }}, \
                     memory_gb = [1.0, 2.0] }}"
                ),
                "s1",
                "kinds.rate",
            ),
            (format!("{head}{shift}deadline = \"tight\"\n{head}{shift}deadline = \"loose\""), "s1", "twice"),
            ("[[scenario]]\nfamily = \"diurnal\"\ndeadline = \"tight\"".into(), "#1", "name"),
        ];
        for (text, scenario, words) in cases {
            match parse_scenarios(&text) {
                Err(e @ WorkloadError::Scenario { .. }) => {
                    let msg = e.to_string();
                    eprintln!("{msg}");
                    assert!(msg.contains(&format!("scenario {scenario:?}")), "{msg}");
                    assert!(msg.contains(words), "{msg}\n--- from ---\n{text}");
                }
                other => panic!("{other:?}\n--- from ---\n{text}"),
            }
        }
        // Whole-file errors.
        for text in [
            "",
            "[[scenario]\n",
            "title = 1\n[[scenario]]\nname = \"a\"",
            "scenario = 3",
        ] {
            match parse_scenarios(text) {
                Err(e @ WorkloadError::ScenarioFile(_)) => eprintln!("{e}"),
                other => panic!("{other:?} from {text:?}"),
            }
        }
    }
}
