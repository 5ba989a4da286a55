//! The data directory and its database: one service per directory, a damaged or missing
//! database refused at start (and `--init` on purpose), private files and a warning for a
//! readable token, and `/healthz` failing when the database cannot be read.

use std::time::Duration;

use crate::support::{bin, eventually, free_port, raw_http, serve_output, temp_dir, Server};

/// Two services on one data directory would provision the same model twice: the second is
/// refused at start (exit 1), and the first goes on.
#[test]
fn a_second_service_on_the_same_data_directory_is_refused() {
    let dir = temp_dir("twice");
    let s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    let out = bin()
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port()), "--data-dir"])
        .arg(&s.dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("another provisioner service"), "{err}");
    assert_eq!(s.json(&["machine", "add", "--wait", "--json"]), serde_json::json!(["0"]));
}

/// A damaged database is refused at start with a message that says what to
/// do; a missing or empty database next to a WAL or a token is not silently a new model;
/// `serve --init` creates one on purpose.
#[test]
fn a_damaged_or_missing_database_is_refused_at_start() {
    let dir = temp_dir("damaged");
    let mut s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    s.json(&["machine", "add", "-n", "50", "--wait", "--json"]);
    let uuid = s.json(&["status", "--json"])["model_uuid"].as_str().unwrap().to_owned();
    assert_eq!(s.terminate().code(), Some(0));
    let data = s.dir.clone();
    let db = data.join("provisioner.db");
    // Everything into the database file itself (the WAL checkpointed and gone).
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
    drop(conn);
    assert!(!data.join("provisioner.db-wal").exists());
    let pristine = std::fs::read(&db).unwrap();
    assert!(pristine.len() >= 4 * 4096, "{}", pristine.len());

    // One corrupt page (the second, a table's root): refused, exit 1, says what to do.
    let mut bad = pristine.clone();
    for b in &mut bad[4096 + 8..4096 + 1000] {
        *b = 0x5a;
    }
    std::fs::write(&db, &bad).unwrap();
    let (code, err) = serve_output(&data, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("damaged") && err.contains("backup") && err.contains("--init"), "{err}");
    assert_eq!(err.trim().lines().filter(|l| l.starts_with("error")).count(), 1, "{err}");

    // A zero-length database: refused, not a new model.
    std::fs::write(&db, b"").unwrap();
    let (code, err) = serve_output(&data, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("empty") && err.contains("--init"), "{err}");
    assert_eq!(std::fs::metadata(&db).unwrap().len(), 0, "the refused start wrote a model");

    // Deleted, with its WAL left behind (a crash, then a careless clean-up): refused.
    std::fs::write(&db, &pristine).unwrap();
    let mut s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    assert_eq!(s.json(&["status", "--json"])["model_uuid"], uuid.as_str(), "the restored copy is the model");
    s.json(&["machine", "add", "--json"]);
    s.crash();
    assert!(data.join("provisioner.db-wal").exists());
    std::fs::remove_file(&db).unwrap();
    let (code, err) = serve_output(&data, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("provisioner.db-wal") && err.contains("--init"), "{err}");
    assert!(!db.exists(), "the refused start created a database");

    // On purpose: --init makes a new model (the leftover WAL is moved aside, not replayed).
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--init"]);
    let fresh = s.json(&["status", "--json"]);
    assert_ne!(fresh["model_uuid"], uuid.as_str());
    assert_eq!(fresh["machines"], 0);
    drop(s);
    // --init on a data directory that holds a model is refused: it would orphan its instances.
    let (code, err) = serve_output(&data, &["--init"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("already holds model"), "{err}");
    // A fresh, empty data directory needs no --init.
    let other = temp_dir("damaged-fresh");
    let s = Server::start(&other, &["--sim-start-latency", "50ms"]);
    assert_eq!(s.json(&["status", "--json"])["machines"], 0);
}

/// The database and its WAL are private (0600) like the token, and a token
/// file others can read is warned about.
#[cfg(unix)]
#[test]
fn database_files_are_private_and_a_readable_token_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("modes");
    let mut s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    s.json(&["machine", "add", "--wait", "--json"]);
    for f in ["provisioner.db", "provisioner.db-wal", "token"] {
        let mode = std::fs::metadata(s.dir.join(f)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{f}: mode {mode:o}");
    }
    assert!(!s.log_text().contains("readable by others"));
    assert_eq!(s.terminate().code(), Some(0));
    std::fs::set_permissions(s.dir.join("token"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    eventually(Duration::from_secs(5), "the warning", || s.log_text().contains("readable by others"));
}

/// `/healthz` fails (503, saying why) when the store cannot be read, here
/// because the database file was replaced under the running service (by a file that is not a
/// database); a restart then refuses the damaged file.
#[test]
fn healthz_fails_when_the_database_cannot_be_read() {
    let dir = temp_dir("health-damaged");
    let mut s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    s.json(&["machine", "add", "-n", "2", "--wait", "--json"]);
    assert_eq!(raw_http(&s, "GET", "/healthz", false, None).0, 200);
    assert_eq!(raw_http(&s, "GET", "/readyz", false, None).0, 200, "the store is readable: ready");
    let db = s.dir.join("provisioner.db");
    std::fs::remove_file(&db).unwrap();
    std::fs::write(&db, "this is not a database\n".repeat(1000)).unwrap();
    let (code, _, text) = raw_http(&s, "GET", "/healthz", false, None);
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("database"), "{text}");
    let (code, _, text) = raw_http(&s, "GET", "/readyz", false, None);
    assert_eq!(code, 503, "not ready on an unreadable store: {text}");
    s.crash();
    // (With its WAL, SQLite could still read every page written since the service started;
    // without it, what is left is not a database.)
    std::fs::remove_file(s.dir.join("provisioner.db-wal")).unwrap();
    let (code, err) = serve_output(&s.dir, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("damaged") && err.contains("--init"), "{err}");
}
