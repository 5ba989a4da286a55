//! The HTTP surface of the service: `/healthz` is public and every `/v1` request needs the
//! token; bodies that do not parse are 400 naming what is wrong and change nothing; a body over
//! the limit is 413, a wrong method 405 with `Allow`; one request cannot blow up the database;
//! and the OpenAPI document served is the committed one.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{
    assert_provisioned_once, bin, eventually, field, header, ids_of, raw_http, served_without_a_token, temp_dir, Server,
};

#[test]
fn health_is_public_and_every_v1_request_needs_the_token() {
    let dir = temp_dir("auth");
    let s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    let token = s.token();
    assert_eq!(token.len(), 64);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(s.dir.join("token")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "token mode {mode:o}");
    }
    let status = |path: &str, auth: Option<&str>| {
        let mut req = ureq::get(&format!("{}{path}", s.url));
        if let Some(a) = auth {
            req = req.set("Authorization", a);
        }
        match req.call() {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("{e}"),
        }
    };
    for path in ["/v1/machines", "/v1/instances", "/v1/status", "/v1/config/workers", "/v1/nothing-here"] {
        assert_eq!(status(path, None), 401, "{path} without a token");
        assert_eq!(status(path, Some("Bearer not-the-token")), 401, "{path} with a wrong token");
    }
    assert_eq!(status("/v1/machines", Some(&format!("Bearer {token}"))), 200);
    assert_eq!(status("/v1/machines", Some(&format!("bearer {token}"))), 200, "the scheme is case-insensitive");
    assert_eq!(status("/v1/machines", Some(&format!("Basic {token}"))), 401);
    assert_eq!(status("/v1/nothing-here", Some(&format!("Bearer {token}"))), 404);
    assert_eq!(status("/healthz", None), 200);
    let metrics = s.metrics();
    assert!(metrics.contains("# TYPE provisioner_http_requests counter"), "{metrics}");
    assert!(metrics.contains("provisioner_workers 16"), "{metrics}");
    assert!(metrics.contains("code=\"401\""), "{metrics}");

    // A client with a wrong token fails at run time (1), in one sentence.
    let out = bin().args(["machine", "list", "--server", &s.url, "--token", "wrong"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("token"), "{err}");
}

/// A body that does not parse (unknown field, wrong type, not JSON) is a 400
/// naming what is wrong, and changes nothing; an empty body means the defaults.
#[test]
fn an_invalid_body_is_refused_and_changes_nothing() {
    let dir = temp_dir("bad-body");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "2", "--wait", "--json"]));
    for (body, names) in [
        (&br#"{"forse": true}"#[..], "forse"),
        (br#"{"force": "yes"}"#, "force"),
        (b"{bad json", "JSON"),
        (br#"{"force": true, "extra": 1}"#, "extra"),
    ] {
        let (code, _, text) = raw_http(&s, "POST", "/v1/destroy-model", true, Some(body));
        assert_eq!(code, 400, "{}: {text}", String::from_utf8_lossy(body));
        assert!(text.contains(names), "the error names {names}: {text}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let status = s.json(&["status", "--json"]);
    assert_eq!(status["model_life"], "alive", "a refused destroy changed the model: {status}");
    assert_provisioned_once(&s, &ids);
    // Every other body: unknown fields and wrong types refused, nothing written.
    for (method, path, body, names) in [
        ("PUT", "/v1/config/workers", &br#"{"value": "4", "colour": "red"}"#[..], "colour"),
        ("PUT", "/v1/config/workers", br#"{"value": 4}"#, "value"),
        ("POST", "/v1/machines", br#"{"count": "3"}"#, "count"),
        ("POST", "/v1/machines", br#"{"count": 3, "zone": ["az1"]}"#, "zone"),
        ("POST", "/v1/machines/remove", br#"{"ids": ["0"], "keep": true}"#, "keep"),
        ("POST", "/v1/machines/remove", br#"{"ids": "0"}"#, "ids"),
        ("POST", "/v1/machines/retry", br#"{"ids": ["0"], "all": true}"#, "all"),
    ] {
        let (code, _, text) = raw_http(&s, method, path, true, Some(body));
        assert_eq!(code, 400, "{method} {path} {}: {text}", String::from_utf8_lossy(body));
        assert!(text.contains(names), "the error names {names}: {text}");
    }
    assert_eq!(String::from_utf8_lossy(&s.cli(&["config", "get", "workers"]).stdout).trim(), "16");
    assert_eq!(s.machines().len(), 2);
    assert_provisioned_once(&s, &ids);
    // An empty body means the defaults (force = false): the model is destroyed.
    let (code, _, text) = raw_http(&s, "POST", "/v1/destroy-model", true, Some(b""));
    assert_eq!(code, 200, "{text}");
    assert_eq!(s.json(&["status", "--json"])["model_life"], "dying");
}

/// List fields are deduplicated and bounded, a body over the limit is 413,
/// and one request cannot grow the database by more than its few rows.
#[test]
fn one_request_cannot_blow_up_the_database() {
    let dir = temp_dir("blowup");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let size = |s: &Server| -> u64 {
        ["provisioner.db", "provisioner.db-wal"]
            .iter()
            .map(|f| std::fs::metadata(s.dir.join(f)).map(|m| m.len()).unwrap_or(0))
            .sum()
    };
    let zones = |n: usize| serde_json::to_vec(&serde_json::json!({"count": 100, "zones": vec!["az1"; n]})).unwrap();
    // The issue's request: 145,000 copies of one zone (1 MB): over the body limit.
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines", true, Some(&zones(145_000)));
    assert_eq!(code, 413, "{text}");
    assert!(s.machines().is_empty(), "a refused request wrote machines");
    // Under the limit: the duplicates collapse, each machine stores one short constraint.
    let before = size(&s);
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines", true, Some(&zones(30_000)));
    assert_eq!(code, 201, "{text}");
    let grew = size(&s).saturating_sub(before);
    assert!(grew < 1 << 20, "100 machines grew the database by {grew} bytes");
    let began = Instant::now();
    assert_eq!(s.machines().len(), 100);
    assert!(began.elapsed() < Duration::from_secs(2), "machine list took {:?}", began.elapsed());
    eventually(Duration::from_secs(20), "the 100 machines to be provisioned", || {
        s.machines().iter().all(|m| field(m, "status") == "started")
    });
    assert!(s.machines().iter().all(|m| field(m, "zone") == "az1"));
    // An unknown zone among many is named; too many ids in one removal are refused.
    let (code, _, text) =
        raw_http(&s, "POST", "/v1/machines", true, Some(br#"{"count": 1, "zones": ["az1", "az1", "nowhere"]}"#));
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("nowhere"), "{text}");
    let many: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
    let body = serde_json::to_vec(&serde_json::json!({ "ids": many })).unwrap();
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines/remove", true, Some(&body));
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("10000"), "the cap is named: {text}");
    assert_eq!(s.machines().len(), 100, "a refused removal removed machines");
}

/// 413 for a body over the limit, 405 with `Allow` for a wrong method.
#[test]
fn oversized_bodies_are_413_and_wrong_methods_405_with_allow() {
    let dir = temp_dir("413-405");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let big = vec![b' '; 2 << 20];
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines", true, Some(&big));
    assert_eq!(code, 413, "{text}");
    let (code, _, text) = raw_http(&s, "POST", "/v1/destroy-model", true, Some(&big));
    assert_eq!(code, 413, "{text}");
    assert_eq!(s.json(&["status", "--json"])["model_life"], "alive");
    for (method, path, allow) in [
        ("DELETE", "/v1/machines", "GET, POST"),
        ("GET", "/v1/destroy-model", "POST"),
        ("POST", "/v1/status", "GET"),
        ("DELETE", "/v1/config/workers", "GET, PUT"),
        ("POST", "/healthz", "GET"),
        ("PUT", "/metrics", "GET"),
    ] {
        let (code, headers, text) = raw_http(&s, method, path, true, None);
        assert_eq!(code, 405, "{method} {path}: {text}");
        assert_eq!(header(&headers, "allow"), Some(allow), "{method} {path}: {headers:?}");
    }
    // Without the token a /v1 path still answers 401 first.
    assert_eq!(raw_http(&s, "DELETE", "/v1/machines", false, None).0, 401);
    assert_eq!(raw_http(&s, "GET", "/v1/nothing", true, None).0, 404);
}

// ---- the OpenAPI contract (issue 16) -------------------------------------------------------

/// `GET /v1/openapi.json` needs no token and serves the committed `docs/openapi.json`; every
/// route it names answers (with the token) something it documents, and a refused request
/// that schemathesis's stateful phase makes (a body naming a missing machine) changes nothing.
#[test]
fn the_openapi_document_is_served_without_a_token_and_is_the_committed_copy() {
    let dir = temp_dir("openapi");
    let s = Server::start(&dir, &["--sim-start-latency", "20ms"]);
    let (_, text) = served_without_a_token(&s, "/v1/openapi.json", "application/json");
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json")).unwrap();
    assert_eq!(text, committed, "the served document is the committed one");
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let (code, headers, _) = raw_http(&s, "POST", "/v1/openapi.json", false, None);
    assert_eq!((code, header(&headers, "allow")), (405, Some("GET")));
    // Each documented GET without parameters answers a documented status.
    for (path, item) in doc["paths"].as_object().unwrap() {
        let Some(get) = item.get("get") else { continue };
        if path.contains('{') || path == "/v1/events" {
            continue;
        }
        let (code, _, text) = raw_http(&s, "GET", path, true, None);
        assert!(get["responses"].get(code.to_string()).is_some(), "GET {path}: {code} is not documented: {text}");
    }
    // A removal naming one machine that exists and one that does not is a 404, and the
    // machine that exists is left as it was.
    let ids = ids_of(&s.json(&["machine", "add", "-n", "1", "--json"]));
    let body = serde_json::to_vec(&serde_json::json!({"ids": [ids[0], "no-such-machine"]})).unwrap();
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines/remove", true, Some(&body));
    assert_eq!(code, 404, "{text}");
    assert!(doc["paths"]["/v1/machines/remove"]["post"]["responses"]["404"].is_object());
    let m = s.json(&["machine", "show", &ids[0], "--json"]);
    assert_eq!(m["life"], "alive", "a refused removal changed the machine: {m}");
}
