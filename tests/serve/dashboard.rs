//! The dashboard (issue 16): `GET /` and its files are served by the service itself, without
//! a token, under a Content-Security-Policy that allows no outside origin, and name no
//! outside URL; and the simulated cloud's injected start failures (`--sim-start-failures`)
//! that give the dashboard a machine in error to retry. The page in a browser is
//! tests/dashboard/ (run by .ci/dashboard).

use std::time::Duration;

use crate::support::{
    assert_provisioned_once, config_file, eventually, field, header, ids_of, raw_http, served_without_a_token,
    temp_dir, Server,
};

/// The page and its files: 200 with their types, no token needed, the CSP on each, nothing
/// from outside; the API behind it still needs the token.
#[test]
fn the_dashboard_is_served_without_a_token_and_loads_nothing_from_outside() {
    let dir = temp_dir("dashboard");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let (headers, page) = served_without_a_token(&s, "/", "text/html; charset=utf-8");
    assert!(page.starts_with("<!doctype html>") && page.contains("/dashboard/app.js"), "{page}");
    let csp = header(&headers, "content-security-policy").unwrap_or_default().to_owned();
    for directive in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "style-src 'self'"] {
        assert!(csp.contains(directive), "{directive} in {csp}");
    }
    assert!(!csp.contains("http") && !csp.contains('*') && !csp.contains("unsafe"), "an outside origin: {csp}");
    assert!(!page.contains("http://") && !page.contains("https://"), "the page names an outside URL");
    for (path, kind) in [("/dashboard/app.js", "text/javascript"), ("/dashboard/app.css", "text/css")] {
        let (status, headers, body) = raw_http(&s, "GET", path, false, None);
        assert_eq!(status, 200, "{path}");
        assert!(header(&headers, "content-type").is_some_and(|t| t.starts_with(kind)), "{path}: {headers:?}");
        assert_eq!(header(&headers, "content-security-policy"), Some(csp.as_str()), "{path}");
        assert!(!body.contains("http://") && !body.contains("https://"), "{path} names an outside URL");
    }
    // The data the page shows needs the token.
    assert_eq!(raw_http(&s, "GET", "/v1/events", false, None).0, 401);
    assert_eq!(raw_http(&s, "POST", "/", false, Some(b"{}")).0, 405, "the page takes GET only");
}

/// `--sim-start-failures 1` with `[retry] count = 0`: the first start is refused, so its
/// machine ends in provisioning error naming the fault; `machine retry` provisions it, and
/// later machines start at once (the count is used up).
#[test]
fn an_injected_start_failure_leaves_a_machine_in_error_that_a_retry_provisions() {
    let dir = temp_dir("start-failures");
    let cfg = config_file(&dir, "faults.toml", "[retry]\ncount = 0\n");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--config", &cfg, "--sim-start-failures", "1"]);
    let out = s.cli(&["machine", "add", "--wait", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let ids = ids_of(&serde_json::from_slice(&out.stdout).unwrap());
    let m = s.machines().remove(0);
    assert_eq!(field(&m, "instance_status"), "provisioning error", "{m}");
    assert!(field(&m, "message").contains("simulated fault"), "{m}");
    assert!(s.instances().is_empty(), "a refused start made an instance");

    let out = s.cli(&["machine", "retry", &ids[0]]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually(Duration::from_secs(10), "the retried machine to be provisioned", || {
        field(&s.machines()[0], "status") == "started"
    });
    let more = ids_of(&s.json(&["machine", "add", "-n", "2", "--wait", "--json"]));
    let all: Vec<String> = ids.iter().chain(&more).cloned().collect();
    assert_provisioned_once(&s, &all);
}
