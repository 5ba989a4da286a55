//! The event stream, `GET /v1/events`: provisioner events streamed as server-sent events to
//! connected clients (SIGTERM ends the stream and still exits promptly), and a client that
//! stops reading dropped with a final event rather than buffered without bound; and its limits
//! (issue 30): a revoked token's streams end at once with a last `token-revoked` event (on
//! PostgreSQL, on the other replicas too, within a second); streams are capped per token and in
//! total (429 naming the cap and how to raise it).

use std::io::{BufRead, BufReader, Read};
use std::time::{Duration, Instant};

use serde_json::Value;

#[cfg(feature = "postgres")]
use crate::support::two_replicas;
use crate::support::{config_file, eventually, field, sample, temp_dir, Server};

type Lines = std::io::Lines<BufReader<Box<dyn Read + Send + Sync>>>;

/// Opens `/v1/events` with `token` on a connection of its own: its lines (the first one read:
/// `: connected`), or the refusal's status and body.
fn open(s: &Server, token: &str) -> Result<Lines, (u16, String)> {
    let agent = ureq::AgentBuilder::new().timeout_read(Duration::from_secs(5)).build();
    match agent.get(&format!("{}/v1/events", s.url)).set("Authorization", &format!("Bearer {token}")).call() {
        Ok(r) => {
            assert_eq!(r.content_type(), "text/event-stream");
            let mut lines = BufReader::new(r.into_reader()).lines();
            assert_eq!(lines.next().unwrap().unwrap(), ": connected");
            Ok(lines)
        }
        Err(ureq::Error::Status(code, r)) => Err((code, r.into_string().unwrap_or_default())),
        Err(e) => panic!("GET /v1/events: {e}"),
    }
}

/// `token create --json`: (id, token).
fn create(s: &Server) -> (String, String) {
    let made = s.json(&["token", "create", "--json"]);
    (field(&made, "id").to_owned(), field(&made, "token").to_owned())
}

/// Reads lines until a `data:` line naming `event`.
fn read_until(lines: &mut Lines, event: &str) {
    for line in lines.by_ref() {
        let line = line.expect("the stream broke off");
        if line.starts_with("data: ") && line.contains(&format!("\"event\":\"{event}\"")) {
            return;
        }
    }
    panic!("the stream ended before a {event} event");
}

/// Reads the stream to its end: its `data:` lines (a read that times out fails the test: the
/// stream did not end).
fn read_to_end(lines: Lines) -> Vec<String> {
    lines
        .map(|l| l.expect("the stream did not end"))
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_owned))
        .collect()
}

/// Revokes `id` through `by`, then `stream` (open with it) must end within a second with a
/// last `token-revoked` event naming the token, and no event after it.
fn assert_ends_on_revocation(by: &Server, id: &str, stream: Lines) {
    let out = by.cli(&["token", "revoke", id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let revoked = Instant::now();
    let data = read_to_end(stream);
    let took = revoked.elapsed();
    assert!(took < Duration::from_secs(1), "the revoked token's stream ended only after {took:?}");
    let last = data.last().map(String::as_str).unwrap_or("");
    assert!(last.contains("\"event\":\"token-revoked\"") && last.contains(id), "{data:?}");
}

#[test]
fn a_revoked_tokens_event_streams_end_at_once_with_a_last_event() {
    let dir = temp_dir("events-revoke");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let (id, token) = create(&s);
    let (_, other) = create(&s);
    let mut stream = open(&s, &token).unwrap();
    let mut kept = open(&s, &other).unwrap();
    s.json(&["machine", "add", "--json"]);
    read_until(&mut stream, "machine-started");
    read_until(&mut kept, "machine-started");
    assert_ends_on_revocation(&s, &id, stream);
    let (code, text) = open(&s, &token).err().expect("a revoked token opens no stream");
    assert!(code == 401 && text.contains("revoked"), "{code} {text}");
    // Another token's stream goes on.
    s.json(&["machine", "add", "--json"]);
    read_until(&mut kept, "machine-started");
}

/// Two replicas on one PostgreSQL database: a token revoked through one loses its stream on
/// the other within a second.
#[cfg(feature = "postgres")]
#[test]
fn on_postgres_a_token_revoked_through_one_replica_loses_its_streams_on_the_other() {
    let (_pg, first, second) = two_replicas("events-revoke-pg", &["--sim-start-latency", "50ms"]);
    let (id, token) = create(&first);
    let stream = open(&second, &token).unwrap();
    let on_first = open(&first, &token).unwrap();
    // Both replicas' streams of the token end: the other's too.
    assert_ends_on_revocation(&first, &id, stream);
    let data = read_to_end(on_first);
    assert!(data.last().is_some_and(|l| l.contains("token-revoked")), "{data:?}");
}

#[test]
fn event_streams_are_capped_per_token_and_in_total_with_429_naming_the_cap() {
    let dir = temp_dir("events-caps");
    let cfg = config_file(&dir, "serve.toml", "[events]\nmax_streams_per_token = 2\nmax_streams = 3\n");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--config", &cfg]);
    let admin = s.token();
    let (_, token) = create(&s);
    let mut held = vec![open(&s, &admin).unwrap(), open(&s, &admin).unwrap()];
    let (code, text) = open(&s, &admin).err().expect("a third stream of one token");
    assert_eq!(code, 429, "{text}");
    assert!(text.contains("admin") && text.contains("2 event streams"), "{text}");
    assert!(text.contains("max_streams_per_token in the [events] section of the config file"), "{text}");
    held.push(open(&s, &token).unwrap());
    let (code, text) = open(&s, &token).err().expect("a fourth stream in all");
    assert_eq!(code, 429, "{text}");
    assert!(text.contains("3 event streams") && text.contains("max_streams in the [events] section"), "{text}");
    // The refused took nothing: every held stream still gets the events.
    s.json(&["machine", "add", "--json"]);
    for stream in &mut held {
        read_until(stream, "machine-started");
    }
    // A stream closed makes room.
    drop(held.remove(0));
    let mut again = None;
    eventually(Duration::from_secs(20), "the closed stream's place to be free", || {
        again = open(&s, &admin).ok();
        again.is_some()
    });
}

#[test]
fn by_default_one_token_holds_at_most_eight_event_streams() {
    let dir = temp_dir("events-default-cap");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let admin = s.token();
    let _held: Vec<Lines> = (0..8).map(|i| open(&s, &admin).unwrap_or_else(|e| panic!("stream {i}: {e:?}"))).collect();
    let (code, text) = open(&s, &admin).err().expect("a ninth stream");
    assert!(code == 429 && text.contains("8 event streams"), "{code} {text}");
    let (_, token) = create(&s);
    assert!(open(&s, &token).is_ok(), "another token's stream");
}

/// `GET /v1/events` streams provisioner events as server-sent events; SIGTERM ends the stream
/// and still exits promptly.
#[test]
fn events_are_streamed_to_connected_clients() {
    use std::io::BufRead;
    let dir = temp_dir("events");
    let mut s = Server::start(&dir, &["--sim-start-latency", "100ms"]);
    let agent = ureq::AgentBuilder::new().timeout_read(Duration::from_secs(10)).build();
    let unauthorized = agent.get(&format!("{}/v1/events", s.url)).call();
    assert!(matches!(unauthorized, Err(ureq::Error::Status(401, _))));
    let resp = agent
        .get(&format!("{}/v1/events", s.url))
        .set("Authorization", &format!("Bearer {}", s.token()))
        .call()
        .unwrap();
    assert_eq!(resp.content_type(), "text/event-stream");
    let mut lines = std::io::BufReader::new(resp.into_reader()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), ": connected");
    s.json(&["machine", "add", "-n", "2", "--json"]);
    let mut started = Vec::new();
    while started.len() < 2 {
        let line = lines.next().expect("stream ended early").unwrap();
        if let Some(json) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(json).unwrap();
            if v["event"] == "machine-started" {
                assert!(v["instance"].as_str().is_some_and(|i| i.starts_with("i-")), "{v}");
                started.push(v["machine"].as_str().unwrap().to_owned());
            }
        }
    }
    started.sort();
    assert_eq!(started, ["0", "1"]);
    let began = Instant::now();
    assert_eq!(s.terminate().code(), Some(0));
    assert!(began.elapsed() < Duration::from_secs(5), "an open event stream held up the shutdown");
    // The stream ends with the service.
    assert!(lines.all(
        |l| l.is_ok_and(|l| l.is_empty() || l.starts_with(':') || l.starts_with("event") || l.starts_with("data"))
    ));
}

/// A client of the event stream that stops reading is not buffered without
/// bound: past its queue's limit it is dropped, with a final event saying so.
#[test]
fn a_slow_event_client_is_dropped_with_a_final_event() {
    use std::io::{Read, Write};
    let dir = temp_dir("slow-events");
    let s = Server::start(&dir, &["--sim-start-latency", "0s"]);
    let addr = s.url.trim_start_matches("http://").to_owned();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        conn,
        "GET /v1/events HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {}\r\n\r\n",
        s.token()
    )
    .unwrap();
    // Never read while machines are provisioned, 10,000 at a time, until the client has been
    // dropped: the kernel's socket buffers (up to 4 MiB here) take the first events, then the
    // service's queue for the client fills.
    let mut added = 0;
    while sample(&s.metrics(), "provisioner_event_streams_dropped_total") == Some(0.0) {
        assert!(added < 80_000, "{added} machines' events and the slow client is still queued for");
        s.json(&["machine", "add", "-n", "10000", "--json"]);
        added += 10_000;
        eventually(Duration::from_secs(120), "the machines to be provisioned", || {
            sample(&s.metrics(), "provisioner_events_total{event=\"machine-started\"}") == Some(added as f64)
        });
    }
    conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let _ = conn.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    let started = text.matches("event: machine-started").count();
    assert!(started < added, "the slow client got every event: was it buffered without bound?");
    assert!(text.contains("event: stream-dropped"), "no final event: ...{}", &text[text.len().saturating_sub(500)..]);
    let last = text.trim_end().lines().rev().find(|l| l.starts_with("data: ")).unwrap_or("");
    assert!(last.contains("stream-dropped") && last.contains("reconnect"), "{last}");
}
