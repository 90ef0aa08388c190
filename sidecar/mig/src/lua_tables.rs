//! The MIG tables in `etc/slurm/job_submit.lua` must equal [`MODELS`].
//!
//! slurmctld's job_submit/lua script bills shard jobs by the profile the
//! sidecar will build, so its copy of the tables (compute slices, memory
//! slices and GB, profile names per model, and each profile's `room`: the
//! default profile whose shards it blocks, [`super::models::ModelSpec::room_profile`],
//! issue 55) must be this crate's. The test
//! renders the block from [`MODELS`] and compares it line by line with the
//! one between the `BEGIN`/`END SMARTMIG MIG TABLES` markers of the script;
//! on a difference it prints the block to paste.

use super::models::MODELS;

const SCRIPT_PATH: &str = "etc/slurm/job_submit.lua";
const SCRIPT: &str = include_str!("../../../etc/slurm/job_submit.lua");
const BEGIN: &str = "-- BEGIN SMARTMIG MIG TABLES";
const END: &str = "-- END SMARTMIG MIG TABLES";

/// The Lua block (without the marker lines) as it must read.
fn expected_block() -> String {
    let mut out = String::from("local MIG_MODELS = {\n");
    for m in &MODELS {
        out.push_str(&format!(
            "    {{ id = \"{}\", compute_slices = {}, memory_slices = {}, memory_gb = {}, profiles = {{\n",
            m.id, m.compute_slices, m.memory_slices, m.memory_gb
        ));
        for p in m.profiles {
            out.push_str(&format!(
                "        {{ compute = {}, memory = {}, memory_gb = {}, name = \"{}\", room = \"{}\" }},\n",
                p.shape.compute,
                p.shape.memory,
                p.memory_gb,
                p.name(),
                m.room_profile(p).name()
            ));
        }
        out.push_str("    } },\n");
    }
    out.push_str("}\n");
    out
}

/// The lines strictly between the markers, or why they cannot be found.
fn script_block(script: &str) -> Result<Vec<&str>, String> {
    let lines: Vec<&str> = script.lines().collect();
    let find = |marker: &str| {
        let hits: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.trim() == marker)
            .map(|(i, _)| i)
            .collect();
        match hits.as_slice() {
            [one] => Ok(*one),
            [] => Err(format!("{SCRIPT_PATH} has no line `{marker}`")),
            _ => Err(format!(
                "{SCRIPT_PATH} has `{marker}` {} times (lines {hits:?}); keep one",
                hits.len()
            )),
        }
    };
    let (begin, end) = (find(BEGIN)?, find(END)?);
    if end <= begin {
        return Err(format!("{SCRIPT_PATH}: `{END}` comes before `{BEGIN}`"));
    }
    Ok(lines[begin + 1..end].to_vec())
}

#[test]
fn job_submit_lua_tables_equal_the_rust_tables() {
    let block = script_block(SCRIPT).unwrap_or_else(|e| panic!("{e}"));
    let expected = expected_block();
    let want: Vec<&str> = expected.lines().collect();
    let got: Vec<&str> = block.iter().map(|l| l.trim_end()).collect();
    if got != want {
        let first = want
            .iter()
            .zip(&got)
            .position(|(w, g)| w != g)
            .unwrap_or(want.len().min(got.len()));
        panic!(
            "the MIG tables in {SCRIPT_PATH} differ from sidecar/mig/src/models.rs \
             (first difference at block line {}: script has {:?}, expected {:?}).\n\
             Replace the lines between `{BEGIN}` and `{END}` with:\n{expected}",
            first + 1,
            got.get(first),
            want.get(first),
        );
    }
}

#[test]
fn marker_lookup_reports_missing_and_doubled_markers() {
    assert!(script_block("no markers here")
        .unwrap_err()
        .contains("has no line"));
    let doubled = format!("{BEGIN}\n{BEGIN}\nx\n{END}\n");
    assert!(script_block(&doubled).unwrap_err().contains("2 times"));
    let reversed = format!("{END}\nx\n{BEGIN}\n");
    assert!(script_block(&reversed)
        .unwrap_err()
        .contains("comes before"));
    let ok = format!("a\n{BEGIN}\nx\ny\n{END}\nb\n");
    assert_eq!(script_block(&ok).unwrap(), vec!["x", "y"]);
}

#[test]
fn expected_block_covers_every_model_and_profile() {
    let block = expected_block();
    for m in &MODELS {
        assert!(block.contains(&format!("id = \"{}\"", m.id)), "{}", m.id);
        for p in m.profiles {
            assert!(block.contains(&format!("name = \"{}\"", p.name())));
        }
    }
    // The memory variants name the default profile whose room they take
    // (issue 55), the default profiles themselves.
    assert!(block.contains("memory_gb = 10, name = \"1g.10gb\", room = \"2g.10gb\""));
    assert!(block.contains("memory_gb = 10, name = \"2g.10gb\", room = \"2g.10gb\""));
    // A sabotaged copy of the script is caught: change one memory size.
    let sabotaged = SCRIPT.replacen(
        "memory_gb = 20, name = \"3g.20gb\"",
        "memory_gb = 21, name = \"3g.20gb\"",
        1,
    );
    assert_ne!(sabotaged, SCRIPT, "the script has no 3g.20gb row to change");
    let got: Vec<String> = script_block(&sabotaged)
        .unwrap()
        .iter()
        .map(|l| l.trim_end().to_string())
        .collect();
    let want: Vec<String> = block.lines().map(str::to_string).collect();
    assert_ne!(got, want);
    // ... or bill a memory variant as its own compute size.
    let unroomed = SCRIPT.replacen(
        "name = \"1g.10gb\", room = \"2g.10gb\"",
        "name = \"1g.10gb\", room = \"1g.10gb\"",
        1,
    );
    assert_ne!(unroomed, SCRIPT, "the script has no 1g.10gb row to change");
    let got: Vec<String> = script_block(&unroomed)
        .unwrap()
        .iter()
        .map(|l| l.trim_end().to_string())
        .collect();
    assert_ne!(got, want);
}
