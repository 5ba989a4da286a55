//! [`LxdBroker`]: the calls themselves.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use hyper::Method;
use serde_json::{json, Value};

use super::client::{Answer, CallError, LxdClient};
use super::config::{LxdConfig, LxdConfigError};
use super::errors::{already_exists, busy, classify, not_found};
use super::shape::{instance_config, instance_name, shape, state_of, tags_of, RootPool, Shape, KEY_INSTANCE_TYPE};
use super::shape::{KEY_HOST, KEY_MACHINE, KEY_MODEL, KEY_START};
use crate::model::{CloudInstance, InstanceId, InstanceState, InstanceTags};
use crate::ports::{AvailabilityZone, Broker, BrokerError, BrokerFuture, StartInstanceParams, StartedInstance};

/// How many instances one `stop_instances` or `release_instances` works on at once.
const CONCURRENCY: usize = 8;

/// The wait between two tries of a call LXD refused because another operation held the
/// instance (a start right behind its create).
const BUSY_RETRY: Duration = Duration::from_millis(200);

/// The placement of a host's containers (`lxd-host=MACHINE`): the container goes to the
/// member its host machine's instance is on (see [`OnHost`]).
pub const HOST_PLACEMENT: &str = "lxd-host=";

/// A broker for the containers of one host machine (`H/lxd/N`): every start is placed on the
/// member where the host's own instance runs (`lxd-host=H`), and the container carries its
/// host in [`KEY_HOST`](super::shape::KEY_HOST). Wraps the model's broker (whatever decorates
/// it: the placement travels in the start's parameters, so a start repeated after a restart
/// goes to the same member).
pub struct OnHost {
    inner: Arc<dyn Broker>,
    host: crate::model::MachineId,
}

impl OnHost {
    /// Containers of `host`, started through `inner`.
    pub fn new(inner: Arc<dyn Broker>, host: crate::model::MachineId) -> Self {
        Self { inner, host }
    }
}

impl Broker for OnHost {
    fn start_instance(&self, mut params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        params.placement = Some(format!("{HOST_PLACEMENT}{}", self.host));
        self.inner.start_instance(params)
    }
    crate::forward_broker!(inner: pace_follow_ups, stop_instances, all_instances, supports_zones, zones_change, availability_zones, retag_instance, release_instances, supports_interruptions, interruption_notices, acknowledge_notices, impaired_instances, current_image, capacity_short);
}

/// What the broker learnt of the daemon when it connected.
#[derive(Debug, Clone)]
struct Daemon {
    /// The server's name (a standalone daemon's one zone).
    server_name: String,
    /// Whether it is a cluster member (then the members are the zones).
    clustered: bool,
    /// Its architecture (LXD's name), for a standalone daemon's `arch=` checks.
    arch: String,
    /// Where root disks come from.
    pool: RootPool,
}

/// One cluster member as a zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The member's name (`target=`).
    pub name: String,
    /// Its zone: its failure domain, or its name when it has none (`default`).
    pub zone: String,
    /// Whether LXD sees it online.
    pub online: bool,
    /// Its architecture, when LXD says.
    pub arch: Option<String>,
}

impl Member {
    /// A member from LXD's `GET /1.0/cluster/members?recursion=1` entry.
    pub fn from_api(v: &Value) -> Option<Self> {
        let name = v.get("server_name")?.as_str()?.to_owned();
        let domain = v.get("failure_domain").and_then(Value::as_str).unwrap_or_default();
        let zone = if domain.is_empty() || domain == "default" { name.clone() } else { domain.to_owned() };
        let online = v.get("status").and_then(Value::as_str) == Some("Online");
        let arch = v.get("architecture").and_then(Value::as_str).filter(|a| !a.is_empty()).map(str::to_owned);
        Some(Self { name, zone, online, arch })
    }
}

/// The member a start in `zone` goes to: its online members' one picked by `name` (the
/// instance's name, so a repeated call goes where the first one went); `None` when the zone
/// has no online member.
pub fn member_for<'a>(members: &'a [Member], zone: &str, name: &str) -> Option<&'a Member> {
    let online: Vec<&Member> = members.iter().filter(|m| m.zone == zone && m.online).collect();
    if online.is_empty() {
        return None;
    }
    let hash = name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let index = usize::try_from(hash % online.len() as u64).unwrap_or(0);
    online.get(index).copied()
}

/// A [`Broker`] over LXD.
#[derive(Clone)]
pub struct LxdBroker {
    inner: Arc<Inner>,
}

struct Inner {
    client: LxdClient,
    config: LxdConfig,
    daemon: Daemon,
}

impl std::fmt::Debug for LxdBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LxdBroker")
            .field("endpoint", &self.inner.config.endpoint.to_string())
            .field("server", &self.inner.daemon.server_name)
            .field("clustered", &self.inner.daemon.clustered)
            .finish()
    }
}

/// The wall clock, to age instances from their `created_at` (a wall-clock timestamp): an
/// instance's age is not a matter of the provisioner's own (possibly paused) clock.
#[allow(clippy::disallowed_methods)]
fn wall_clock() -> SystemTime {
    SystemTime::now()
}

impl LxdBroker {
    /// Connects and checks the settings against the daemon: reachable, the client trusted,
    /// the project and the image alias there; reads the server's name, whether it is a
    /// cluster, its architecture and the default profile's root pool. Each failure names the
    /// setting to fix.
    pub async fn connect(config: LxdConfig) -> Result<Self, LxdConfigError> {
        config.validate()?;
        let client = LxdClient::new(&config.endpoint, &config.tls, config.call_timeout)?;
        let endpoint = config.endpoint.to_string();
        let server = client.get("/1.0").await.map_err(|source| match source {
            CallError::Api { .. } | CallError::Operation(_) => LxdConfigError::Setup { what: "the server", source },
            CallError::Handshake(_) => LxdConfigError::Handshake { endpoint: endpoint.clone(), source },
            source => LxdConfigError::Unreachable { endpoint: endpoint.clone(), source },
        })?;
        if server.get("auth").and_then(Value::as_str) != Some("trusted") {
            return Err(LxdConfigError::Untrusted { endpoint });
        }
        let env = server.get("environment").cloned().unwrap_or(Value::Null);
        let server_name = env.get("server_name").and_then(Value::as_str).unwrap_or("lxd").to_owned();
        let clustered = env.get("server_clustered").and_then(Value::as_bool).unwrap_or(false);
        let arch = env
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let project = &config.project;
        client.get(&format!("/1.0/projects/{project}")).await.map_err(|source| match source.lxd_message() {
            Some(m) if not_found(&source) => {
                LxdConfigError::UnknownProject { project: project.clone(), message: m.into() }
            }
            _ => LxdConfigError::Setup { what: "the project", source },
        })?;
        let alias = &config.image;
        client.get(&format!("/1.0/images/aliases/{alias}?project={project}")).await.map_err(|source| {
            match source.lxd_message() {
                Some(m) if not_found(&source) => {
                    LxdConfigError::UnknownImage { alias: alias.clone(), message: m.into() }
                }
                _ => LxdConfigError::Setup { what: "the image alias", source },
            }
        })?;
        let profile = client
            .get(&format!("/1.0/profiles/default?project={project}"))
            .await
            .map_err(|source| LxdConfigError::Setup { what: "the default profile", source })?;
        let pool_name = profile.pointer("/devices/root/pool").and_then(Value::as_str).unwrap_or_default().to_owned();
        let driver = if pool_name.is_empty() {
            String::new()
        } else {
            let pool = client
                .get(&format!("/1.0/storage-pools/{pool_name}"))
                .await
                .map_err(|source| LxdConfigError::Setup { what: "the root disk's storage pool", source })?;
            pool.get("driver").and_then(Value::as_str).unwrap_or_default().to_owned()
        };
        let daemon = Daemon { server_name, clustered, arch, pool: RootPool { name: pool_name, driver } };
        Ok(Self { inner: Arc::new(Inner { client, config, daemon }) })
    }

    /// The model this broker serves.
    pub fn model_uuid(&self) -> &str {
        &self.inner.config.model_uuid
    }

    /// The cluster's members as zones (empty for a standalone daemon).
    pub async fn members(&self) -> Result<Vec<Member>, BrokerError> {
        self.inner.members().await.map_err(|e| classify(&e, "list cluster members", None))
    }
}

impl Inner {
    fn project(&self) -> &str {
        &self.config.project
    }

    async fn members(&self) -> Result<Vec<Member>, CallError> {
        if !self.daemon.clustered {
            return Ok(Vec::new());
        }
        let list = self.client.get("/1.0/cluster/members?recursion=1").await?;
        let mut members: Vec<Member> = list.as_array().into_iter().flatten().filter_map(Member::from_api).collect();
        members.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(members)
    }

    /// An asynchronous call, waited on: its operation's metadata.
    async fn operate(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, CallError> {
        match self.client.call(method, path, body).await? {
            Answer::Sync(v) => Ok(v),
            Answer::Async(id) => self.client.wait(&id, self.project(), self.config.operation_timeout).await,
        }
    }

    fn instance_path(&self, name: &str, rest: &str) -> String {
        format!("/1.0/instances/{name}{rest}?project={}", self.project())
    }

    /// One instance's record, `None` when it is not there.
    async fn instance(&self, name: &str) -> Result<Option<Value>, CallError> {
        match self.client.get(&self.instance_path(name, "")).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Changes the state of `name` (`start`, or `stop` with force), waiting for it; a state
    /// it is in already is success, and an operation that holds the instance is waited out.
    async fn set_state(&self, name: &str, action: &str) -> Result<(), CallError> {
        let body = json!({"action": action, "force": action == "stop", "timeout": -1});
        let path = self.instance_path(name, "/state");
        let began = actix_rt::time::Instant::now();
        loop {
            match self.operate(Method::PUT, &path, Some(&body)).await {
                Ok(_) => return Ok(()),
                Err(e) if e.lxd_message().is_some_and(|m| m.contains("already running")) && action == "start" => {
                    return Ok(())
                }
                Err(e)
                    if e.lxd_message().is_some_and(|m| m.contains("already stopped") || m.contains("not running"))
                        && action == "stop" =>
                {
                    return Ok(())
                }
                Err(e) if busy(&e) && began.elapsed() < self.config.operation_timeout => {
                    actix_rt::time::sleep(BUSY_RETRY).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The member a start in `zone` goes to, checked against the shape's architecture;
    /// `None` on a standalone daemon.
    async fn target(&self, zone: Option<&str>, name: &str, shape: &Shape) -> Result<Option<Member>, BrokerError> {
        if !self.daemon.clustered {
            if let Some(z) = zone.filter(|z| *z != self.daemon.server_name) {
                return Err(BrokerError::zone_specific(format!(
                    "LXD: no zone {z:?}: the standalone daemon's one zone is {:?}",
                    self.daemon.server_name
                )));
            }
            if let Some(a) = shape.arch.filter(|a| !self.daemon.arch.is_empty() && *a != self.daemon.arch) {
                return Err(BrokerError::zone_independent(format!(
                    "arch cannot be met: the LXD server {} is {}, not {a}",
                    self.daemon.server_name, self.daemon.arch
                )));
            }
            return Ok(None);
        }
        let members = self.members().await.map_err(|e| classify(&e, "list cluster members", None))?;
        let Some(zone) = zone else {
            return Err(BrokerError::zone_independent("LXD cluster: a start needs a zone (a member)"));
        };
        let member = member_for(&members, zone, name)
            .ok_or_else(|| BrokerError::zone_specific(format!("LXD cluster: no online member in zone {zone:?}")))?;
        if let (Some(want), Some(has)) = (shape.arch, member.arch.as_deref()) {
            if want != has {
                return Err(BrokerError::zone_specific(format!(
                    "arch cannot be met in zone {zone:?}: member {} is {has}, not {want}",
                    member.name
                )));
            }
        }
        Ok(Some(member.clone()))
    }

    /// The member where host machine `host`'s instance is (`None` on a standalone daemon):
    /// a host without a running instance of ours cannot take containers yet.
    async fn host_member(&self, host: &str) -> Result<Option<Member>, BrokerError> {
        let all = self.list().await.map_err(|e| classify(&e, "list instances", None))?;
        let Some(on) = all.iter().find(|i| i.tags.machine.as_ref().is_some_and(|m| m.as_str() == host)) else {
            return Err(BrokerError::zone_independent(format!("LXD: host machine {host} has no instance yet")));
        };
        if on.state != InstanceState::Running {
            return Err(BrokerError::zone_independent(format!(
                "LXD: host machine {host}'s instance {} is {}, not running",
                on.id, on.state
            )));
        }
        if !self.daemon.clustered {
            return Ok(None);
        }
        let location = self
            .instance(on.id.as_str())
            .await
            .map_err(|e| classify(&e, "look up the host", None))?
            .and_then(|i| i.get("location").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_default();
        let members = self.members().await.map_err(|e| classify(&e, "list cluster members", None))?;
        match members.into_iter().find(|m| m.name == location) {
            Some(m) if m.online => Ok(Some(m)),
            Some(m) => Err(BrokerError::zone_specific(format!("LXD: host {host}'s member {} is offline", m.name))),
            None => Err(BrokerError::zone_independent(format!("LXD: host {host}'s member {location:?} is unknown"))),
        }
    }

    async fn start(&self, params: StartInstanceParams) -> Result<StartedInstance, BrokerError> {
        let shape = shape(&params.constraints, &self.daemon.pool).map_err(BrokerError::zone_independent)?;
        let name = instance_name(&self.config.model_uuid, &params.machine, &params.client_token);
        let host = params.placement.as_deref().and_then(|p| p.strip_prefix(HOST_PLACEMENT));
        let target = match host {
            Some(h) => self.host_member(h).await?,
            None => self.target(params.zone.as_deref(), &name, &shape).await?,
        };
        let member = target.as_ref().map(|m| m.name.as_str());
        let mut body = json!({
            "name": name,
            "type": "container",
            "source": {"type": "image", "alias": self.config.image},
            "config": instance_config(&shape, &params.tags, &params.extra_tags),
        });
        if let Some(h) = host {
            body["config"][KEY_HOST] = json!(h);
        }
        if let Some(disk) = &shape.root_disk {
            body["devices"] = json!({"root": disk});
        }
        let mut path = format!("/1.0/instances?project={}", self.project());
        if let Some(m) = member {
            path.push_str("&target=");
            path.push_str(m);
        }
        match self.operate(Method::POST, &path, Some(&body)).await {
            Ok(_) => {}
            // A repeat of a call that made it (or is making it): ours to finish if it is this
            // machine's.
            Err(e) if already_exists(&e) => self.check_ours(&name, &params).await?,
            Err(e) => return Err(classify(&e, &format!("create {name}"), member)),
        }
        if let Err(e) = self.set_state(&name, "start").await {
            let err = classify(&e, &format!("start {name}"), member);
            if !err.is_ambiguous() {
                // A definite refusal: the container would never run. It goes, so that the next
                // try (a new name) leaves nothing behind.
                let _ = self.remove(&name).await;
            }
            return Err(err);
        }
        let instance = CloudInstance {
            id: InstanceId::new(name.clone()),
            state: InstanceState::Running,
            zone: params.zone.clone(),
            tags: params.tags.clone(),
            age: None,
            instance_type: shape.instance_type.clone(),
            capacity_type: None,
            // The listing says (the fingerprint LXD records at the create).
            image: None,
        };
        Ok(StartedInstance { instance, display_name: name })
    }

    /// The instance `name` a repeated create met: this machine's (ours to start), or an error.
    async fn check_ours(&self, name: &str, params: &StartInstanceParams) -> Result<(), BrokerError> {
        // A create still under way shows the instance at once; one that failed leaves none.
        let found = self.instance(name).await.map_err(|e| classify(&e, &format!("look up {name}"), None))?;
        let Some(found) = found else {
            return Err(BrokerError::transient(format!("LXD create {name}: a create under way did not make it")));
        };
        let tags = tags_of(found.get("config").unwrap_or(&Value::Null));
        if tags.model.as_deref() != Some(self.config.model_uuid.as_str())
            || tags.machine.as_ref() != Some(&params.machine)
        {
            return Err(BrokerError::zone_independent(format!(
                "LXD: the instance name {name} is taken by an instance that is not machine {}'s",
                params.machine
            )));
        }
        Ok(())
    }

    /// Stops and deletes `name` if it is ours; gone already is success; another's is left; an
    /// operation that holds it is waited out (up to the operation timeout).
    async fn remove(&self, name: &str) -> Result<(), CallError> {
        let Some(found) = self.instance(name).await? else { return Ok(()) };
        let tags = tags_of(found.get("config").unwrap_or(&Value::Null));
        if tags.model.as_deref() != Some(self.config.model_uuid.as_str()) {
            tracing::warn!(instance = name, "not stopping an instance that does not carry this model's keys");
            return Ok(());
        }
        if found.get("status").and_then(Value::as_str) != Some("Stopped") {
            match self.set_state(name, "stop").await {
                Err(e) if not_found(&e) => return Ok(()),
                other => other?,
            }
        }
        // An operation that holds the instance (a create a frozen member finishes late) is
        // waited out, as for a change of state.
        let began = actix_rt::time::Instant::now();
        loop {
            match self.operate(Method::DELETE, &self.instance_path(name, ""), None).await {
                Err(e) if not_found(&e) => return Ok(()),
                Err(e) if busy(&e) && began.elapsed() < self.config.operation_timeout => {
                    actix_rt::time::sleep(BUSY_RETRY).await;
                }
                other => return other.map(|_| ()),
            }
        }
    }

    /// Sets (or, with an empty value, removes) config keys of `name` if it is ours.
    async fn set_keys(&self, name: &str, keys: Value) -> Result<bool, CallError> {
        let Some(found) = self.instance(name).await? else { return Ok(false) };
        let tags = tags_of(found.get("config").unwrap_or(&Value::Null));
        if tags.model.as_deref() != Some(self.config.model_uuid.as_str()) {
            return Ok(false);
        }
        self.client.call(Method::PATCH, &self.instance_path(name, ""), Some(&json!({"config": keys}))).await?;
        Ok(true)
    }

    async fn list(&self) -> Result<Vec<CloudInstance>, CallError> {
        let members = self.members().await?;
        let zone_of: BTreeMap<&str, &str> = members.iter().map(|m| (m.name.as_str(), m.zone.as_str())).collect();
        let all = self.client.get(&format!("/1.0/instances?recursion=1&project={}", self.project())).await?;
        let now = wall_clock();
        let mut out = Vec::new();
        let mut unstarted = Vec::new();
        for i in all.as_array().into_iter().flatten() {
            let config = i.get("config").unwrap_or(&Value::Null);
            let tags = tags_of(config);
            if tags.model.as_deref() != Some(self.config.model_uuid.as_str()) {
                continue;
            }
            let Some(name) = i.get("name").and_then(Value::as_str) else { continue };
            let status = i.get("status").and_then(Value::as_str).unwrap_or_default();
            let state = state_of(status, config);
            let location = i.get("location").and_then(Value::as_str).unwrap_or_default();
            let zone = if self.daemon.clustered {
                zone_of.get(location).map(|z| (*z).to_owned()).or_else(|| Some(location.to_owned()))
            } else {
                Some(self.daemon.server_name.clone())
            };
            let age = i
                .get("created_at")
                .and_then(Value::as_str)
                .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
                .map(|created| now.duration_since(created).unwrap_or(Duration::ZERO));
            // Created and never started, long after its start should have followed: the start
            // of a provisioner that stopped in between. Ours to finish.
            if state == InstanceState::Pending
                && status == "Stopped"
                && age.is_some_and(|a| a > self.config.operation_timeout * 2)
            {
                unstarted.push(name.to_owned());
            }
            let instance_type = config.get(KEY_INSTANCE_TYPE).and_then(Value::as_str).map(str::to_owned);
            let image = config.get("volatile.base_image").and_then(Value::as_str).map(str::to_owned);
            out.push(CloudInstance {
                id: InstanceId::new(name),
                state,
                zone,
                tags,
                age,
                instance_type,
                capacity_type: None,
                image,
            });
        }
        for name in unstarted {
            tracing::info!(instance = %name, "starting a container whose start a previous run left undone");
            let path = self.instance_path(&name, "/state");
            // Not waited on: the next listing shows how it went.
            let _ = self.client.call(Method::PUT, &path, Some(&json!({"action": "start"}))).await;
        }
        out.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        Ok(out)
    }
}

impl Broker for LxdBroker {
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        // LXD has no spot capacity: a spot call is refused wherever (issue 33).
        if !params.capacity.is_on_demand() {
            return Box::pin(async { Err(BrokerError::no_spot()) });
        }
        let inner = self.inner.clone();
        Box::pin(async move { inner.start(params).await })
    }

    fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let results: Vec<Result<(), BrokerError>> =
                futures::stream::iter(ids)
                    .map(|id| {
                        let inner = inner.clone();
                        async move {
                            inner.remove(id.as_str()).await.map_err(|e| classify(&e, &format!("remove {id}"), None))
                        }
                    })
                    .buffer_unordered(CONCURRENCY)
                    .collect()
                    .await;
            results.into_iter().collect()
        })
    }

    fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
        let inner = self.inner.clone();
        Box::pin(async move { inner.list().await.map_err(|e| classify(&e, "list instances", None)) })
    }

    /// The fingerprint the configured alias names now (`volatile.base_image` of a container
    /// created from it): pointing the alias at a newer image makes every older container drift.
    fn current_image(&self) -> BrokerFuture<Option<String>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let path = format!("/1.0/images/aliases/{}?project={}", inner.config.image, inner.project());
            let alias = inner.client.get(&path).await.map_err(|e| classify(&e, "read the image alias", None))?;
            Ok(alias.get("target").and_then(Value::as_str).map(str::to_owned))
        })
    }

    fn supports_zones(&self) -> bool {
        true
    }

    fn availability_zones(&self) -> BrokerFuture<Vec<AvailabilityZone>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            if !inner.daemon.clustered {
                return Ok(vec![AvailabilityZone::available(inner.daemon.server_name.clone())]);
            }
            let members = inner.members().await.map_err(|e| classify(&e, "list cluster members", None))?;
            let mut zones: BTreeMap<String, bool> = BTreeMap::new();
            for m in members {
                *zones.entry(m.zone).or_default() |= m.online;
            }
            Ok(zones.into_iter().map(|(name, available)| AvailabilityZone { name, available }).collect())
        })
    }

    fn derive_availability_zones(&self, params: &StartInstanceParams) -> BrokerFuture<Vec<String>> {
        let zone = params.placement.as_deref().and_then(|p| p.strip_prefix("zone=")).map(str::to_owned);
        Box::pin(async move { Ok(zone.into_iter().collect()) })
    }

    fn retag_instance(&self, id: InstanceId, tags: InstanceTags) -> BrokerFuture<()> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let keys = json!({
                KEY_MACHINE: tags.machine.as_ref().map(|m| m.as_str()).unwrap_or_default(),
                KEY_START: tags.start.as_deref().unwrap_or_default(),
            });
            match inner.set_keys(id.as_str(), keys).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(BrokerError::zone_independent(format!("LXD: instance {id} is not this model's"))),
                Err(e) => Err(classify(&e, &format!("retag {id}"), None)),
            }
        })
    }

    fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let results: Vec<Result<(), BrokerError>> = futures::stream::iter(ids)
                .map(|id| {
                    let inner = inner.clone();
                    async move {
                        inner
                            .set_keys(id.as_str(), json!({KEY_MODEL: ""}))
                            .await
                            .map(|_| ())
                            .map_err(|e| classify(&e, &format!("release {id}"), None))
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
            results.into_iter().collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, zone: &str, online: bool) -> Member {
        Member { name: name.into(), zone: zone.into(), online, arch: Some("x86_64".into()) }
    }

    #[test]
    fn members_are_zones_by_failure_domain_else_name() {
        let m =
            Member::from_api(&json!({"server_name": "m1", "failure_domain": "default", "status": "Online"})).unwrap();
        assert_eq!((m.zone.as_str(), m.online), ("m1", true));
        let m =
            Member::from_api(&json!({"server_name": "m2", "failure_domain": "rack-2", "status": "Offline"})).unwrap();
        assert_eq!((m.zone.as_str(), m.online), ("rack-2", false));
    }

    #[test]
    fn a_start_goes_to_an_online_member_of_its_zone_the_same_for_the_same_name() {
        let members = [member("m1", "a", true), member("m2", "a", true), member("m3", "b", false)];
        let first = member_for(&members, "a", "prov-x").unwrap().name.clone();
        assert_eq!(member_for(&members, "a", "prov-x").unwrap().name, first);
        assert!(member_for(&members, "b", "prov-x").is_none(), "no online member in b");
        assert!(member_for(&members, "c", "prov-x").is_none());
        let spread: std::collections::BTreeSet<String> =
            (0..20).map(|i| member_for(&members, "a", &format!("prov-{i}")).unwrap().name.clone()).collect();
        assert_eq!(spread.len(), 2, "names spread over the zone's members");
    }

    #[test]
    fn lxd_timestamps_parse() {
        assert!(humantime::parse_rfc3339_weak("2026-12-06T08:26:56.993017192Z").is_ok());
    }
}
