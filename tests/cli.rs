//! The binary, driven as a user would: exit codes and error messages for bad input
//! (as the command-line contract fixes them), and the quickstart run.

use std::path::PathBuf;
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_provisioner"))
}

fn write(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("provisioner-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn simulate(path: &PathBuf, extra: &[&str]) -> Output {
    bin().arg("simulate").arg(path).args(extra).output().unwrap()
}

/// Bad input: exit code 2, one line on stderr naming the file, the line and the field, and no
/// report on stdout (no partial run).
fn assert_bad(name: &str, text: &str, line: usize, needles: &[&str]) {
    let path = write(name, text);
    let out = simulate(&path, &["--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{name}: {err}");
    assert!(out.stdout.is_empty(), "{name}: a report was printed for bad input");
    assert_eq!(err.trim().lines().count(), 1, "{name}: not one line: {err}");
    assert!(err.contains(&format!("{name}:{line}:")), "{name}: line {line} not named: {err}");
    for n in needles {
        assert!(err.contains(n), "{name}: {n:?} not in {err}");
    }
}

#[test]
fn unknown_keys_are_named_with_their_line() {
    assert_bad("unknown.toml", "name = \"x\"\nbogus = 1\n", 2, &["bogus", "unknown field"]);
    assert_bad("unknown.json", "{\n  \"name\": \"x\",\n  \"extra\": 1\n}\n", 3, &["extra", "unknown field"]);
    assert_bad("nested.toml", "[cloud]\nzones = [\"az1\"]\nzonez = [\"az2\"]\n", 3, &["zonez"]);
}

#[test]
fn malformed_files_are_refused() {
    assert_bad("malformed.toml", "name = \"x\n", 1, &["name"]);
    assert_bad("malformed.json", "{\n  \"name\": \"x\",\n  \"seed\": \n}\n", 3, &["seed"]);
}

#[test]
fn workers_out_of_range_are_refused() {
    assert_bad("w0.toml", "[provisioner]\nworkers = 0\n", 2, &["workers", "between 1 and 100, got 0"]);
    assert_bad("w101.toml", "[provisioner]\nworkers = 101\n", 2, &["workers", "got 101"]);
    assert_bad("w0.json", "{\n  \"provisioner\": {\n    \"workers\": 0\n  }\n}\n", 3, &["workers", "got 0"]);
    let ev = "[[events]]\nat = \"1s\"\nset_workers = 0\n";
    assert_bad("w0event.toml", ev, 3, &["set_workers", "got 0"]);
}

#[test]
fn durations_and_modes_that_do_not_parse_are_refused() {
    assert_bad("dur.toml", "[provisioner]\nretry_delay = \"ten seconds\"\n", 2, &["retry_delay", "invalid duration"]);
    assert_bad("until.toml", "until = \"forever\"\n", 1, &["until", "invalid duration"]);
    assert_bad("mode.toml", "[provisioner]\nharvest_mode = \"sometimes\"\n", 2, &["harvest_mode", "sometimes"]);
    assert_bad("life.toml", "[[machines]]\nid = \"0\"\nlife = \"undead\"\n", 3, &["life", "undead"]);
}

#[test]
fn unknown_machine_ids_in_events_are_refused() {
    let text = "[[machines]]\nid = \"0\"\n\n[[events]]\nat = \"5s\"\nset_life = { machine = \"7\", life = \"dead\" }\n";
    assert_bad("unk.toml", text, 6, &["set_life", "unknown machine id \"7\""]);
    let json =
        "{\"machines\": [{\"id\": \"0\"}], \"events\": [{\"at\": \"1s\",\n \"retry_provisioning\": [\"0\", \"9\"]}]}\n";
    assert_bad("unk.json", json, 2, &["retry_provisioning", "\"9\""]);
    let fault = "[[machines]]\nid = \"0\"\n[[cloud.faults]]\nmachine = \"5\"\n";
    assert_bad("fault.toml", fault, 4, &["machine", "unknown machine \"5\""]);
}

#[test]
fn events_need_exactly_one_action() {
    assert_bad("none.toml", "[[events]]\nat = \"1s\"\n", 2, &["events[0]", "none"]);
    assert_bad(
        "two.toml",
        "[[events]]\nat = \"1s\"\nrestart = true\nset_workers = 3\n",
        2,
        &["restart", "set_workers"],
    );
}

#[test]
fn unknown_extension_and_missing_file_are_bad_input() {
    let path = write("scenario.yaml", "name: x\n");
    let out = simulate(&path, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(".toml or .json"));
    let out = simulate(&PathBuf::from("/nonexistent/s.toml"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

#[test]
fn bad_usage_exits_2() {
    let out = bin().args(["simulate"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = bin().args(["frobnicate"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = bin().args(["simulate", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--seed"));
}

#[test]
fn quickstart_runs_readably_and_as_json() {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/scenarios/quickstart.toml");
    let out = simulate(&file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in
        ["quickstart (seed 1)", "machines: 6 in all", "per zone:", "calls:", "start_instance:", "violations: none"]
    {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    let a = simulate(&file, &["--json"]);
    let b = simulate(&file, &["--json"]);
    assert_eq!(a.stdout, b.stdout, "the JSON report is not byte-identical across runs");
    let report: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    for key in
        ["name", "seed", "ended_at", "provisioner", "calls", "machines", "instances", "events", "model", "violations"]
    {
        assert!(report.get(key).is_some(), "report lacks {key}");
    }
    assert_eq!(report["violations"], serde_json::json!([]));
    // Machine 4 died while starting: the instance its start produced was stopped.
    let m4 = &report["machines"]["4"];
    assert_eq!(m4["removed"], true);
    let inst = m4["instance"].as_str().unwrap();
    assert_eq!(report["instances"][inst]["state"], "terminated");
    // The stray instance went when the mode became "all"; the kept one still runs.
    assert_eq!(report["instances"]["stray-1"]["state"], "terminated");
    let m5 = report["machines"]["5"]["instance"].as_str().unwrap();
    assert_eq!(report["instances"][m5]["state"], "running");
}

#[test]
fn generated_scenarios_reproduce_through_the_binary() {
    let out = bin().args(["generate-scenario", "--seed", "17"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let path = write("gen17.toml", &String::from_utf8_lossy(&out.stdout));
    let a = simulate(&path, &["--json"]);
    assert_eq!(a.status.code(), Some(0), "{}", String::from_utf8_lossy(&a.stderr));
    let report = provisioner::sim::run(&provisioner::sim::generate(17), None);
    assert_eq!(String::from_utf8_lossy(&a.stdout).trim(), report.to_json().trim());
}

#[test]
fn bench_commands_print_the_contract_keys() {
    let out = bin()
        .args([
            "bench",
            "throughput",
            "--machines",
            "50",
            "--workers",
            "5",
            "--zones",
            "2",
            "--start-latency",
            "10s",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in
        ["machines", "workers", "virtual_makespan_s", "ideal_makespan_s", "efficiency", "wall_s", "machines_per_wall_s"]
    {
        assert!(r.get(key).is_some(), "throughput report lacks {key}");
    }
    assert_eq!(r["ideal_makespan_s"], 100.0);
    assert_eq!(r["efficiency"], 1.0);

    let out = bin().args(["bench", "churn", "--machines", "50", "--events", "20", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["machines", "events", "wall_s", "per_event_us", "all_instances_calls"] {
        assert!(r.get(key).is_some(), "churn report lacks {key}");
    }
    assert_eq!(r["events"], 20);
}

#[test]
fn bench_rejects_bad_arguments() {
    for args in [
        vec!["bench", "throughput", "--machines", "5", "--workers", "0", "--zones", "1", "--start-latency", "1s"],
        vec!["bench", "throughput", "--machines", "5", "--workers", "101", "--zones", "1", "--start-latency", "1s"],
        vec!["bench", "throughput", "--machines", "5", "--workers", "4", "--zones", "1", "--start-latency", "soon"],
    ] {
        let out = bin().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn plan_prints_the_next_step_and_refuses_bad_input() {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/scenarios/quickstart.toml");
    let out = bin().arg("plan").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().filter(|l| l.starts_with("start machine ")).count(), 6, "{text}");
    assert!(text.contains("start machine 3 in az3"), "the zones= constraint is ignored: {text}");
    let json = bin().arg("plan").arg(&file).arg("--json").output().unwrap();
    let p: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(p["starts"].as_array().unwrap().len(), 6);
    assert_eq!(p["stops"], serde_json::json!([]), "mode destroyed harvests no unknown instance");
    let bad = write("bad-plan.toml", "[provisioner]\nworkers = 0\n");
    let out = bin().arg("plan").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}

/// A `--store` that is neither `sqlite` nor a PostgreSQL URL with a host (from the flag, its
/// variable or the config file) is bad usage: exit 2, naming the flag (or the file's key); our
/// own words mask the password (clap echoes the argument as given). Checked before anything is
/// opened.
#[test]
fn a_malformed_store_url_exits_2_naming_the_flag() {
    let data = std::env::temp_dir().join(format!("provisioner-cli-store-{}", std::process::id()));
    let data = data.to_str().unwrap();
    for bad in ["mysql://h/db", "postgres://", "postgres://u:hunter2@/db", "postgres://h:99999/db", "sqlite3"] {
        let out =
            bin().args(["serve", "--store", bad, "--data-dir", data, "--listen", "127.0.0.1:0"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--store"), "{bad}: {err}");
        if bad.contains("hunter2") {
            assert!(err.contains("\"postgres://u:***@/db\" names no host"), "the password is masked: {err}");
        }
    }
    let out = bin()
        .args(["serve", "--data-dir", data, "--listen", "127.0.0.1:0"])
        .env("PROVISIONER_STORE", "postgres://:5432/db")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--store") && err.contains("names no host"), "{err}");
    if !cfg!(feature = "serve") {
        return; // the config file is read by the service only
    }
    let file = write("store.toml", "[store]\nurl = \"postgres://h:0/db\"\n");
    let out = bin().args(["serve", "--config", file.to_str().unwrap(), "--data-dir", data]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("store.toml:2: store.url: ") && err.contains("bad port"), "{err}");
}

// ---- Shell conventions: completion scripts and the man page.

/// The commands every completion script and the man page must know.
const COMMANDS: [&str; 14] = [
    "simulate",
    "plan",
    "bench",
    "generate-scenario",
    "serve",
    "machine",
    "application",
    "instance",
    "config",
    "token",
    "status",
    "destroy-model",
    "completions",
    "man",
];

#[test]
fn completion_scripts_are_printed_for_each_shell_and_know_the_commands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = bin().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {}", String::from_utf8_lossy(&out.stderr));
        let script = String::from_utf8(out.stdout).unwrap();
        for command in COMMANDS {
            assert!(script.contains(command), "the {shell} script does not mention {command}");
        }
        // Nested commands and flags too (fish spells a long flag `-l NAME`).
        for word in ["retry", "tls-cert", "ca-cert", "constraints"] {
            assert!(script.contains(word), "the {shell} script does not mention {word}");
        }
    }
    let marks = [("bash", "complete -F"), ("zsh", "#compdef provisioner"), ("fish", "complete -c provisioner")];
    for (shell, mark) in marks {
        let out = bin().args(["completions", shell]).output().unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains(mark), "{shell}: no {mark:?}");
    }
    let out = bin().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "an unknown shell is bad usage");
    assert!(String::from_utf8_lossy(&out.stderr).contains("bash, zsh, fish"));
}

const MAN_PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/provisioner.1");

#[test]
fn the_man_page_covers_every_command_and_is_the_committed_copy() {
    let out = bin().arg("man").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.starts_with(".ie") || page.starts_with(".TH"), "not roff: {}", &page[..page.len().min(200)]);
    assert!(page.contains(".TH provisioner 1"));
    for command in COMMANDS {
        let heading = format!(".SH \"PROVISIONER {}\"", command.to_uppercase());
        assert!(page.contains(&heading), "the man page has no section {heading}");
    }
    for heading in
        ["PROVISIONER MACHINE ADD", "PROVISIONER BENCH SERVE", "PROVISIONER CONFIG SET", "PROVISIONER TOKEN CREATE"]
    {
        assert!(page.contains(&format!(".SH \"{heading}\"")), "the man page has no section {heading}");
    }
    // roff escapes hyphens in flags.
    assert!(page.contains("\\-\\-tls\\-cert") && page.contains("\\-\\-ca\\-cert"), "flags are documented");
    if std::env::var_os("UPDATE_MAN").is_some() {
        std::fs::write(MAN_PAGE, &page).unwrap();
    }
    let committed = std::fs::read_to_string(MAN_PAGE).unwrap_or_default();
    assert!(
        committed == page,
        "docs/provisioner.1 differs from `provisioner man`; refresh it with \
         `UPDATE_MAN=1 cargo test --features cli --test cli man_page` and commit it"
    );
}

/// `bench starts` (issue 17, point 1): its keys, and bad input refused as bad usage.
#[test]
fn bench_starts_prints_its_keys_and_refuses_bad_input() {
    let out = bin()
        .args(["bench", "starts", "--machines", "40", "--start-burst", "2", "--start-per-second", "1", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["machines", "batched", "virtual_makespan_s", "unbatched_ideal_s", "start_calls", "throttled_calls"] {
        assert!(r.get(key).is_some(), "starts report lacks {key}");
    }
    assert_eq!((r["batched"].as_bool(), r["unbatched_ideal_s"].as_f64()), (Some(true), Some(38.0)));
    for args in [
        vec!["bench", "starts", "--machines", "5", "--start-burst", "0", "--start-per-second", "1"],
        vec!["bench", "starts", "--machines", "5", "--start-burst", "2", "--start-per-second", "0"],
        vec![
            "bench",
            "starts",
            "--machines",
            "5",
            "--start-burst",
            "2",
            "--start-per-second",
            "1",
            "--batch-size",
            "0",
        ],
        vec!["bench", "starts", "--machines", "5", "--start-burst", "2", "--start-per-second", "1", "--workers", "101"],
    ] {
        let out = bin().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

/// `token create -m A --for-model B` names two models for one token: refused before any
/// request (exit 2, one sentence naming both), so nothing is created anywhere.
#[cfg(feature = "serve")]
#[test]
fn token_create_refuses_two_different_models() {
    // Nothing listens on port 9: a request would fail at run time (exit 1), not exit 2.
    let out = bin()
        .args(["token", "create", "-m", "team-a", "--for-model", "team-b"])
        .args(["--server", "http://127.0.0.1:9", "--token", "t"])
        .env_remove("PROVISIONER_MODEL")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("\"team-a\"") && err.contains("\"team-b\"") && err.contains("--for-model"), "{err}");
    assert!(out.stdout.is_empty());
}

/// `simulate --trace FILE` (issue 37): on a cloud that throttles its starts, a throttled
/// machine's trace shows its retries as spans: under its start (a child of the coordinator's
/// pick, the trace's root), each throttled cloud call, the wait before the next, and the call
/// that starts it, then the record; timed by the virtual clock (virtual 0 as
/// 2026-01-01T00:00:00Z); the same file from the same seed; a trace file that cannot be
/// written is refused before the run.
#[test]
fn simulate_writes_a_throttled_starts_retries_as_spans_from_virtual_time() {
    let scenario = write(
        "throttled.toml",
        "name = \"throttled\"\nseed = 3\nuntil = \"2m\"\n[provisioner]\nworkers = 4\nretry_delay = \"1s\"\n\
         [cloud]\nzones = [\"az1\", \"az2\"]\nstart_latency = \"500ms\"\n\
         [cloud.rate_limit]\nstart_burst = 1\nstart_per_second = 1.0\nstop_burst = 5\nstop_per_second = 5.0\n\
         [[machines]]\nid = \"0\"\n[[machines]]\nid = \"1\"\n[[machines]]\nid = \"2\"\n",
    );
    let trace = scenario.with_file_name("throttled.trace.json");
    let run = || {
        let out = simulate(&scenario, &["--json", "--trace", trace.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::read(&trace).unwrap()
    };
    let first = run();
    assert_eq!(first, run(), "the same scenario and seed write the same file");
    let doc: serde_json::Value = serde_json::from_slice(&first).unwrap();
    let spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().unwrap();
    let attr = |s: &serde_json::Value, k: &str| -> String {
        let found = s["attributes"].as_array().unwrap().iter().find(|a| a["key"] == k);
        found
            .map(|a| a["value"].as_object().unwrap().values().next().unwrap().as_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let children = |parent: &serde_json::Value| -> Vec<&serde_json::Value> {
        spans.iter().filter(|s| s["parentSpanId"] == parent["spanId"]).collect()
    };
    let at = |s: &serde_json::Value, k: &str| -> u128 { s[k].as_str().unwrap().parse().unwrap() };
    let starts: Vec<_> = spans.iter().filter(|s| s["name"] == "start").collect();
    assert_eq!(starts.len(), 3, "a start a machine");
    let mut throttled_starts = 0;
    for start in starts {
        let picked = spans.iter().find(|s| s["spanId"] == start["parentSpanId"]).expect("the start's parent");
        assert_eq!((&picked["name"], &picked["parentSpanId"]), (&"coordinator batch".into(), &"".into()));
        assert_eq!(attr(picked, "machine"), attr(start, "machine"));
        assert_eq!(attr(start, "outcome"), "started");
        assert!(at(start, "startTimeUnixNano") >= 1_767_225_600_000_000_000, "virtual time from 2026-01-01");
        let steps = children(start);
        let calls: Vec<_> = steps.iter().filter(|s| attr(s, "cloud.operation") == "start_instance").collect();
        let throttled = calls.iter().filter(|c| attr(c, "outcome") == "throttled").count();
        let waits = steps.iter().filter(|s| s["name"] == "retry wait").count();
        assert_eq!(attr(calls.last().unwrap(), "outcome"), "ok", "the last call starts it");
        assert_eq!(calls.len(), throttled + 1, "every other call was throttled");
        assert_eq!(waits, throttled, "a wait after each throttled call");
        let record = steps.iter().find(|s| s["name"] == "record instance").expect("the record");
        assert_eq!(attr(record, "instance"), attr(start, "instance"));
        assert!(at(record, "startTimeUnixNano") >= at(calls.last().unwrap(), "endTimeUnixNano"));
        throttled_starts += usize::from(throttled > 0);
    }
    assert_eq!(throttled_starts, 2, "one start a second: two of three were throttled at first");
    // A trace file that cannot be written: exit 2, before the run (no report).
    let out = simulate(&scenario, &["--json", "--trace", "/nonexistent-dir/t.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent-dir/t.json"));
}
