//! Scoped API tokens and the audit log (issue 16) on the real binary: `token create
//! [--read-only]`, `token list`, `token revoke`; a read-only token reads and is refused every
//! change (403, nothing changed); a revoked token is refused on its very next request (on
//! PostgreSQL, by the other replica too); every change request is one line of the audit log,
//! with the token's id and the status, and no line holds a secret.

use serde_json::Value;

#[cfg(feature = "postgres")]
use crate::support::two_replicas;
use crate::support::{bin, field, ids_of, mount_tmpfs, sample, serve_output, temp_dir, Server};

/// `METHOD path` with `token` (if any) and `body` (if any): the status and the body.
fn http(s: &Server, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
    let mut req = ureq::request(method, &format!("{}{path}", s.url));
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    let answer = match body {
        Some(b) => req.set("Content-Type", "application/json").send_string(b),
        None => req.call(),
    };
    match answer {
        // The event stream never ends: its status is enough.
        Ok(r) if r.content_type() == "text/event-stream" => (r.status(), String::new()),
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

/// Runs a client command with `token`: exit code, stdout, stderr.
fn as_token(s: &Server, token: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = bin().args(args).args(["--server", &s.url, "--token", token]).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `token create [--read-only]` with the data directory's token: (id, token). The token is
/// alone on the last line.
fn create(s: &Server, read_only: bool) -> (String, String) {
    let mut args = vec!["token", "create"];
    if read_only {
        args.push("--read-only");
    }
    let out = s.cli(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let token = text.lines().last().unwrap().to_owned();
    assert_eq!(token.len(), 64, "the token alone on the last line: {text:?}");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{text:?}");
    let id = text.split_whitespace().nth(1).unwrap().to_owned();
    assert!(id.starts_with("tok-"), "{text:?}");
    (id, token)
}

/// The audit log's lines, parsed.
fn audit(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// What a change could alter, as the admin sees it.
fn state(s: &Server) -> (Vec<(String, String)>, Value, Value, String) {
    let machines = s.machines().iter().map(|m| (field(m, "id").to_owned(), field(m, "life").to_owned())).collect();
    let status = s.json(&["status", "--json"]);
    (
        machines,
        s.json(&["application", "list", "--json"]),
        status["workers"].clone(),
        field(&status, "model_life").into(),
    )
}

#[test]
fn a_read_only_token_reads_and_every_change_is_refused_with_nothing_changed() {
    let dir = temp_dir("tok-read-only");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let admin = s.token();
    let ids = ids_of(&s.json(&["machine", "add", "-n", "2", "--wait", "--json"]));
    let (ro_id, ro) = create(&s, true);
    let before = state(&s);

    // It reads.
    let (code, out, err) = as_token(&s, &ro, &["machine", "list", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap().as_array().unwrap().len(), 2);
    for path in ["/v1/machines", "/v1/machines/0", "/v1/status", "/v1/instances", "/v1/config", "/v1/applications"] {
        assert_eq!(http(&s, "GET", path, Some(&ro), None).0, 200, "GET {path}");
    }
    assert_eq!(http(&s, "GET", "/v1/events", Some(&ro), None).0, 200, "the event stream takes any scope");
    assert_eq!(http(&s, "GET", "/v1/events", None, None).0, 401, "but a token");
    for open in ["/metrics", "/healthz", "/readyz", "/v1/openapi.json"] {
        assert_eq!(http(&s, "GET", open, None, None).0, 200, "{open} stays open");
    }

    // Every change is refused: 403, exit 1, one sentence that says why.
    let changes: [&[&str]; 8] = [
        &["machine", "add", "-n", "3"],
        &["machine", "remove", "0"],
        &["machine", "retry", "1"],
        &["config", "set", "workers", "3"],
        &["destroy-model"],
        &["application", "add", "web", "--units", "1"],
        &["token", "create"],
        &["token", "revoke", "tok-1"],
    ];
    for args in changes {
        let (code, out, err) = as_token(&s, &ro, args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(err.contains("read-only") && err.lines().count() == 1, "{args:?}: {err}");
    }
    let (code, _, err) = as_token(&s, &ro, &["token", "list"]);
    assert_eq!(code, Some(1), "listing tokens is admin-only: {err}");
    for (method, path, body) in [
        ("POST", "/v1/machines", r#"{"count": 1}"#),
        ("POST", "/v1/machines/remove", r#"{"ids": ["0"]}"#),
        ("POST", "/v1/machines/retry", r#"{"ids": ["1"]}"#),
        ("PUT", "/v1/config/workers", r#"{"value": "3"}"#),
        ("POST", "/v1/destroy-model", "{}"),
        ("POST", "/v1/applications", r#"{"name": "web", "units": 1}"#),
        ("DELETE", "/v1/applications/web", ""),
        ("POST", "/v1/tokens", r#"{"read_only": false}"#),
    ] {
        let (code, text) = http(&s, method, path, Some(&ro), Some(body));
        assert_eq!(code, 403, "{method} {path}: {text}");
        let e: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{method} {path}: JSON error: {text}"));
        assert!(field(&e, "error").contains("read-only"), "{text}");
    }
    assert_eq!(state(&s), before, "nothing changed");
    assert_eq!(s.json(&["token", "list", "--json"]).as_array().unwrap().len(), 1, "no token created");
    assert!(s.machines().iter().all(|m| ids.contains(&field(m, "id").to_owned())));

    // The audit log: one line per change request (refused ones too), none for a read, each
    // with the token's id and the status, and no secret anywhere.
    let lines = audit(&s.dir.join("audit.log"));
    let text = std::fs::read_to_string(s.dir.join("audit.log")).unwrap();
    assert!(!text.contains(&admin) && !text.contains(&ro), "a secret in the audit log: {text}");
    assert_eq!(lines.len(), 2 + changes.len() + 8, "{text}");
    assert!(lines.iter().all(|l| l["method"] != "GET"), "{text}");
    let add = &lines[0];
    assert_eq!((field(add, "token"), field(add, "method"), field(add, "path")), ("admin", "POST", "/v1/machines"));
    assert_eq!((add["status"].as_u64(), field(add, "result")), (Some(201), "ok"));
    assert_eq!(field(add, "what"), "added 2 machines: 0, 1");
    assert!(field(add, "time").ends_with('Z'), "{add}");
    assert_eq!(field(&lines[1], "what"), format!("created {ro_id} (read-only)"));
    for l in &lines[2..] {
        assert_eq!((field(l, "token"), l["status"].as_u64()), (ro_id.as_str(), Some(403)), "{l}");
        assert!(field(l, "result").contains("read-only"), "{l}");
    }
    // Refused before the body was read: the method and path say what was asked.
    let remove = lines.iter().find(|l| l["path"] == "/v1/machines/remove").unwrap();
    assert!(remove["what"].is_null(), "{remove}");
    // An admin's change notes what it asked for, and the result.
    let out = s.cli(&["machine", "remove", "1", "9"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = audit(&s.dir.join("audit.log"));
    let last = lines.last().unwrap();
    assert_eq!(
        (field(last, "token"), field(last, "what"), last["status"].as_u64()),
        ("admin", "remove 2 machines: 1, 9", Some(404))
    );
    assert!(field(last, "result").contains("machine 9 not found"), "{last}");
}

#[test]
fn tokens_are_listed_without_secrets_and_a_revoked_one_is_refused_at_once() {
    let dir = temp_dir("tok-revoke");
    let moved = dir.join("elsewhere.log");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--audit-log", moved.to_str().unwrap()]);
    let admin = s.token();
    // An admin token created by the admin works, and creates tokens in turn.
    let (a_id, a) = create(&s, false);
    let (code, out, err) = as_token(&s, &a, &["token", "create", "--read-only", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let made: Value = serde_json::from_str(&out).unwrap();
    let (r_id, r) = (field(&made, "id").to_owned(), field(&made, "token").to_owned());
    assert_eq!((a_id.as_str(), r_id.as_str(), field(&made, "scope")), ("tok-1", "tok-2", "read-only"));
    let (code, _, err) = as_token(&s, &a, &["machine", "add", "--json"]);
    assert_eq!(code, Some(0), "an admin token changes things: {err}");

    // The list: ids, scopes, times; never a token or a hash.
    let out = s.cli(&["token", "list", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let list: Value = serde_json::from_str(&text).unwrap();
    let rows: Vec<(&str, &str)> =
        list.as_array().unwrap().iter().map(|t| (field(t, "id"), field(t, "scope"))).collect();
    assert_eq!(rows, [("tok-1", "admin"), ("tok-2", "read-only")]);
    for t in list.as_array().unwrap() {
        let keys: Vec<&str> = t.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["created", "id", "revoked", "scope"], "{t}");
        assert!(field(t, "created").ends_with('Z') && t["revoked"].is_null(), "{t}");
    }
    for secret in [&a, &r, &admin] {
        assert!(!text.contains(secret.as_str()), "a secret listed: {text}");
        let hash = provisioner::service::sha256_hex(secret);
        assert!(!text.contains(&hash), "a hash listed: {text}");
    }
    let human = String::from_utf8_lossy(&s.cli(&["token", "list"]).stdout).into_owned();
    assert!(human.starts_with("ID") && human.contains("tok-2") && human.contains("read-only"), "{human}");

    // Revoked: the very next request with it is 401; revoking again is no error.
    assert_eq!(http(&s, "GET", "/v1/status", Some(&r), None).0, 200);
    let out = s.cli(&["token", "revoke", &r_id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&format!("revoked {r_id}")));
    let (code, text) = http(&s, "GET", "/v1/status", Some(&r), None);
    assert_eq!(code, 401, "{text}");
    assert!(text.contains("revoked"), "{text}");
    let (code, _, err) = as_token(&s, &r, &["machine", "list"]);
    assert_eq!(code, Some(1), "{err}");
    let first = s.json(&["token", "list", "--json"])[1]["revoked"].clone();
    assert!(first.is_string(), "{first}");
    assert!(s.cli(&["token", "revoke", &r_id]).status.success(), "revoking twice is fine");
    assert_eq!(s.json(&["token", "list", "--json"])[1]["revoked"], first, "the first time is kept");

    // Bad input: a clear sentence, exit 2 or the status, nothing written.
    let out = s.cli(&["token", "revoke", "tok-99"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("\"tok-99\"") && err.contains("not found"), "{err}");
    let (code, text) = http(&s, "DELETE", "/v1/tokens/admin", Some(&admin), None);
    assert_eq!(code, 409, "{text}");
    assert!(text.contains("admin token cannot be revoked"), "{text}");
    for body in [r#"{"read_only": "yes"}"#, r#"{"readonly": true}"#, "nope", "", "[]"] {
        let (code, text) = http(&s, "POST", "/v1/tokens", Some(&admin), Some(body));
        assert_eq!(code, 400, "{body:?}: {text}");
    }
    let (code, text) = http(&s, "POST", "/v1/tokens", Some("not-a-token"), Some("{}"));
    assert_eq!(code, 401, "{text}");
    assert_eq!(s.json(&["token", "list", "--json"]).as_array().unwrap().len(), 2, "nothing created");
    assert_eq!(http(&s, "GET", "/v1/status", Some(&admin), None).0, 200, "the admin token still works");

    // The audit log went where --audit-log said, one line per change, none with a secret.
    assert!(!s.dir.join("audit.log").exists(), "moved by --audit-log");
    let lines = audit(&moved);
    let text = std::fs::read_to_string(&moved).unwrap();
    for secret in [&a, &r, &admin] {
        assert!(!text.contains(secret.as_str()), "a secret in the audit log: {text}");
    }
    let summary: Vec<(String, String, u64)> = lines
        .iter()
        .map(|l| (field(l, "token").to_owned(), field(l, "what").to_owned(), l["status"].as_u64().unwrap()))
        .collect();
    let want: Vec<(String, String, u64)> = [
        ("admin", "created tok-1 (admin)", 201),
        ("tok-1", "created tok-2 (read-only)", 201),
        ("tok-1", "added 1 machines: 0", 201),
        ("admin", "revoke tok-2", 200),
        ("admin", "revoke tok-2", 200),
        ("admin", "revoke tok-99", 404),
        ("admin", "revoke admin", 409),
        ("admin", "", 400),
        ("admin", "", 400),
        ("admin", "", 400),
        ("admin", "", 400),
        ("admin", "", 400),
        ("", "", 401),
    ]
    .iter()
    .map(|(t, w, c)| ((*t).to_owned(), (*w).to_owned(), *c))
    .collect();
    assert_eq!(summary, want, "{text}");
    assert!(lines[5]["result"].as_str().unwrap().contains("tok-99"), "{text}");
    assert!(lines[12]["token"].is_null(), "no valid token, no id: {text}");
}

/// An audit log that cannot be opened stops `serve` at start, naming the file (exit 2).
#[test]
fn an_audit_log_that_cannot_be_opened_is_refused_naming_it() {
    let dir = temp_dir("tok-bad-audit");
    let bad = dir.join("no-such-dir/audit.log");
    let (code, err) = serve_output(&dir.join("data"), &["--audit-log", bad.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("audit log") && err.contains("no-such-dir/audit.log"), "{err}");
}

/// Two replicas on one PostgreSQL database: a token created through one works on the other,
/// and once revoked through the first, the other refuses its very next request.
#[cfg(feature = "postgres")]
#[test]
fn on_postgres_a_token_revoked_through_one_replica_is_refused_by_the_other() {
    let (_pg, first, second) = two_replicas("tok-pg", &["--sim-start-latency", "50ms"]);
    let admin = first.token();
    let (id, ro) = create(&first, true);
    assert_eq!(http(&second, "GET", "/v1/machines", Some(&ro), None).0, 200, "known to the other replica");
    let (code, text) = http(&second, "POST", "/v1/machines", Some(&ro), Some(r#"{"count": 1}"#));
    assert_eq!(code, 403, "read-only on the other replica too: {text}");
    // Created through the second replica (which knows the admin token by its hash only).
    let (code, out, err) = as_token(&second, &admin, &["token", "create", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let made: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(http(&first, "GET", "/v1/tokens", Some(field(&made, "token")), None).0, 200);
    for _ in 0..3 {
        assert_eq!(http(&second, "GET", "/v1/status", Some(&ro), None).0, 200);
    }
    let out = first.cli(&["token", "revoke", &id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, text) = http(&second, "GET", "/v1/status", Some(&ro), None);
    assert_eq!(code, 401, "the other replica's very next request: {text}");
    assert!(text.contains("revoked"), "{text}");
    // Each replica writes its own audit log.
    let lines = audit(&second.dir.join("audit.log"));
    assert_eq!(lines.iter().map(|l| l["status"].as_u64().unwrap()).collect::<Vec<_>>(), [403, 201], "{lines:?}");
}

/// Every answered change is in the audit log even when the service is killed right after
/// (`kill -9`: nothing buffered in the process), and a restart appends to the same file.
#[test]
fn the_audit_log_survives_a_crash_and_a_restart_appends() {
    let dir = temp_dir("tok-audit-crash");
    let mut s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    for _ in 0..5 {
        let out = s.cli(&["machine", "add", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    s.crash();
    let path = s.dir.join("audit.log");
    let lines = audit(&path);
    assert_eq!(lines.iter().filter(|l| l["status"] == 201).count(), 5, "{lines:?}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "audit log mode {mode:o}");
    }
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    assert!(s.cli(&["machine", "add"]).status.success());
    let lines = audit(&path);
    assert_eq!(lines.len(), 6, "appended: {lines:?}");
    assert_eq!(field(&lines[5], "what"), "added 1 machines: 5");
}

/// The size of the files under `dir`, all of them.
fn tree_size(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => tree_size(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Issue 30, item 1: an unauthenticated caller cannot fill the disk through the audit log.
/// 20,000 `POST /v1/AAAA…` with 60 KB paths and no token (200 of them grew the log by 12 MB
/// before) grow the data directory by under 5 MiB: each line is a few hundred bytes whatever the
/// request, and the refused requests are written at a bounded rate per peer, the rest counted
/// in `provisioner_audit_lines_suppressed`.
#[test]
fn unauthenticated_requests_cannot_fill_the_disk_through_the_audit_log() {
    let dir = temp_dir("tok-audit-flood");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let before = tree_size(&s.dir);
    let url = format!("{}/v1/{}", s.url, "A".repeat(60_000));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new().build();
                for _ in 0..5_000 {
                    match agent.post(&url).call() {
                        Err(ureq::Error::Status(401, _)) => {}
                        other => panic!("{:?}", other.map(|r| r.status())),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let grown = tree_size(&s.dir).saturating_sub(before);
    assert!(grown < 5 * 1024 * 1024, "the data directory grew by {grown} bytes");
    let lines = audit(&s.dir.join("audit.log"));
    assert!(!lines.is_empty() && lines.len() < 1_000, "{} lines", lines.len());
    let text = std::fs::read_to_string(s.dir.join("audit.log")).unwrap();
    assert!(text.lines().all(|l| l.len() < 1_024), "every line bounded");
    assert!(lines.iter().all(|l| l["status"] == 401 && l["token"].is_null()));
    assert!(lines.iter().any(|l| field(l, "what").contains("more refused from this peer")), "{text:.2000}");
    let suppressed = sample(&s.metrics(), "provisioner_audit_lines_suppressed_total").unwrap_or(0.0);
    assert!(suppressed as usize + lines.len() >= 20_000, "{suppressed} suppressed, {} written", lines.len());
    // An authenticated change is still written, at once.
    s.json(&["machine", "add", "--json"]);
    let last = audit(&s.dir.join("audit.log")).pop().unwrap();
    assert_eq!((field(&last, "method"), field(&last, "path"), &last["status"]), ("POST", "/v1/machines", &201.into()));
}

/// Issue 30, item 1: no unaudited change. The audit log is on a file system that fills up: a
/// change is refused (503, naming the audit log) and nothing is changed, reads keep working;
/// once there is room again changes are accepted and written.
#[test]
fn a_change_whose_audit_line_cannot_be_written_is_refused_and_reads_keep_working() {
    use std::process::Command;
    let dir = temp_dir("tok-audit-full");
    let mnt = dir.join("mnt");
    let Some(_unmount) = mount_tmpfs(&mnt, "1m") else { return };
    let log = mnt.join("audit.log");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--audit-log", log.to_str().unwrap()]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "2", "--json"]));
    // Fill the file system.
    let filler = mnt.join("filler");
    let _ = Command::new("dd").args(["if=/dev/zero", "bs=64k"]).arg(format!("of={}", filler.display())).output();
    let (code, body) = http(&s, "POST", "/v1/machines", Some(&s.token()), Some("{\"count\": 3}"));
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("audit log") && body.contains("no change is accepted"), "{body}");
    assert_eq!(s.machines().len(), 2, "nothing was changed");
    let (code, _) = http(&s, "GET", "/v1/machines", Some(&s.token()), None);
    assert_eq!(code, 200, "reads keep working");
    // Room again: changes go ahead, and are in the log.
    std::fs::remove_file(&filler).unwrap();
    let added = ids_of(&s.json(&["machine", "add", "--json"]));
    assert_eq!(s.machines().len(), 3);
    let lines = audit(&log);
    assert!(lines.iter().any(|l| field(l, "what").contains(&added[0])), "{lines:?}");
    assert!(ids.iter().all(|id| lines.iter().any(|l| field(l, "what").contains(id.as_str()))));
}

/// Issue 30, item 10: no request forges a log line. Error text that carries a request's strings
/// (an id with a newline and a made-up event after it) is written escaped: every line of the
/// service's text log is one event of its own, and the forged one is not a line of it.
#[test]
fn a_request_cannot_forge_a_log_line() {
    let dir = temp_dir("tok-forge");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let forged = "2030-01-01T00:00:00Z  INFO audit: change request token=admin";
    let body = serde_json::json!({"ids": [format!("9\n{forged}")]}).to_string();
    let (code, _) = http(&s, "POST", "/v1/machines/remove", Some(&s.token()), Some(&body));
    assert!((400..500).contains(&code), "{code}");
    let path = format!("/v1/machines/9%0A{}", forged.replace(' ', "%20"));
    let (code, _) = http(&s, "POST", &path, None, Some("{}"));
    assert!((400..500).contains(&code), "{code}");
    let log = s.log_text();
    assert!(log.contains("2030-01-01"), "the request's text was logged (escaped): {log}");
    for line in log.lines() {
        assert!(!line.starts_with("2030-01-01"), "a forged line: {line}");
        assert!(line.starts_with("20") && line.len() > 20 && line.as_bytes()[4] == b'-', "not an event: {line:?}");
    }
}
