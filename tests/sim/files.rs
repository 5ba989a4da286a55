//! Every scenario under `tests/scenarios/` runs with no violation and matches its
//! `NAME.expect.json`, if it has one.
//!
//! An expectation is a partial report: objects match key by key (keys not named are not
//! checked), arrays and scalars match exactly. Three derived keys summarise the call log:
//! `"$call_counts"` (op → number of calls), `"$stops"` (the instance lists of every
//! `stop_instances` call, in order), `"$starts"` (machine → number of `start_instance`
//! calls) and `"$batches"` (batched call id → its machines, in launch order), plus two numbers, `"$throttled"` (calls the cloud throttled) and `"$ended_at_s"`.
//! `"$at_most": { KEY: N }` bounds any of the derived numbers from above (for figures that
//! depend on timing, such as how close to ideal a throttled run ends).
//! `"$violations_allowed": true` lets a scenario expect violations (then `"violations"` is
//! matched like any key).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use provisioner::sim::{run, Report, Scenario};
use serde_json::{json, Value};

fn scenario_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            (name.ends_with(".toml") || name.ends_with(".json")) && !name.ends_with(".expect.json")
        })
        .collect();
    files.sort();
    files
}

fn derived(report: &Report) -> Value {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut starts: BTreeMap<String, usize> = BTreeMap::new();
    let mut stops = Vec::new();
    let mut batches: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut throttled = 0;
    for c in &report.calls {
        throttled += usize::from(c.throttled);
        *counts.entry(c.op.clone()).or_default() += 1;
        if c.op == "start_instance" {
            *starts.entry(c.machine.clone().unwrap_or_default()).or_default() += 1;
            if let Some(b) = &c.batch {
                batches.entry(b.clone()).or_default().push(c.machine.clone().unwrap_or_default());
            }
        }
        if c.op == "stop_instances" {
            stops.push(json!(c.instances.clone().unwrap_or_default()));
        }
    }
    let ended = humantime::parse_duration(&report.ended_at).map(|d| d.as_secs_f64()).unwrap_or(f64::NAN);
    json!({
        "$call_counts": counts,
        "$starts": starts,
        "$batches": batches,
        "$stops": stops,
        "$throttled": throttled,
        "$ended_at_s": ended,
    })
}

fn at_most(bounds: &Value, got: &Value, errors: &mut Vec<String>) {
    let Value::Object(bounds) = bounds else { return errors.push(format!("$at_most: not an object: {bounds}")) };
    for (k, max) in bounds {
        match (got.get(k).and_then(Value::as_f64), max.as_f64()) {
            (Some(g), Some(m)) if g <= m => {}
            (Some(g), Some(m)) => errors.push(format!("{k}: got {g}, want at most {m}")),
            _ => errors.push(format!("$at_most.{k}: no such derived number, or a bound that is not one")),
        }
    }
}

fn matches(path: &str, want: &Value, got: &Value, errors: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                match g.get(k) {
                    Some(gv) => matches(&format!("{path}.{k}"), wv, gv, errors),
                    None if wv.is_null() => {}
                    None => errors.push(format!("{path}.{k}: missing, want {wv}")),
                }
            }
        }
        (w, g) if w == g => {}
        (w, g) => errors.push(format!("{path}: got {g}, want {w}")),
    }
}

#[test]
fn scenario_files_meet_their_expectations() {
    let files = scenario_files();
    assert!(files.len() >= 10, "expected the scenario catalogue, found {} files", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let scenario = match Scenario::load(file) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("{e}"));
                continue;
            }
        };
        let report = run(&scenario, None);
        let expect_path = file.with_file_name(format!("{}.expect.json", file.file_stem().unwrap().to_string_lossy()));
        let expect: Value = match std::fs::read_to_string(&expect_path) {
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", expect_path.display())),
            Err(_) => json!({}),
        };
        let mut got: Value = serde_json::from_str(&report.to_json()).unwrap();
        if let (Value::Object(g), Value::Object(d)) = (&mut got, derived(&report)) {
            g.extend(d);
        }
        let mut errors = Vec::new();
        let allow = expect.get("$violations_allowed").and_then(Value::as_bool).unwrap_or(false);
        if !allow && !report.violations.is_empty() {
            errors.push(format!("violations: {:?}", report.violations));
        }
        let mut want = expect.clone();
        if let Value::Object(w) = &mut want {
            w.remove("$violations_allowed");
            if let Some(bounds) = w.remove("$at_most") {
                at_most(&bounds, &got, &mut errors);
            }
        }
        matches("", &want, &got, &mut errors);
        if !errors.is_empty() {
            failures.push(format!("{}:\n  {}", file.display(), errors.join("\n  ")));
        }
    }
    assert!(failures.is_empty(), "{} scenario(s) failed:\n{}", failures.len(), failures.join("\n"));
}
