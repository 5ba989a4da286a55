//! moto's EC2 server for tests (features `test-util` and `ec2`): `tests/ec2/moto_server.py`
//! (moto, patched to honour client tokens and to inject the faults named below), installed into
//! a virtualenv by `.ci/moto-venv` on first use, started once per test process on a free
//! loopback port, gone when the test process is. The EC2 broker's tests (`tests/ec2`) and the
//! service's (`tests/serve`) share it; each test uses a model uuid of its own, so none sees
//! another's instances or faults.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::adapters::ec2::{Ec2Broker, Ec2Config};

/// The SQS queue the server's EventBridge rule delivers interruption notices to (its name).
pub const INTERRUPTION_QUEUE: &str = "provisioner-interruptions";
/// Another queue the rule delivers every notice to as well, with a visibility timeout of
/// [`HANDOVER_QUEUE_VISIBILITY`]: for the tests whose provisioner reads the notices (it deletes
/// those of instances not its model's, so it must not share a queue with another reader).
pub const HANDOVER_QUEUE: &str = "provisioner-handovers";
/// A third such queue, for a second reader in the same test process.
pub const HANDOVER_QUEUE_2: &str = "provisioner-handovers-2";
/// How late the server answers a RunInstances for a machine one of whose instances it
/// interrupted (a replacement): the instance is made, running, at once; the answer comes this
/// much later, as an EC2 call slow to answer. A replacement thus runs at least this long before
/// its provisioner can know of it and stop the interrupted instance.
pub const SLOW_REPLACEMENTS: Duration = Duration::from_millis(1500);
/// The visibility timeout of [`HANDOVER_QUEUE`] and [`HANDOVER_QUEUE_2`]: a notice read and
/// not deleted (its reader killed) is delivered again this soon.
pub const HANDOVER_QUEUE_VISIBILITY: Duration = Duration::from_secs(2);
/// The tag whose value (seconds) makes the server interrupt the tagged instance: the warning on
/// [`INTERRUPTION_QUEUE`] now, the termination that many seconds later.
pub const INTERRUPT_TAG: &str = "provisioner-test-interrupt";

/// The tag whose value `true` makes the server report the tagged instance's status checks
/// `impaired` (`false`: `ok` again), issue 34.
pub const IMPAIR_TAG: &str = "provisioner-test-impair";

/// An image moto knows.
pub const IMAGE: &str = "ami-1e749f67";
/// The model whose starts into us-east-1a fail with InsufficientInstanceCapacity.
pub const CAPACITY_MODEL: &str = "model-capacity";
/// The model whose starts of t3.large into us-east-1a fail with InsufficientInstanceCapacity.
pub const TYPE_CAPACITY_MODEL: &str = "model-type-capacity";
/// The model whose starts of t3.large into us-east-1a fail with InsufficientInstanceCapacity
/// and whose first two RunInstances calls per machine that take effect lose their answer.
pub const TYPE_LOSSY_MODEL: &str = "model-type-lossy";
/// The model whose first four RunInstances calls per machine take effect and lose their answer.
pub const LOSSY_MODEL: &str = "model-lossy";
/// The model whose starts into us-east-1a fail with InsufficientInstanceCapacity (batched-start
/// tests: their own model, so that the counts of the engine's tests stay theirs).
pub const BATCH_CAPACITY_MODEL: &str = "model-batch-capacity";
/// The model whose starts of t3.large into us-east-1a fail with InsufficientInstanceCapacity
/// (batched-start tests).
pub const BATCH_TYPE_MODEL: &str = "model-batch-types";
/// The model that has no spot capacity anywhere: its spot starts fail with
/// InsufficientInstanceCapacity in every zone and type (on-demand starts go through).
pub const NO_SPOT_MODEL: &str = "model-no-spot";
/// The model whose RunInstances calls launch at most two instances (a partial launch).
pub const PARTIAL_MODEL: &str = "model-partial";
/// A start nonce containing this makes the first two CreateTags of its instance fail with
/// InvalidInstanceID.NotFound (EC2 not seeing a new instance yet).
pub const TAGS_LAG: &str = "tags-lag";
/// A start nonce containing this makes the first five CreateTags of its instance fail so.
pub const TAGS_FAIL: &str = "tags-fail";
/// A start nonce containing this makes the first four CreateTags of its instance fail so.
pub const TAGS_FAIL_REPEAT: &str = "tags-repeat";
/// The same fault for the engine's test (its own count): the host tag of its nonces.
pub const TAGS_FAIL_ENGINE: &str = "tags-engine";

/// `MOTO_INTERRUPTION_QUEUE`: every queue the server's rule delivers notices to.
fn interruption_queues() -> String {
    let visibility = HANDOVER_QUEUE_VISIBILITY.as_secs();
    format!("{INTERRUPTION_QUEUE},{HANDOVER_QUEUE}:{visibility},{HANDOVER_QUEUE_2}:{visibility}")
}

/// The virtualenv's python, installed once per test run.
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(root.join(".ci/moto-venv"))
            .current_dir(root)
            .output()
            .expect(".ci/moto-venv runs (needs python3 with venv and access to PyPI)");
        assert!(out.status.success(), ".ci/moto-venv failed: {}", String::from_utf8_lossy(&out.stderr));
        let path = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        // Credentials for the standard AWS chain; moto accepts any.
        for (k, v) in
            [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_REGION", "us-east-1")]
        {
            std::env::set_var(k, v);
        }
        root.join(path)
    })
}

/// The moto EC2 server on a free loopback port (it exits with this process).
pub struct Moto {
    _child: Child,
    /// `http://127.0.0.1:PORT`, the EC2 endpoint to give a broker or `serve --ec2-endpoint`.
    pub endpoint: String,
}

impl Moto {
    /// The server of this test process (started by the first caller), with the faults of the
    /// models and nonces named by this module's constants.
    pub fn shared() -> &'static Moto {
        static MOTO: OnceLock<Moto> = OnceLock::new();
        MOTO.get_or_init(|| {
            Moto::start(
                &[&format!("{CAPACITY_MODEL}:us-east-1a"), &format!("{BATCH_CAPACITY_MODEL}:us-east-1a")],
                &[&format!("{LOSSY_MODEL}:4"), &format!("{TYPE_LOSSY_MODEL}:2")],
                &[
                    &format!("{TYPE_CAPACITY_MODEL}:t3.large:us-east-1a"),
                    &format!("{TYPE_LOSSY_MODEL}:t3.large:us-east-1a"),
                    &format!("{BATCH_TYPE_MODEL}:t3.large:us-east-1a"),
                ],
                &[&format!("{PARTIAL_MODEL}:2")],
                &[&format!("{NO_SPOT_MODEL}:*:*")],
                &[
                    &format!("{TAGS_LAG}:2"),
                    &format!("{TAGS_FAIL}:5"),
                    &format!("{TAGS_FAIL_ENGINE}:5"),
                    &format!("{TAGS_FAIL_REPEAT}:4"),
                ],
            )
        })
    }

    // Runs once, before the calling test has started any actor: waiting for the server to
    // listen may block this thread.
    #[allow(clippy::disallowed_methods)]
    fn start(
        fail_zones: &[&str],
        lose: &[&str],
        fail_types: &[&str],
        partial: &[&str],
        fail_spot: &[&str],
        fail_tags: &[&str],
    ) -> Moto {
        let python = python();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(python)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ec2/moto_server.py"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("MOTO_FAIL_ZONES", fail_zones.join(","))
            .env("MOTO_LOSE_RESPONSES", lose.join(","))
            .env("MOTO_FAIL_TYPES", fail_types.join(","))
            .env("MOTO_PARTIAL", partial.join(","))
            .env("MOTO_FAIL_SPOT", fail_spot.join(","))
            .env("MOTO_INTERRUPTION_QUEUE", interruption_queues())
            .env("MOTO_SLOW_REPLACEMENTS", SLOW_REPLACEMENTS.as_secs_f64().to_string())
            .env("MOTO_FAIL_TAGS", fail_tags.join(","))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto server starts");
        let moto = Moto { _child: child, endpoint: format!("http://127.0.0.1:{port}") };
        for _ in 0..300 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return moto;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("moto server did not listen on {port} within 30 s");
    }

    /// The URL of [`INTERRUPTION_QUEUE`] on this server.
    pub fn interruption_queue(&self) -> String {
        self.queue_url(INTERRUPTION_QUEUE)
    }

    /// The URL of the queue `name` on this server ([`INTERRUPTION_QUEUE`], [`HANDOVER_QUEUE`],
    /// [`HANDOVER_QUEUE_2`]).
    pub fn queue_url(&self, name: &str) -> String {
        format!("{}/123456789012/{name}", self.endpoint)
    }

    /// An SQS client for this server's queues (us-east-1).
    pub async fn sqs(&self) -> aws_sdk_sqs::Client {
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .endpoint_url(self.endpoint.clone())
            .load()
            .await;
        aws_sdk_sqs::Client::new(&sdk)
    }

    /// How many messages the queue `name` holds, visible or in flight (read, not deleted).
    pub async fn queue_depth(&self, name: &str) -> u64 {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let out = self
            .sqs()
            .await
            .get_queue_attributes()
            .queue_url(self.queue_url(name))
            .attribute_names(A::ApproximateNumberOfMessages)
            .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .expect("GetQueueAttributes");
        let attrs = out.attributes().cloned().unwrap_or_default();
        [A::ApproximateNumberOfMessages, A::ApproximateNumberOfMessagesNotVisible]
            .iter()
            .map(|a| attrs.get(a).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0))
            .sum()
    }

    /// A broker for `model` on this server (us-east-1, [`IMAGE`], t3.micro).
    pub async fn broker(&self, model: &str) -> Ec2Broker {
        self.broker_with(model, |_| {}).await
    }

    /// A broker whose configuration `adjust` changes first.
    pub async fn broker_with(&self, model: &str, adjust: impl FnOnce(&mut Ec2Config)) -> Ec2Broker {
        let mut config = Ec2Config {
            model_uuid: model.into(),
            region: Some("us-east-1".into()),
            endpoint: Some(self.endpoint.clone()),
            image_id: IMAGE.into(),
            instance_type: Some("t3.micro".into()),
            ..Ec2Config::default()
        };
        adjust(&mut config);
        Ec2Broker::connect(config).await.expect("connects")
    }
}
