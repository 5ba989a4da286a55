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
