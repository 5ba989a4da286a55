//! The service's spans as OpenTelemetry traces (issue 37, feature `otel`): `serve
//! --otlp-endpoint URL` posts its spans (OTLP over HTTP, protobuf) to a small receiver the test
//! starts (`.ci/otlp-receiver`, on the python of `.ci/otlp-venv`), which prints each span it
//! gets as a JSON line; and a receiver that is down holds nothing up.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

/// The receiver: its process, its port and the spans it printed so far.
struct Receiver {
    child: Child,
    port: u16,
    spans: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let venv = Command::new(root.join(".ci/otlp-venv")).output().expect(".ci/otlp-venv runs");
        assert!(venv.status.success(), ".ci/otlp-venv: {}", String::from_utf8_lossy(&venv.stderr));
        let python = String::from_utf8(venv.stdout).unwrap().trim().to_owned();
        let port = free_port();
        let mut child = Command::new(python)
            .arg(root.join(".ci/otlp-receiver"))
            .arg(port.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the receiver starts");
        let out = BufReader::new(child.stdout.take().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                kept.lock().unwrap().push(serde_json::from_str::<Value>(&line).expect("a JSON line"));
            }
        });
        eventually(Duration::from_secs(20), "the receiver to listen", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Receiver { child, port, spans }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The spans named `name` received so far.
    fn named(&self, name: &str) -> Vec<Value> {
        self.spans.lock().unwrap().iter().filter(|s| s["name"] == name).cloned().collect()
    }

    /// The spans of trace `trace` received so far.
    fn in_trace(&self, trace: &Value) -> Vec<Value> {
        self.spans.lock().unwrap().iter().filter(|s| s["trace"] == *trace).cloned().collect()
    }
}

/// The one span of `spans` named `name` whose parent is `parent` (and, if given, whose
/// attribute `key` is `value`); a panic naming what is missing otherwise.
fn child<'a>(spans: &'a [Value], name: &str, parent: &Value, attr: Option<(&str, &str)>) -> &'a Value {
    let found: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == name && s["parent"] == parent["span"])
        .filter(|s| attr.is_none_or(|(k, v)| s["attributes"][k] == v))
        .collect();
    assert_eq!(found.len(), 1, "one {name} {attr:?} under {}: {spans:#?}", parent["name"]);
    found[0]
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each API request is a span (a trace's root): its method, route, status, model and token
/// id, never the token itself; the service names itself `provisioner` unless
/// `OTEL_SERVICE_NAME` says otherwise; the export's drop count is a metric.
#[test]
fn each_request_is_a_span_naming_its_route_model_and_token_id_never_the_token() {
    let receiver = Receiver::start();
    let dir = temp_dir("traces-requests");
    let s = Server::start(&dir, &["--otlp-endpoint", &receiver.url(), "--sim-start-latency", "0s"]);
    let ids = ids_of(&s.json(&["machine", "add", "-n", "2", "--json"]));
    assert_eq!(ids.len(), 2);
    let _ = s.json(&["status", "--json"]);
    let found = poll(Duration::from_secs(20), Duration::from_millis(100), || {
        let spans = receiver.named("http request");
        let add = spans.iter().find(|s| s["attributes"]["http.route"] == "/v1/machines")?.clone();
        let status = spans.iter().find(|s| s["attributes"]["http.route"] == "/v1/status")?.clone();
        Some((add, status))
    });
    let (add, status) = found.unwrap_or_else(|| panic!("no request spans: {:?}", receiver.spans.lock().unwrap()));
    let a = &add["attributes"];
    assert_eq!(
        (&a["http.request.method"], &a["http.response.status_code"], &a["model"], &a["token"]),
        (&Value::from("POST"), &Value::from("201"), &Value::from("default"), &Value::from("admin")),
        "{add}"
    );
    assert_eq!(add["parent"], "", "a root");
    assert_eq!(add["service"], "provisioner");
    assert_ne!(add["trace"], status["trace"], "a trace a request");
    assert!(add["end"].as_u64() >= add["start"].as_u64());
    let token = s.token();
    let all = serde_json::to_string(&*receiver.spans.lock().unwrap()).unwrap();
    assert!(!all.contains(&token), "no span carries the token");
    assert_eq!(sample(&s.metrics(), "provisioner_trace_spans_dropped_total"), Some(0.0));
}

/// A receiver that is down holds nothing up, whether nothing listens (refused at once) or it
/// takes the connection and never answers (each export waits out its deadline on the export's
/// own thread): the machines are added and started as without export.
#[test]
fn a_receiver_that_is_down_holds_nothing_up() {
    // Listening, never accepting: the kernel completes the connections, nobody answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refused = format!("http://127.0.0.1:{}", free_port());
    let silent_url = format!("http://127.0.0.1:{}", silent.local_addr().unwrap().port());
    for (name, url) in [("refused", refused), ("silent", silent_url)] {
        let dir = temp_dir(&format!("traces-down-{name}"));
        let s = Server::start(&dir, &["--otlp-endpoint", &url, "--sim-start-latency", "0s"]);
        let began = Instant::now();
        for _ in 0..20 {
            assert_eq!(ids_of(&s.json(&["machine", "add", "-n", "5", "--json"])).len(), 5);
        }
        eventually(Duration::from_secs(30), "every machine started", || {
            s.machines().iter().filter(|m| field(m, "status") == "started").count() == 100
        });
        let took = began.elapsed();
        assert!(took < Duration::from_secs(15), "{name}: 100 machines took {took:?}");
        assert!(s.log_text().contains("exporting traces"), "the log says where spans go");
    }
}

/// A bad `--otlp-endpoint` is refused at start, naming it.
#[test]
fn a_bad_otlp_endpoint_is_refused_at_start_naming_it() {
    let dir = temp_dir("traces-bad");
    let (code, err) = serve_output(&dir.join("data"), &["--otlp-endpoint", "collector:4318"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("collector:4318") && err.contains("--otlp-endpoint"), "{err}");
}

/// A machine added through a follower and started by the leader, on PostgreSQL, is one trace:
/// the follower's request and its store commit, then the leader's pick of it in a coordinator
/// batch (a child of the request, through the trace context stored with the machine), the
/// start, its zone decision, its cloud call and the instance's record with its commit, every
/// parent link intact, each span naming the replica that made it.
#[cfg(feature = "postgres")]
#[test]
fn a_machine_added_through_a_follower_is_one_trace_to_the_leaders_cloud_call() {
    let receiver = Receiver::start();
    let url = receiver.url();
    let c = crate::ha::Cluster::start_with(
        "traces-ha",
        2,
        false,
        &["--otlp-endpoint", &url, "--sim-start-latency", "200ms", "--sim-zones", "az1,az2"],
    );
    let (leader, _) = c.leader(0, Duration::from_secs(30));
    let follower = c.follower(leader, 0);
    let id = c.add(follower, 1).pop().unwrap();
    let (leader_id, follower_id) = (format!("replica-{leader}"), format!("replica-{follower}"));
    let spans = poll(Duration::from_secs(60), Duration::from_millis(100), || {
        let named = receiver.named("start");
        let start = named.iter().find(|s| s["attributes"]["machine"] == id.as_str())?;
        let spans = receiver.in_trace(&start["trace"]);
        // Complete once the request and the record's commit are in.
        let done = spans.iter().any(|s| s["name"] == "http request")
            && spans.iter().any(|s| s["name"] == "store commit" && s["attributes"]["write"] == "instance record");
        done.then_some(spans)
    })
    .unwrap_or_else(|| panic!("no complete trace of machine {id}: {:#?}", receiver.spans.lock().unwrap()));

    let roots: Vec<&Value> = spans.iter().filter(|s| s["parent"] == "").collect();
    assert_eq!(roots.len(), 1, "one root: {spans:#?}");
    let request = roots[0];
    assert_eq!(
        (&request["name"], &request["attributes"]["http.route"], &request["instance"]),
        (&Value::from("http request"), &Value::from("/v1/machines"), &Value::from(follower_id.as_str())),
        "the root is the follower's request"
    );
    let ids: Vec<&Value> = spans.iter().map(|s| &s["span"]).collect();
    for s in &spans {
        assert!(s["parent"] == "" || ids.contains(&&s["parent"]), "a parent outside the trace: {s}");
    }
    let commit = child(&spans, "store commit", request, Some(("write", "machines added")));
    assert_eq!(commit["instance"], follower_id.as_str());
    let picked = child(&spans, "coordinator batch", request, Some(("machine", &id)));
    let start = child(&spans, "start", picked, None);
    for s in [picked, start] {
        assert_eq!(s["instance"], leader_id.as_str(), "the leader's: {s}");
    }
    assert_eq!(start["attributes"]["outcome"], "started");
    let zone = child(&spans, "zone decision", start, None);
    assert!(["az1", "az2"].contains(&zone["attributes"]["zone"].as_str().unwrap_or("")), "{zone}");
    let call = child(&spans, "cloud call", start, Some(("cloud.operation", "start_instance")));
    assert_eq!(call["attributes"]["outcome"], "ok", "{call}");
    assert_eq!(call["attributes"]["zone"], zone["attributes"]["zone"]);
    let instance = &call["attributes"]["instance"];
    assert_eq!(&start["attributes"]["instance"], instance);
    let record = child(&spans, "record instance", start, Some(("instance", instance.as_str().unwrap())));
    let recorded = child(&spans, "store commit", record, Some(("write", "instance record")));
    assert_eq!(recorded["instance"], leader_id.as_str());
    let at = |s: &Value| s["start"].as_u64().unwrap();
    assert!(at(request) <= at(commit) && at(commit) <= at(picked), "in time order");
    assert!(at(picked) <= at(start) && at(start) <= at(zone) && at(zone) <= at(call) && at(call) <= at(record));
    assert!(spans.iter().all(|s| s["end"].as_u64() >= s["start"].as_u64()));

    // The operator guide's picture of one trace is drawn from this trace by the project's own
    // script (`UPDATE_TRACE_PICTURE=1` writes it to docs/): it draws every span, and both replicas.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = temp_dir("traces-picture");
    let lines: Vec<String> = spans.iter().map(Value::to_string).collect();
    std::fs::write(dir.join("trace.jsonl"), lines.join("\n")).unwrap();
    let svg = dir.join("trace.svg");
    let drawn = Command::new(root.join(".ci/trace-picture")).arg(dir.join("trace.jsonl")).arg(&svg).output().unwrap();
    assert!(drawn.status.success(), "{}", String::from_utf8_lossy(&drawn.stderr));
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(picture.matches("<rect x=\"").count() - 2, spans.len(), "a bar a span (besides the two keys)");
    for name in ["http request", "store commit", "coordinator batch", "zone decision", "cloud call", "record instance"]
    {
        assert!(picture.contains(name), "{name} drawn");
    }
    assert!(picture.contains(&leader_id) && picture.contains(&follower_id));
    if std::env::var_os("UPDATE_TRACE_PICTURE").is_some() {
        std::fs::copy(&svg, root.join("docs/trace-across-replicas.svg")).unwrap();
    }
}

/// A container's start is linked to its host's: the container's pick (a trace of its own, as
/// containers added with `--container` store no context) carries a link to the request that
/// added its host, read from the host's stored trace context.
#[test]
fn a_containers_pick_is_linked_to_the_request_that_added_its_host() {
    let receiver = Receiver::start();
    let dir = temp_dir("traces-containers");
    let s = Server::start(
        &dir,
        &["--otlp-endpoint", &receiver.url(), "--sim-start-latency", "50ms", "--sim-container-init-delay", "100ms"],
    );
    assert_eq!(ids_of(&s.json(&["machine", "add", "--wait", "--json"])), ["0"]);
    let ids = ids_of(&s.json(&["machine", "add", "--container", "lxd", "--host", "0", "--json"]));
    assert_eq!(ids, ["0/lxd/0"]);
    let found = poll(Duration::from_secs(30), Duration::from_millis(100), || {
        let picks = receiver.named("coordinator batch");
        let host = picks.iter().find(|p| p["attributes"]["machine"] == "0")?.clone();
        let container = picks.iter().find(|p| p["attributes"]["machine"] == "0/lxd/0")?.clone();
        let request = receiver.named("http request").into_iter().find(|r| r["span"] == host["parent"])?;
        Some((host, container, request))
    });
    let (host, container, request) =
        found.unwrap_or_else(|| panic!("no picks of 0 and 0/lxd/0: {:#?}", receiver.spans.lock().unwrap()));
    assert_eq!(
        (&request["attributes"]["http.route"], &host["trace"]),
        (&Value::from("/v1/machines"), &request["trace"])
    );
    assert_eq!(container["parent"], "", "the container's own trace");
    assert_ne!(container["trace"], host["trace"]);
    assert_eq!(
        container["links"],
        serde_json::json!([{ "trace": request["trace"], "span": request["span"] }]),
        "linked to its host's request"
    );
}
