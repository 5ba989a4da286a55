//! The service on PostgreSQL (`serve --store postgres://...`, feature `postgres`): the same
//! operator's flows as on SQLite (add, list, remove, retry; a crash with starts in flight and a
//! restart with no duplicate instance), and the store's bad days: a database unreachable at
//! start (waited for, `/readyz` 503 saying so, the log says why), a database lost while
//! serving (503, never stale answers), a schema newer than the binary (refused naming both
//! versions), and a second replica that knows the API token only by its hash.
//!
//! One throwaway cluster is shared by the tests running at the same time (started by the
//! first, stopped when the last lets go); every test gets a fresh database of its own.

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

use provisioner::testing::postgres::tls_certificates;
use provisioner::testing::TempPostgres;
use serde_json::Value;

use crate::support::*;

#[test]
fn on_postgres_machines_are_added_provisioned_retried_and_removed() {
    let (_pg, url, dir) = fresh_postgres("pg-machines");
    let down = config_file(
        &dir,
        "down.toml",
        "[retry]\ncount = 0\n[sim]\nzones = [\"az1\", \"az2\"]\nunavailable_zones = [\"az3\"]\n",
    );
    let mut s = Server::start_on_postgres(&dir, &url, &["--sim-start-latency", "100ms", "--config", &down]);
    assert!(s.dir.join("token").exists(), "the replica that initialised the database keeps the token");
    let ids = ids_of(&s.json(&["machine", "add", "-n", "4", "--zones", "az1,az2", "--wait", "--json"]));
    assert_eq!(ids, ["0", "1", "2", "3"]);
    assert_eq!(s.machines().len(), 4);
    assert!(s.machines().iter().all(|m| field(m, "status") == "started"), "{:?}", s.machines());
    // One fails (its zone is down), and stays failed until retried after its zone is back.
    let out = s.cli(&["machine", "add", "--zones", "az3", "--wait", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(field(machine(&s.machines(), "4"), "status"), "error");
    // Remove two: their instances stop and they go.
    assert!(s.cli(&["machine", "remove", "0", "1"]).status.success());
    eventually(Duration::from_secs(10), "machines 0 and 1 to be removed", || {
        !s.machines().iter().any(|m| ["0", "1"].contains(&field(m, "id")))
    });
    assert_eq!(s.terminate().code(), Some(0), "{}", s.log_text());

    let s = Server::start_on_postgres(&dir, &url, &["--sim-start-latency", "100ms"]);
    assert_eq!(field(machine(&s.machines(), "4"), "status"), "error", "still failed after a restart");
    let out = s.cli(&["machine", "retry", "4"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually(Duration::from_secs(10), "the retried machine to be provisioned", || {
        field(machine(&s.machines(), "4"), "status") == "started"
    });
    let left: Vec<String> = ["2", "3", "4"].map(String::from).to_vec();
    assert_provisioned_once(&s, &left);
    assert_eq!(s.instances().len(), 3);
    let config = s.cli(&["config", "set", "workers", "5"]);
    assert!(config.status.success());
    assert_eq!(s.json(&["status", "--json"])["machines"], 3);
    // The simulated cloud's instances, written on a connection of their own, are counted as
    // they are written: in the status and in the gauges (3 live; the 2 removed terminated).
    eventually(Duration::from_secs(10), "the status and the gauges to count the instances", || {
        let m = s.metrics();
        s.json(&["status", "--json"])["instances"] == 3
            && sample(&m, "provisioner_instances{state=\"running\"}") == Some(3.0)
            && sample(&m, "provisioner_instances{state=\"terminated\"}") == Some(2.0)
    });
    assert_eq!(raw_http(&s, "GET", "/readyz", false, None).0, 200);
}

/// `kill -9` with starts in flight, on PostgreSQL: after a restart every acknowledged machine
/// ends provisioned, each with exactly one live instance.
#[test]
fn on_postgres_a_crash_with_starts_in_flight_duplicates_nothing() {
    let (_pg, url, dir) = fresh_postgres("pg-crash");
    let cfg = config_file(&dir, "serve.toml", "resync = \"1s\"\n[retry]\ndelay = \"1s\"\n");
    let mut s = Server::start_on_postgres(&dir, &url, &["--sim-start-latency", "1s", "--config", &cfg]);
    let mut acknowledged = ids_of(&s.json(&["machine", "add", "-n", "15", "--json"]));
    eventually(Duration::from_secs(10), "starts to be in flight", || {
        !s.metrics().contains("provisioner_broker_calls_in_flight 0\n")
    });
    acknowledged.extend(ids_of(&s.json(&["machine", "add", "-n", "5", "--json"])));
    s.crash();
    let s = Server::start_on_postgres(&dir, &url, &["--sim-start-latency", "1s", "--config", &cfg]);
    eventually(Duration::from_secs(40), "every acknowledged machine to be provisioned", || {
        let m = s.machines();
        acknowledged.iter().all(|id| m.iter().any(|m| field(m, "id") == id && field(m, "status") == "started"))
    });
    assert_provisioned_once(&s, &acknowledged);
    assert_eq!(s.instances().len(), acknowledged.len(), "one live instance per machine");
}

/// A database that cannot be reached at start: the service waits (retrying with backoff),
/// answers `/readyz` (and `/healthz`) 503 meanwhile (unreachable: the reason only in the log), logs why, and serves as
/// soon as the database is there.
#[test]
fn an_unreachable_database_at_start_is_waited_for_with_readyz_503() {
    let mut pg = TempPostgres::start("serve-late").unwrap();
    let url = fresh_db(&pg);
    pg.stop().unwrap();
    let dir = temp_dir("pg-late");
    let port = free_port();
    let mut s = spawn_serve(&dir, &url, port, &[OsStr::new("--sim-start-latency"), OsStr::new("50ms")]);
    let mut seen = None;
    eventually(Duration::from_secs(20), "/readyz to answer", || {
        if let Ok(mut conn) = std::net::TcpStream::connect(format!("127.0.0.1:{port}")) {
            drop(conn.set_read_timeout(Some(Duration::from_secs(5))));
            use std::io::{Read, Write};
            let _ = conn.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut text = String::new();
            let _ = conn.read_to_string(&mut text);
            if !text.is_empty() {
                seen = Some(text);
            }
        }
        seen.is_some()
    });
    let text = seen.unwrap();
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("unreachable"), "the reason is given: {text}");
    assert_eq!(raw_http(&s, "GET", "/healthz", false, None).0, 503);
    eventually(Duration::from_secs(10), "the log to say why it waits", || {
        s.log_text().contains("waiting for the database")
    });
    assert!(s.child.as_mut().unwrap().try_wait().unwrap().is_none(), "it waits, it does not exit");
    pg.restart().unwrap();
    eventually(Duration::from_secs(20), "the service to be ready", || {
        std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_ok()
            && raw_http(&s, "GET", "/readyz", false, None).0 == 200
    });
    eventually(Duration::from_secs(10), "the token file", || s.dir.join("token").exists());
    let ids = ids_of(&s.json(&["machine", "add", "-n", "2", "--wait", "--json"]));
    assert_provisioned_once(&s, &ids);
    assert_eq!(s.terminate().code(), Some(0));
}

/// A replica whose database goes away answers 503, never stale data, and serves again once the
/// database is back.
#[test]
fn a_lost_database_answers_503_never_stale_data() {
    let mut pg = TempPostgres::start("serve-lost").unwrap();
    let url = fresh_db(&pg);
    let dir = temp_dir("pg-lost");
    let mut s = Server::start_on_postgres(&dir, &url, &["--sim-start-latency", "50ms"]);
    s.json(&["machine", "add", "-n", "2", "--wait", "--json"]);
    pg.stop().unwrap();
    let (code, _, body) = raw_http(&s, "GET", "/v1/machines", true, None);
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("database"), "{body}");
    assert_eq!(raw_http(&s, "GET", "/readyz", false, None).0, 503);
    let out = s.cli(&["machine", "list", "--json"]);
    assert!(!out.status.success(), "a list was answered without its database: {:?}", out.stdout);
    pg.restart().unwrap();
    eventually(Duration::from_secs(20), "the replica to serve again", || {
        raw_http(&s, "GET", "/readyz", false, None).0 == 200
    });
    assert_eq!(s.machines().len(), 2);
    assert_eq!(s.terminate().code(), Some(0));
}

/// A database migrated by a newer build is refused at start, naming both versions.
#[test]
fn a_newer_schema_is_refused_at_start_naming_both_versions() {
    let (_pg, url, dir) = fresh_postgres("pg-newer");
    let mut s = Server::start_on_postgres(&dir, &url, &[]);
    assert_eq!(s.terminate().code(), Some(0));
    let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
    c.execute("INSERT INTO schema_migrations (version) VALUES (42)", &[]).unwrap();
    let (code, err) = serve_output(&dir.join("data"), &["--store", &url]);
    assert_eq!(code, Some(1), "{err}");
    let ours = format!("this build's {}", provisioner::service::PG_SCHEMA_VERSION);
    assert!(err.contains("schema version 42") && err.contains(&ours), "{err}");
}

/// A second replica on the same database has no token file: it reads the token's hash from
/// the database, and takes the first replica's token (and only it).
#[test]
fn a_second_replica_knows_the_token_by_its_hash() {
    let (_pg, first, second) = two_replicas("pg-replicas", &[]);
    assert!(!second.dir.join("token").exists(), "only the initialising replica writes the token");
    let list = |token: &str| {
        let out =
            bin().args(["machine", "list", "--json", "--server", &second.url, "--token", token]).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert_eq!(list(&first.token()).0, Some(0), "the first replica's token works on the second");
    let (code, err) = list("not-the-token");
    assert_ne!(code, Some(0));
    assert!(err.contains("token"), "{err}");
}

/// The first replica's token file cannot be written (a data directory that no one, root
/// included, can create files in: `/proc`): the start fails naming it, and no token's hash is
/// kept in the database, so the next start (on a writable directory) writes a token that
/// works; the admin token is never lost. No notice of the server's is logged at info (the
/// models directory's `CREATE TABLE IF NOT EXISTS`, the lease's DDL).
#[cfg(target_os = "linux")]
#[test]
fn an_unwritable_token_file_loses_no_admin_token() {
    let pg = cluster();
    let url = fresh_db(&pg);
    let (code, err) = serve_output(Path::new("/proc"), &["--store", &url]);
    assert!(code.is_some_and(|c| c != 0), "{code:?} {err}");
    assert!(err.contains("/proc/token"), "the file is named: {err}");
    let dir = temp_dir("pg-token-unwritable");
    let s = Server::start_on_postgres(&dir, &url, &[]);
    let token = dir.join("data").join("token");
    assert!(token.exists(), "the replica that initialised the database keeps the token: {}", s.log_text());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&token).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let out = s.cli(&["machine", "list", "--json"]);
    assert!(out.status.success(), "the token file's token is the database's: {}", String::from_utf8_lossy(&out.stderr));
}

/// The server's notices (`relation ... already exists, skipping`) are logged at debug, never at
/// info; and a replica following the models directory (every 2 s) does not run its DDL again
/// at every read: with debug on, the directory table's notice is never seen.
#[test]
fn on_postgres_server_notices_are_debug_and_the_directory_table_is_made_once() {
    let (_pg, url, dir) = fresh_postgres("pg-notices");
    let port = free_port();
    let mut debug = bin();
    debug.env("PROVISIONER_LOG", "info,provisioner::service::pgconnect=debug,provisioner::service::store=debug");
    let s = Server::spawn_with(debug, port, &dir.join("data"), &dir.join("serve.log"), ["--store", &url]);
    eventually(Duration::from_secs(30), "the service to be ready", || {
        ureq::get(&format!("{}/healthz", s.url)).call().is_ok_and(|r| r.status() == 200)
    });
    // The directory is read again every 2 s: three reads at least.
    std::thread::sleep(Duration::from_secs(7));
    let text = s.log_text();
    let at_info: Vec<&str> = text.lines().filter(|l| l.contains("INFO") && l.contains("NOTICE")).collect();
    assert!(at_info.is_empty(), "server notices at info: {at_info:?}");
    let ddl = text.lines().filter(|l| l.contains("\"provisioner_models\" already exists")).count();
    assert_eq!(ddl, 0, "the directory's table made again: {text}");
    // The notices are there, at debug (the migrations' on the store's connection, at start).
    assert!(text.lines().any(|l| l.contains("DEBUG") && l.contains("already exists")), "{text}");
}

/// `bench serve --store URL` measures a service on PostgreSQL (an empty database), and refuses
/// one that holds a model already.
#[test]
fn bench_serve_runs_on_postgres() {
    let pg = cluster();
    let url = fresh_db(&pg);
    let bench = |url: &str| {
        bin()
            .args(["bench", "serve", "--requests", "40", "--clients", "2", "--list-every", "4"])
            .args(["--start-latency", "10ms", "--store", url, "--json"])
            .output()
            .unwrap()
    };
    let out = bench(&url);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((r["errors"].as_u64(), r["machines"].as_u64()), (Some(0), Some(30)), "{r}");
    let out = bench(&url);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("holds a model already"), "{err}");
}

/// Every replica's state gauges follow the database, not only its own writes: machines added
/// through a follower and provisioned by the leader show as started in the follower's
/// `/metrics` (and as added in the leader's), within a second or two of the change notices.
#[test]
fn every_replicas_gauges_follow_the_other_replicas_writes() {
    let (_pg, url, dir) = fresh_postgres("pg-gauges");
    let lease = ["--lease", "3s", "--lease-renew-deadline", "2s", "--lease-retry", "500ms"];
    let mut args = vec!["--sim-start-latency", "50ms"];
    args.extend_from_slice(&lease);
    let first = Server::start_on_postgres(&dir, &url, &args);
    eventually(Duration::from_secs(20), "the first replica to lead", || {
        // A replica that holds the lease answers 503 until its provisioners run: not yet.
        let out = first.cli(&["status", "--json"]);
        out.status.success() && serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|s| s["role"] == "leader")
    });
    let second = Server::start_second_replica(&dir, &url, &args);
    let add = bin()
        .args(["machine", "add", "-n", "3", "--json", "--server", &second.url, "--token", &first.token()])
        .output()
        .unwrap();
    assert!(add.status.success(), "{}", String::from_utf8_lossy(&add.stderr));
    let started = |s: &Server| sample(&s.metrics(), "provisioner_machines{status=\"started\"}") == Some(3.0);
    eventually(Duration::from_secs(20), "the leader's gauges to count the follower's adds as started", || {
        started(&first)
    });
    eventually(Duration::from_secs(10), "the follower's gauges to count the leader's starts", || started(&second));
    // The instances are counted on the simulated cloud's own store (its own connection),
    // refreshed beside the model's: they follow within the same second or two.
    eventually(Duration::from_secs(10), "the follower's gauges to count the leader's instances", || {
        sample(&second.metrics(), "provisioner_instances{state=\"running\"}") == Some(3.0)
    });
}

/// Issue 30, item 0: a request whose store cannot answer (here a lock another session holds on
/// the machines table, for longer than any deadline) is answered 503 within the request
/// deadline (`request_deadline`, 1 s here), saying what may have happened, not left hanging;
/// the probes answer within it too, and once the lock goes everything works again.
#[test]
fn a_request_the_store_cannot_answer_is_503_within_the_deadline() {
    let (_pg, url, dir) = fresh_postgres("pg-deadline");
    let config = config_file(&dir, "deadline.toml", "request_deadline = \"1s\"\n");
    let s = Server::start_on_postgres(&dir, &url, &["--config", &config]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "2", "--json"]));
    let mut holder = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
    let mut tx = holder.transaction().unwrap();
    tx.batch_execute("LOCK TABLE machines IN ACCESS EXCLUSIVE MODE").unwrap();
    let call = |method: &str, path: &str| {
        let began = Instant::now();
        let r = ureq::request(method, &format!("{}{path}", s.url))
            .set("Authorization", &format!("Bearer {}", s.token()))
            .timeout(Duration::from_secs(30))
            .send_json(serde_json::json!({"count": 1}));
        let took = began.elapsed();
        match r {
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default(), took),
            Ok(r) => (r.status(), r.into_string().unwrap_or_default(), took),
            Err(e) => panic!("{method} {path}: {e}"),
        }
    };
    let (code, body, took) = call("GET", "/v1/machines");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("no answer within 1s"), "{body}");
    assert!(took < Duration::from_secs(3), "answered within the deadline: {took:?}");
    let (code, body, took) = call("POST", "/v1/machines");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("may still be made"), "a change says it may have been made: {body}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    // The probes answer too (whatever they find), within the deadline.
    let (code, body, took) = call("GET", "/healthz");
    assert!(code == 200 || code == 503, "{code} {body}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    tx.rollback().unwrap();
    eventually(Duration::from_secs(30), "the store answering again", || {
        let out = s.cli(&["machine", "list", "--json"]);
        out.status.success() && ids.iter().all(|id| String::from_utf8_lossy(&out.stdout).contains(&format!("\"{id}\"")))
    });
}

/// `serve --store URL ARGS` on `dir/data`, not waited for (it may never be ready).
fn spawn_serve(dir: &Path, url: &str, port: u16, extra: &[&OsStr]) -> Server {
    let mut args = vec![OsStr::new("--store"), OsStr::new(url)];
    args.extend_from_slice(extra);
    Server::spawn(port, &dir.join("data"), &dir.join("serve.log"), args)
}

/// Issue 30, item 7: a replica on a PostgreSQL that has TLS, its URL `sslmode=verify-full` with
/// the CA that signed the server's certificate: it leads (the lease and the listener connect
/// over TLS too), provisions, and every session it holds is encrypted; the same URL with
/// another CA is refused, the log saying which file does not sign the certificate.
#[test]
fn on_postgres_over_tls_a_replica_leads_and_serves_and_a_wrong_ca_is_refused() {
    let (ca, cert, key) = tls_certificates("provisioner test CA");
    let (other_ca, _, _) = tls_certificates("another CA");
    let pg = TempPostgres::start_tls("serve-tls", &cert, &key).unwrap();
    let dir = temp_dir("pg-tls");
    let (ca_file, other_file) = (dir.join("ca.pem"), dir.join("other-ca.pem"));
    std::fs::write(&ca_file, ca).unwrap();
    std::fs::write(&other_file, other_ca).unwrap();
    let url = fresh_db(&pg);
    let db = url.rsplit('/').next().unwrap().to_owned();
    let tls_url = format!("{url}?sslmode=verify-full&sslrootcert={}", ca_file.display());
    let lease = ["--replica-id", "tls-a", "--lease", "3s", "--lease-renew-deadline", "2s", "--lease-retry", "500ms"];
    let mut args = vec!["--sim-start-latency", "50ms"];
    args.extend_from_slice(&lease);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    let mut s = Server::start_on_postgres(&dir.join("a"), &tls_url, &args);
    eventually(Duration::from_secs(20), "the replica to lead", || {
        let out = s.cli(&["status", "--json"]);
        out.status.success() && serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|v| v["role"] == "leader")
    });
    let ids = ids_of(&s.json(&["machine", "add", "-n", "2", "--wait", "--json"]));
    assert_provisioned_once(&s, &ids);
    let mut admin = ::postgres::Client::connect(pg.url(), ::postgres::NoTls).unwrap();
    let sessions: Vec<(String, bool)> = admin
        .query(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.datname = $1 AND a.application_name LIKE 'provisioner%'",
            &[&db],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for app in ["provisioner", "provisioner-lease", "provisioner-listen"] {
        assert!(sessions.iter().any(|(a, _)| a == app), "no {app} session: {sessions:?}");
    }
    assert!(sessions.iter().all(|(_, ssl)| *ssl), "a session in clear: {sessions:?}");
    assert_eq!(s.terminate().code(), Some(0));

    let wrong = format!("{url}?sslmode=verify-full&sslrootcert={}", other_file.display());
    let b = dir.join("b");
    std::fs::create_dir_all(&b).unwrap();
    let port = free_port();
    let refused = spawn_serve(&b, &wrong, port, &[]);
    let says = format!("the database's certificate is not signed by the CA in {} (sslrootcert)", other_file.display());
    eventually(Duration::from_secs(20), "the log to say the CA does not sign the certificate", || {
        refused.log_text().contains(&says)
    });
    assert_eq!(raw_http(&refused, "GET", "/readyz", false, None).0, 503, "never ready on an untrusted database");
}

/// Issue 30, leftover of item 7: the stand-in that answers while the database cannot be reached
/// at start speaks TLS when `--tls-cert/--tls-key` are given (plain HTTP gets no answer), and
/// tells a caller it cannot authenticate `not ready` without the database's error text (which
/// is in the log).
#[test]
fn the_stand_in_for_an_unreachable_database_speaks_tls_and_keeps_the_error_to_the_log() {
    let dir = temp_dir("pg-stand-in-tls");
    let (cert, key) = test_certificate(&dir, "server");
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    let port = free_port();
    let s = spawn_serve(
        &dir,
        &url,
        port,
        &[OsStr::new("--tls-cert"), cert.as_os_str(), OsStr::new("--tls-key"), key.as_os_str()],
    );
    let agent = agent_trusting(&cert);
    let mut bodies = Vec::new();
    eventually(Duration::from_secs(20), "the stand-in to answer over https", || {
        for path in ["/readyz", "/healthz", "/v1/machines"] {
            match agent
                .get(&format!("https://127.0.0.1:{port}{path}"))
                .set("Authorization", "Bearer not-a-token")
                .call()
            {
                Err(ureq::Error::Status(code, r)) => bodies.push((code, r.into_string().unwrap())),
                _ => return false,
            }
        }
        true
    });
    for (code, body) in &bodies {
        assert_eq!(*code, 503, "{body}");
        assert_eq!(
            body,
            "not ready: waiting for the database: the database is unreachable (the reason is in the service's log)\n",
            "no error text for an unauthenticated caller"
        );
    }
    eventually(Duration::from_secs(10), "the log to give the reason", || {
        let log = s.log_text();
        log.contains("waiting for the database") && log.contains("Connection refused")
    });
    // Plain HTTP to the TLS port gets no HTTP answer.
    let mut conn = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    use std::io::{Read, Write};
    let _ = conn.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut text = Vec::new();
    let _ = conn.read_to_end(&mut text);
    assert!(!text.starts_with(b"HTTP/1.1"), "plain HTTP answered: {}", String::from_utf8_lossy(&text));
}
