//! [`Ec2Broker`]: the calls themselves.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::Addr;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::operation::run_instances::RunInstancesOutput;
use aws_sdk_ec2::types::{
    ArchitectureType, AvailabilityZoneState, BlockDeviceMapping, EbsBlockDevice, Filter, Instance,
    InstanceInterruptionBehavior, InstanceLifecycleType, InstanceMarketOptionsRequest, InstanceStateName, InstanceType,
    MarketType, Placement, ResourceType, SpotInstanceType, SpotMarketOptions, Tag, TagSpecification,
};
use aws_sdk_ec2::Client;
use futures::StreamExt;

use super::config::{Ec2Config, Ec2ConfigError, DEFAULT_CAPACITY_MEMORY, DEFAULT_TYPES_PER_ZONE};
use super::errors::{classify, is_throttling};
use super::interruptions::{InterruptionQueue, MAX_WAIT};
use super::memory::{
    Attempt, Attempted, BrokerMemory, GetPacer, OrderTypes, ReadCatalogue, ReadRootDevice, RememberUntagged, SetPacer,
    TakeUntagged, Untagged,
};
use crate::config::rate_limits::ApiClass;
use crate::model::instance_types::{self, has_hardware_constraint, TypeAttempt};
use crate::model::{
    CapacityType, CloudInstance, Constraints, InstanceId, InstanceState, InstanceTags, MachineId, UsdPerHour,
};
use crate::ports::{
    AvailabilityZone, BatchMember, BatchStartParams, BatchStarted, Broker, BrokerError, BrokerFuture,
    InterruptionNotice, Pacer, StartInstanceParams, StartedInstance,
};

/// Tag key carrying the model's uuid: the provisioner's identity on an instance.
pub const TAG_MODEL: &str = "provisioner-model";
/// Tag key carrying the machine id the instance was started for.
pub const TAG_MACHINE: &str = "provisioner-machine";
/// Tag key carrying the start's nonce.
pub const TAG_START: &str = "provisioner-start";
/// Tag key carrying the provisioner's token of the batched start that launched the instance
/// (every instance of one batched `RunInstances` carries it, with its `AmiLaunchIndex`).
pub const TAG_BATCH: &str = "provisioner-batch";

/// Tag keys `provisioner-batch-members-0`, `-1`, ...: the machines of a batched start in launch
/// order, comma-separated, over as many tags as 256-character values need. Set at launch (in
/// `TagSpecifications`, so in the same call as the instances), they tell whose each instance
/// is by its `AmiLaunchIndex` until its own machine tag is set: an instance whose `CreateTags`
/// never happened (a crash right after `RunInstances`) is still listed as its machine's, and
/// adopted, rather than left running as nobody's.
pub const TAG_BATCH_MEMBERS: &str = "provisioner-batch-members";

/// The identity tag keys, which neither the model's tags nor a `tags=` constraint may set.
const RESERVED_TAGS: [&str; 4] = [TAG_MODEL, TAG_MACHINE, TAG_START, TAG_BATCH];

/// The prefix of every tag key of ours: the model's tags and `tags=` constraints may set none.
const RESERVED_PREFIX: &str = "provisioner-";

/// Most `provisioner-batch-members-K` tags on one instance (EC2 allows 50 tags in all); a batch
/// whose machine ids need more is launched without them (each instance then depends on its
/// `CreateTags`, as before).
const MAX_MEMBER_TAGS: usize = 16;

/// The member tags of a batch of `machines` (launch order), or `None` when they would need
/// more than [`MAX_MEMBER_TAGS`] tags.
pub(super) fn member_tags(machines: &[MachineId]) -> Option<Vec<Tag>> {
    let mut values: Vec<String> = vec![String::new()];
    for m in machines {
        let id = m.as_str();
        let last = values.last_mut()?;
        if !last.is_empty() && last.len() + 1 + id.len() > 256 {
            values.push(String::new());
        }
        let last = values.last_mut()?;
        if !last.is_empty() {
            last.push(',');
        }
        last.push_str(id);
    }
    (values.len() <= MAX_MEMBER_TAGS)
        .then(|| values.into_iter().enumerate().map(|(k, v)| tag(&format!("{TAG_BATCH_MEMBERS}-{k}"), v)).collect())
}

/// The machine a batched start launched `i` for, read from its member tags and its
/// `AmiLaunchIndex`.
fn batch_member(i: &Instance) -> Option<MachineId> {
    let index = usize::try_from(i.ami_launch_index()?).ok()?;
    let mut parts: Vec<(usize, &str)> = i
        .tags()
        .iter()
        .filter_map(|t| {
            let k = t.key()?.strip_prefix(TAG_BATCH_MEMBERS)?.strip_prefix('-')?.parse().ok()?;
            Some((k, t.value()?))
        })
        .collect();
    if parts.is_empty() {
        return None;
    }
    parts.sort_unstable();
    let joined = parts.iter().map(|(_, v)| *v).collect::<Vec<_>>().join(",");
    joined.split(',').nth(index).filter(|m| !m.is_empty()).map(MachineId::new)
}

/// How many `CreateTags` calls of one batched start are in flight at once.
const TAGGING_CONCURRENCY: usize = 8;

/// How many times the identity tags of a batched start's instance are tried before the
/// member is answered as ambiguous: EC2 is eventually consistent, and a `CreateTags` right
/// after `RunInstances` may not find the instance yet (`InvalidInstanceID.NotFound`).
const TAGGING_ATTEMPTS: u32 = 4;

/// The wait before the second tagging attempt (doubling after each).
const TAGGING_BACKOFF: Duration = Duration::from_millis(200);

/// Most instance ids one `TerminateInstances` call takes.
const TERMINATE_BATCH: usize = 1000;

/// EC2's `ClientToken` for one call of model `model`: at most 64 ASCII characters, so the
/// provisioner's token (`<machine>/<nonce>/<call>`, longer than that) and the model's uuid are
/// turned into a name-based UUID. The same model and token always give the same `ClientToken`,
/// so a repeated call is idempotent; client tokens are scoped to the account, so the model's
/// uuid keeps two models (whose machine ids and seeded nonces may coincide) apart.
pub fn client_token(model: &str, token: &str) -> String {
    let name = format!("{model}\n{token}");
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
}

/// Tag key prefix of a bare `tags=` constraint entry `NAME`: the instance gets the tag
/// `juju-tag-NAME` = `true` (an entry `KEY=VALUE` is the tag `KEY` = `VALUE`).
pub const TAG_CONSTRAINT_PREFIX: &str = "juju-tag-";

/// The root device name when the image's is not known (`DescribeImages` failed): Ubuntu's and
/// most HVM images' (Amazon Linux uses `/dev/xvda`).
pub const DEFAULT_ROOT_DEVICE: &str = "/dev/sda1";

/// A [`Broker`] over EC2.
#[derive(Clone)]
pub struct Ec2Broker {
    client: Client,
    config: Arc<Ec2Config>,
    /// What the broker learns once and remembers (the catalogue, the image's root device, the
    /// per-type capacity fail-over, the instances of batched starts not yet tagged with their
    /// machine, the pacer of its own calls): one actor's, shared by the clones.
    memory: Addr<BrokerMemory>,
    /// The origin of the fail-over's time.
    epoch: actix_rt::time::Instant,
    /// The queue of interruption notices, when one is configured.
    interruptions: Option<InterruptionQueue>,
}

/// The instance tags a `tags=` constraint asks for: `KEY=VALUE` is the tag `KEY` = `VALUE`, a
/// bare `NAME` the tag `juju-tag-NAME` = `true` (Juju's `tags=` picks MAAS nodes by tag; on
/// EC2 the instance carries them instead). The provisioner's identity keys cannot be set so.
pub fn constraint_tags(tags: &[String]) -> Vec<(String, String)> {
    tags.iter()
        .filter(|t| !t.trim().is_empty())
        .map(|t| match t.split_once('=') {
            Some((k, v)) => (k.trim().to_owned(), v.trim().to_owned()),
            None => (format!("{TAG_CONSTRAINT_PREFIX}{}", t.trim()), "true".to_owned()),
        })
        .filter(|(k, _)| !RESERVED_TAGS.contains(&k.as_str()))
        .collect()
}

/// The identity tags of an instance: the model, and the machine (with its `Name`) and start
/// when given.
pub(super) fn identity_tags(model: &str, machine: Option<&MachineId>, start: Option<&str>) -> Vec<Tag> {
    let mut set = vec![tag(TAG_MODEL, model)];
    if let Some(m) = machine {
        set.push(tag(TAG_MACHINE, m.to_string()));
        set.push(tag("Name", format!("provisioner-{m}")));
    }
    if let Some(s) = start {
        set.push(tag(TAG_START, s));
    }
    set
}

/// `tags` with the model's extra tags and the `tags=` constraint's added (never overriding a
/// key already there, never an identity key).
pub(super) fn with_shared_tags(
    mut tags: Vec<Tag>,
    extra: &BTreeMap<String, String>,
    constraints: &Constraints,
) -> Vec<Tag> {
    for (k, v) in extra {
        if !RESERVED_TAGS.contains(&k.as_str())
            && !k.starts_with(RESERVED_PREFIX)
            && !tags.iter().any(|t| t.key() == Some(k.as_str()))
        {
            tags.push(tag(k, v.clone()));
        }
    }
    for (k, v) in constraint_tags(&constraints.tags) {
        if !k.starts_with(RESERVED_PREFIX) && !tags.iter().any(|t| t.key() == Some(k.as_str())) {
            tags.push(tag(&k, v));
        }
    }
    tags
}

/// What one `RunInstances` call carries besides its instance type and client token.
struct Launch<'a> {
    zone: Option<&'a str>,
    constraints: &'a Constraints,
    placement: Option<&'a str>,
    /// The provisioner's token of the call (the type fail-over derives each type's from it).
    token: &'a str,
    /// `TagSpecifications`: what every instance of the call is tagged with.
    tags: Vec<Tag>,
    /// `MaxCount` (`MinCount` is 1).
    count: i32,
    /// Spot (`InstanceMarketOptions`) or on-demand.
    capacity: CapacityType,
    /// The spot price cap (`SpotOptions.MaxPrice`; `None`: EC2's default, the on-demand price).
    max_price: Option<UsdPerHour>,
}

/// The root volume size in GiB for `root-disk=` in MiB (rounded up).
pub fn root_disk_gib(mb: u64) -> i32 {
    i32::try_from(mb.div_ceil(1024).max(1)).unwrap_or(i32::MAX)
}

/// The subnet a `subnet=ID` placement directive names.
pub fn placement_subnet(placement: Option<&str>) -> Option<&str> {
    placement.and_then(|p| p.trim().strip_prefix("subnet=")).map(str::trim).filter(|s| !s.is_empty())
}

/// Juju's architecture name for EC2's.
fn juju_arch(a: &ArchitectureType) -> Option<&'static str> {
    match a {
        ArchitectureType::X8664 => Some("amd64"),
        ArchitectureType::Arm64 => Some("arm64"),
        ArchitectureType::I386 => Some("i386"),
        _ => None,
    }
}

impl std::fmt::Debug for Ec2Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ec2Broker").field("config", &self.config).finish_non_exhaustive()
    }
}

fn sdk_error<E>(err: SdkError<E, HttpResponse>, zone: Option<&str>) -> BrokerError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let code = err.code().map(str::to_owned);
    let message = match err.message() {
        Some(m) => m.to_owned(),
        None => DisplayErrorContext(&err).to_string(),
    };
    let server_fault = err.raw_response().is_some_and(|r| r.status().is_server_error());
    match classify(code.as_deref(), &message, zone) {
        // A 5xx answer is ambiguous whatever its code: the call may have taken effect.
        BrokerError::ZoneIndependent { message } if server_fault => BrokerError::Transient { message },
        other => other,
    }
}

/// The states of an instance that is not gone (`shutting-down` and `terminated` are gone).
fn live_states() -> Filter {
    Filter::builder()
        .name("instance-state-name")
        .values("pending")
        .values("running")
        .values("stopping")
        .values("stopped")
        .build()
}

fn tag(key: &str, value: impl Into<String>) -> Tag {
    Tag::builder().key(key).value(value).build()
}

/// Our view of one EC2 instance; `None` for one that is not ours (no model tag of ours) or
/// in a state we do not know.
pub(super) fn to_cloud_instance(i: &Instance, model: &str, now: SystemTime) -> Option<CloudInstance> {
    let id = i.instance_id()?;
    let state = match i.state().and_then(|s| s.name())? {
        InstanceStateName::Pending => InstanceState::Pending,
        InstanceStateName::Running => InstanceState::Running,
        InstanceStateName::Stopping | InstanceStateName::Stopped => InstanceState::Stopped,
        InstanceStateName::ShuttingDown | InstanceStateName::Terminated => InstanceState::Terminated,
        _ => return None,
    };
    let value = |key: &str| i.tags().iter().find(|t| t.key() == Some(key)).and_then(|t| t.value()).map(str::to_owned);
    let tags = InstanceTags {
        model: value(TAG_MODEL),
        // Its own machine tag; else, launched by a batched start whose tagging never happened,
        // the machine at its launch index.
        machine: value(TAG_MACHINE).map(MachineId::new).or_else(|| batch_member(i)),
        start: value(TAG_START),
    };
    if tags.model.as_deref() != Some(model) {
        return None;
    }
    let zone = i.placement().and_then(|p| p.availability_zone()).map(str::to_owned);
    let instance_type = i.instance_type().map(|t| t.as_str().to_owned());
    let age = i
        .launch_time()
        .and_then(|t| SystemTime::try_from(*t).ok())
        .map(|launched| now.duration_since(launched).unwrap_or(Duration::ZERO));
    let capacity_type = Some(match i.instance_lifecycle() {
        Some(InstanceLifecycleType::Spot) => CapacityType::Spot,
        _ => CapacityType::OnDemand,
    });
    let image = i.image_id().map(str::to_owned);
    Some(CloudInstance { id: InstanceId::new(id), state, zone, tags, age, instance_type, capacity_type, image })
}

/// The wall clock, to age instances from their `LaunchTime` and to count an interruption
/// warning's deadline from its event's `time` (wall-clock timestamps both). The one place the
/// library reads it: neither is a matter of the provisioner's own (possibly paused) clock.
#[allow(clippy::disallowed_methods)]
fn wall_clock() -> SystemTime {
    SystemTime::now()
}

impl Ec2Broker {
    /// Connects: loads the AWS configuration (credentials from the standard chain; region and
    /// endpoint from `config` when given). Starts the broker's memory (an actor): call it
    /// within an actix system, which the broker is used in.
    pub async fn connect(config: Ec2Config) -> Result<Self, Ec2ConfigError> {
        config.validate()?;
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &config.endpoint {
            loader = loader.endpoint_url(endpoint.clone());
        }
        let sdk = loader.load().await;
        if sdk.region().is_none() {
            return Err(Ec2ConfigError::NoRegion);
        }
        let memory = config.capacity_memory.unwrap_or(DEFAULT_CAPACITY_MEMORY);
        let interruptions = config
            .interruption_queue
            .as_ref()
            .map(|url| InterruptionQueue::new(aws_sdk_sqs::Client::new(&sdk), url.clone(), MAX_WAIT));
        Ok(Self {
            interruptions,
            client: Client::new(&sdk),
            config: Arc::new(config),
            memory: BrokerMemory::start(memory),
            epoch: actix_rt::time::Instant::now(),
        })
    }

    /// The queue of spot interruption notices, when one is configured.
    pub fn interruptions(&self) -> Option<&InterruptionQueue> {
        self.interruptions.as_ref()
    }

    /// The catalogue: every type `DescribeInstanceTypes` lists, with its architecture, vCPUs
    /// and memory, priced from the shipped table. Read once per broker (a failed read is tried
    /// again by the next start that needs it; starts that need it during a read wait for
    /// that read).
    pub async fn catalogue(&self) -> Result<Arc<Vec<instance_types::InstanceType>>, BrokerError> {
        let read = Box::pin(Self::read_catalogue(self.client.clone()));
        self.memory.send(ReadCatalogue { read }).await.map_err(|_| Self::memory_gone())?
    }

    /// The broker's memory answered nothing (its actix system is stopping).
    fn memory_gone() -> BrokerError {
        BrokerError::transient("the EC2 broker's memory is gone (its actix system stopped)")
    }

    /// `DescribeInstanceTypes`, every page: the catalogue.
    async fn read_catalogue(client: Client) -> Result<Arc<Vec<instance_types::InstanceType>>, BrokerError> {
        let mut pages = client.describe_instance_types().max_results(100).into_paginator().send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error(e, None))?;
            for t in page.instance_types() {
                let Some(name) = t.instance_type().map(|n| n.as_str().to_owned()) else { continue };
                let archs = t.processor_info().map(|p| p.supported_architectures()).unwrap_or_default();
                let Some(arch) = archs.iter().find_map(juju_arch) else { continue };
                let cores = t.v_cpu_info().and_then(|v| v.default_v_cpus()).unwrap_or(0);
                let mem_mb = t.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0);
                out.push(instance_types::InstanceType {
                    price_per_hour: instance_types::price_per_hour(&name),
                    name,
                    arch: arch.to_owned(),
                    cores: u32::try_from(cores).unwrap_or(0),
                    mem_mb: u64::try_from(mem_mb).unwrap_or(0),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Arc::new(out))
    }

    /// The image's root device name (`DescribeImages`, once), [`DEFAULT_ROOT_DEVICE`] when it
    /// cannot be read.
    async fn root_device(&self) -> String {
        let call = self.client.describe_images().image_ids(self.config.image_id.clone());
        let read = Box::pin(async move {
            let read = call.send().await;
            read.ok().and_then(|o| o.images().first().and_then(|i| i.root_device_name()).map(str::to_owned))
        });
        let known = self.memory.send(ReadRootDevice { read }).await.ok().flatten();
        known.unwrap_or_else(|| DEFAULT_ROOT_DEVICE.to_owned())
    }

    /// The types a start may use, best first, at most `types_per_zone`.
    async fn candidates(&self, constraints: &Constraints) -> Result<Vec<instance_types::InstanceType>, BrokerError> {
        let default = self.config.instance_type.as_deref();
        let mut c = match default {
            Some(t) if !has_hardware_constraint(constraints) => vec![instance_types::InstanceType::named(t)],
            _ => {
                let catalogue = self.catalogue().await?;
                instance_types::choose(constraints, &catalogue, default)
                    .map_err(|e| BrokerError::zone_independent(e.to_string()))?
            }
        };
        c.truncate(self.config.types_per_zone.unwrap_or(DEFAULT_TYPES_PER_ZONE).max(1));
        Ok(c)
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// One `RunInstances` call: `launch.count` instances of `attempt`'s type under its client
    /// token.
    async fn run(
        &self,
        launch: &Launch<'_>,
        attempt: &TypeAttempt,
        root_device: Option<&str>,
    ) -> Result<RunInstancesOutput, BrokerError> {
        let config = &self.config;
        let spec = TagSpecification::builder()
            .resource_type(ResourceType::Instance)
            .set_tags(Some(launch.tags.clone()))
            .build();
        let mut call = self
            .client
            .run_instances()
            .image_id(config.image_id.clone())
            .instance_type(InstanceType::from(attempt.instance_type.as_str()))
            .min_count(1)
            .max_count(launch.count)
            .client_token(client_token(&config.model_uuid, &attempt.client_token))
            .tag_specifications(spec);
        if let (Some(mb), Some(device)) = (launch.constraints.root_disk_mb, root_device) {
            let ebs = EbsBlockDevice::builder().volume_size(root_disk_gib(mb)).delete_on_termination(true).build();
            call = call.block_device_mappings(BlockDeviceMapping::builder().device_name(device).ebs(ebs).build());
        }
        if let Some(zone) = launch.zone {
            call = call.placement(Placement::builder().availability_zone(zone).build());
        }
        if launch.capacity == CapacityType::Spot {
            // One-time spot: the instance is terminated, not stopped, when EC2 takes it back.
            let mut spot = SpotMarketOptions::builder()
                .spot_instance_type(SpotInstanceType::OneTime)
                .instance_interruption_behavior(InstanceInterruptionBehavior::Terminate);
            if let Some(price) = launch.max_price {
                spot = spot.max_price(format!("{:.6}", price.dollars()));
            }
            let market =
                InstanceMarketOptionsRequest::builder().market_type(MarketType::Spot).spot_options(spot.build());
            call = call.instance_market_options(market.build());
        }
        if let Some(subnet) = placement_subnet(launch.placement).or(config.subnet_id.as_deref()) {
            call = call.subnet_id(subnet.to_owned());
        }
        if !config.security_group_ids.is_empty() {
            call = call.set_security_group_ids(Some(config.security_group_ids.clone()));
        }
        call.send().await.map_err(|e| sdk_error(e, launch.zone))
    }

    /// A launch over the candidate types, in the fail-over's order, each its own `RunInstances`
    /// call, until one launches. A zone-specific failure (no capacity for that type there)
    /// moves to the next type in the same zone and is remembered; any other failure ends the
    /// launch (an ambiguous one is retried by the provisioner with the same token, and then
    /// the same type comes first again). Only when every candidate failed in the zone does
    /// the launch fail zone-specifically, and the provisioner move zone.
    async fn launch(&self, launch: &Launch<'_>) -> Result<RunInstancesOutput, BrokerError> {
        let candidates = self.candidates(launch.constraints).await?;
        let root_device = match launch.constraints.root_disk_mb {
            Some(_) => Some(self.root_device().await),
            None => None,
        };
        let (zone, token) = (launch.zone, launch.token);
        let capacity = launch.capacity;
        let order = OrderTypes {
            now: self.now(),
            zone: zone.map(str::to_owned),
            capacity,
            token: token.to_owned(),
            candidates,
        };
        let attempts = self.memory.send(order).await.map_err(|_| Self::memory_gone())?;
        // Each outcome is told before the launch goes on: a later call's order comes after it.
        let attempted = |outcome: Attempted| {
            let (zone, token) = (zone.map(str::to_owned), token.to_owned());
            self.memory.do_send(Attempt { now: self.now(), zone, capacity, token, outcome });
        };
        let mut last = None;
        for attempt in &attempts {
            match self.run(launch, attempt, root_device.as_deref()).await {
                Ok(out) => {
                    attempted(Attempted::Settled);
                    return Ok(out);
                }
                Err(e @ BrokerError::ZoneSpecific { .. }) => {
                    attempted(Attempted::OutOfCapacity(attempt.instance_type.clone()));
                    last = Some(e);
                }
                Err(e) if e.is_ambiguous() => {
                    attempted(Attempted::Ambiguous(attempt.instance_type.clone()));
                    return Err(e);
                }
                Err(e) => {
                    attempted(Attempted::Settled);
                    return Err(e);
                }
            }
        }
        attempted(Attempted::Settled);
        Err(last.unwrap_or_else(|| BrokerError::zone_independent("no instance type to start")))
    }

    /// A start: one instance, tagged with its identity from the start (`TagSpecifications`).
    async fn start(&self, params: StartInstanceParams) -> Result<StartedInstance, BrokerError> {
        let model = self.config.model_uuid.as_str();
        let identity = identity_tags(model, Some(&params.machine), params.tags.start.as_deref());
        let launch = Launch {
            zone: params.zone.as_deref(),
            constraints: &params.constraints,
            placement: params.placement.as_deref(),
            token: &params.client_token,
            tags: with_shared_tags(identity, &params.extra_tags, &params.constraints),
            count: 1,
            capacity: params.capacity,
            max_price: params.spot_max_price,
        };
        let out = self.launch(&launch).await?;
        let instance = out
            .instances()
            .first()
            .and_then(|i| to_cloud_instance(i, model, wall_clock()))
            .ok_or_else(|| BrokerError::transient("RunInstances answered without an instance of ours"))?;
        let display_name = format!("provisioner-{}", params.machine);
        Ok(StartedInstance { instance: CloudInstance { age: None, ..instance }, display_name })
    }

    /// A batched start: ONE `RunInstances` (`MinCount` 1, `MaxCount` the members, one client
    /// token derived from the batch's, per type as a single start's), every instance tagged
    /// with the model and the batch token from the start; then each instance, by its
    /// `AmiLaunchIndex`, gets its member's machine and start tags (`CreateTags`, one call per
    /// instance). A member without an instance (EC2 launched fewer) is answered a zone-specific
    /// failure; one whose instance could not be tagged an ambiguous one (its look-up tags it).
    /// A repeat of the batch (same token, same members) gets the same reservation from EC2 and
    /// tags it again, which changes nothing.
    async fn start_batch(&self, params: BatchStartParams) -> Result<BatchStarted, BrokerError> {
        let n = params.members.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let model = self.config.model_uuid.as_str();
        let mut tags = identity_tags(model, None, None);
        // EC2 tag values hold 256 characters: a longer token is tagged as its `ClientToken`.
        let batch_tag = match params.client_token.len() {
            0..=256 => params.client_token.clone(),
            _ => client_token(model, &params.client_token),
        };
        tags.push(tag(TAG_BATCH, batch_tag));
        let machines: Vec<MachineId> = params.members.iter().map(|m| m.machine.clone()).collect();
        match member_tags(&machines) {
            Some(members) => tags.extend(members),
            None => tracing::warn!(
                machines = n,
                "a batch too large to name its machines in tags: each instance depends on its CreateTags"
            ),
        }
        let launch = Launch {
            zone: params.zone.as_deref(),
            constraints: &params.constraints,
            placement: params.placement.as_deref(),
            token: &params.client_token,
            tags: with_shared_tags(tags, &params.extra_tags, &params.constraints),
            count: i32::try_from(n).map_err(|_| BrokerError::zone_independent("too many machines in one call"))?,
            capacity: params.capacity,
            max_price: params.spot_max_price,
        };
        let out = self.launch(&launch).await?;
        let now = wall_clock();
        let mut by_index: BTreeMap<usize, CloudInstance> = out
            .instances()
            .iter()
            .filter_map(|i| {
                let index = usize::try_from(i.ami_launch_index()?).ok()?;
                Some((index, to_cloud_instance(i, model, now)?))
            })
            .collect();
        let launched = by_index.len();
        let zone = params.zone.as_deref().unwrap_or("the region");
        let left_out = BrokerError::zone_specific(format!(
            "InsufficientInstanceCapacity: EC2 launched {launched} of {n} instances of a batched start in {zone}"
        ));
        let jobs: Vec<(BatchMember, Option<CloudInstance>)> =
            params.members.iter().enumerate().map(|(i, m)| (m.clone(), by_index.remove(&i))).collect();
        let tagged = jobs.into_iter().map(|(member, instance)| {
            let (broker, left_out) = (self.clone(), left_out.clone());
            async move {
                match instance {
                    Some(instance) => broker.tag_member(&member, instance).await,
                    None => Err(left_out),
                }
            }
        });
        Ok(futures::stream::iter(tagged).buffered(TAGGING_CONCURRENCY).collect().await)
    }

    /// Tags a batched start's instance with its member's machine and start (`CreateTags`,
    /// tried again while EC2 does not see the new instance yet). On failure the instance is
    /// remembered for the member's look-up and the member answered ambiguously.
    async fn tag_member(&self, member: &BatchMember, instance: CloudInstance) -> Result<StartedInstance, BrokerError> {
        let model = self.config.model_uuid.as_str();
        let start = member.tags.start.as_deref();
        let set = identity_tags(model, Some(&member.machine), start);
        let id = instance.id.to_string();
        let mut wait = TAGGING_BACKOFF;
        let mut attempt = 1;
        loop {
            let res = self.paced_create_tags(&id, &set).await;
            match res {
                Ok(_) => {
                    // A repeat of the batch tagged what an earlier try could not: nothing
                    // left for the look-up to do (it must not tag the instance again later,
                    // when it may have been released or handed on).
                    let start = (member.machine.clone(), member.nonce.clone());
                    self.memory.do_send(TakeUntagged { start });
                    break;
                }
                Err(e) if attempt < TAGGING_ATTEMPTS && e.code() == Some("InvalidInstanceID.NotFound") => {
                    actix_rt::time::sleep(wait).await;
                    wait *= 2;
                    attempt += 1;
                }
                Err(e) => {
                    let why = sdk_error(e, None).message();
                    let start = (member.machine.clone(), member.nonce.clone());
                    self.memory.do_send(RememberUntagged { start, untagged: (id.clone(), set) });
                    return Err(BrokerError::transient(format!(
                        "instance {id} was launched for machine {} but not tagged with it: {why}",
                        member.machine
                    )));
                }
            }
        }
        let tags = InstanceTags {
            model: Some(model.to_owned()),
            machine: Some(member.machine.clone()),
            start: start.map(str::to_owned),
        };
        let display_name = format!("provisioner-{}", member.machine);
        Ok(StartedInstance { instance: CloudInstance { tags, age: None, ..instance }, display_name })
    }

    /// One `CreateTags` of an instance, paced by the provisioner's limiter (EC2 counts it in
    /// the mutating calls' bucket: the limiter's `stop` class) when one was handed over, and
    /// reported to it (a throttled answer slows it down).
    async fn paced_create_tags(
        &self,
        id: &str,
        set: &[Tag],
    ) -> Result<
        aws_sdk_ec2::operation::create_tags::CreateTagsOutput,
        SdkError<aws_sdk_ec2::operation::create_tags::CreateTagsError, HttpResponse>,
    > {
        let pacer = self.memory.send(GetPacer).await.ok().flatten();
        let epoch = match &pacer {
            Some(p) => Some(p.token(ApiClass::Stop).await),
            None => None,
        };
        let res = self.client.create_tags().resources(id).set_tags(Some(set.to_vec())).send().await;
        if let (Some(p), Some(epoch)) = (&pacer, epoch) {
            p.report(ApiClass::Stop, epoch, res.as_ref().err().is_some_and(|e| is_throttling(e.code())));
        }
        res
    }

    /// Tags the instance a batched start launched for this start but could not tag (if any),
    /// so that a look-up by tags finds it.
    async fn tag_remembered(&self, machine: &MachineId, nonce: &str) -> Result<(), BrokerError> {
        let start = (machine.clone(), nonce.to_owned());
        let remembered = self.memory.send(TakeUntagged { start: start.clone() }).await.ok().flatten();
        let Some((id, set)): Option<Untagged> = remembered else { return Ok(()) };
        let res = self.paced_create_tags(&id, &set).await;
        if let Err(e) = res {
            let why = format!("cannot tag instance {id} for machine {machine}: {}", sdk_error(e, None).message());
            self.memory.do_send(RememberUntagged { start, untagged: (id, set) });
            // The instance exists: never an answer that it does not.
            return Err(BrokerError::transient(why));
        }
        Ok(())
    }

    /// The SDK client (for tests and tools that inspect the cloud directly).
    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn terminate(client: &Client, ids: Vec<String>) -> Result<(), BrokerError> {
        for batch in ids.chunks(TERMINATE_BATCH) {
            let res = client.terminate_instances().set_instance_ids(Some(batch.to_vec())).send().await;
            match res {
                Ok(_) => {}
                // One id already gone fails the whole call: terminate the others one by one,
                // an instance that is gone being what we wanted.
                Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => {
                    for id in batch {
                        match client.terminate_instances().instance_ids(id.clone()).send().await {
                            Ok(_) => {}
                            Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => {}
                            Err(e) => return Err(sdk_error(e, None)),
                        }
                    }
                }
                Err(e) => return Err(sdk_error(e, None)),
            }
        }
        Ok(())
    }
}

impl Broker for Ec2Broker {
    fn pace_follow_ups(&self, pacer: Arc<dyn Pacer>) {
        // Queued before any call the provisioner then makes asks for it: those calls see it.
        self.memory.do_send(SetPacer(pacer));
    }
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        let broker = self.clone();
        Box::pin(async move { broker.start(params).await })
    }

    fn batches_starts(&self) -> bool {
        true
    }

    fn start_instances(&self, params: BatchStartParams) -> BrokerFuture<BatchStarted> {
        let broker = self.clone();
        Box::pin(async move { broker.start_batch(params).await })
    }

    fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        let client = self.client.clone();
        Box::pin(async move { Self::terminate(&client, ids.iter().map(ToString::to_string).collect()).await })
    }

    fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
        let client = self.client.clone();
        let model = self.config.model_uuid.clone();
        Box::pin(async move {
            let ours = Filter::builder().name(format!("tag:{TAG_MODEL}")).values(model.clone()).build();
            let mut pages = client
                .describe_instances()
                .filters(ours)
                .filters(live_states())
                .max_results(1000)
                .into_paginator()
                .send();
            let now = wall_clock();
            let mut out = Vec::new();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| sdk_error(e, None))?;
                for r in page.reservations() {
                    out.extend(r.instances().iter().filter_map(|i| to_cloud_instance(i, &model, now)));
                }
            }
            Ok(out)
        })
    }

    /// Running instances whose instance or system status check is `impaired`
    /// (`DescribeInstanceStatus`, paginated; instances of other models too: the caller keeps
    /// its own).
    fn impaired_instances(&self) -> BrokerFuture<Vec<InstanceId>> {
        use aws_sdk_ec2::types::SummaryStatus;
        let client = self.client.clone();
        Box::pin(async move {
            let mut pages = client.describe_instance_status().max_results(1000).into_paginator().send();
            let mut out = Vec::new();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| sdk_error(e, None))?;
                for s in page.instance_statuses() {
                    let impaired = |summary: Option<&aws_sdk_ec2::types::InstanceStatusSummary>| {
                        summary.and_then(|x| x.status()) == Some(&SummaryStatus::Impaired)
                    };
                    if impaired(s.instance_status()) || impaired(s.system_status()) {
                        out.extend(s.instance_id().map(InstanceId::new));
                    }
                }
            }
            out.sort();
            out.dedup();
            Ok(out)
        })
    }

    /// The configured AMI: an instance started from another (the model's image changed since)
    /// has drifted.
    fn current_image(&self) -> BrokerFuture<Option<String>> {
        let image = self.config.image_id.clone();
        Box::pin(async move { Ok(Some(image)) })
    }

    fn instances_of_start(&self, machine: MachineId, nonce: String) -> BrokerFuture<Vec<CloudInstance>> {
        let broker = self.clone();
        let client = self.client.clone();
        let model = self.config.model_uuid.clone();
        Box::pin(async move {
            broker.tag_remembered(&machine, &nonce).await?;
            let tag = |k: &str, v: String| Filter::builder().name(format!("tag:{k}")).values(v).build();
            let out = client
                .describe_instances()
                .filters(tag(TAG_MODEL, model.clone()))
                .filters(tag(TAG_MACHINE, machine.to_string()))
                .filters(tag(TAG_START, nonce))
                .filters(live_states())
                .send()
                .await
                .map_err(|e| sdk_error(e, None))?;
            let now = wall_clock();
            Ok(out
                .reservations()
                .iter()
                .flat_map(|r| r.instances())
                .filter_map(|i| to_cloud_instance(i, &model, now))
                .collect())
        })
    }

    fn supports_zones(&self) -> bool {
        true
    }

    fn availability_zones(&self) -> BrokerFuture<Vec<AvailabilityZone>> {
        let client = self.client.clone();
        Box::pin(async move {
            let out = client.describe_availability_zones().send().await.map_err(|e| sdk_error(e, None))?;
            Ok(out
                .availability_zones()
                .iter()
                .filter_map(|z| {
                    let name = z.zone_name()?.to_owned();
                    Some(AvailabilityZone { name, available: z.state() == Some(&AvailabilityZoneState::Available) })
                })
                .collect())
        })
    }

    fn derive_availability_zones(&self, params: &StartInstanceParams) -> BrokerFuture<Vec<String>> {
        // A placement directive `zone=NAME` pins the zone; `subnet=ID` (or, without one, the
        // configured subnet) puts the instance in that subnet's zone, from `DescribeSubnets`.
        let placement = params.placement.as_deref();
        let pinned = placement.and_then(|p| p.trim().strip_prefix("zone=")).map(str::to_owned);
        let placed = placement_subnet(placement).map(str::to_owned);
        let subnet = placed.clone().or_else(|| self.config.subnet_id.clone());
        let client = self.client.clone();
        Box::pin(async move {
            if let Some(zone) = pinned {
                return Ok(vec![zone]);
            }
            let Some(subnet) = subnet else { return Ok(Vec::new()) };
            let out = client.describe_subnets().subnet_ids(subnet.clone()).send().await.map_err(|e| {
                // An unknown subnet is the machine's own problem, whatever the zone.
                match sdk_error(e, None) {
                    BrokerError::ZoneSpecific { message } => BrokerError::ZoneIndependent { message },
                    other => other,
                }
            })?;
            let zones: Vec<String> =
                out.subnets().iter().filter_map(|s| s.availability_zone().map(str::to_owned)).collect();
            if zones.is_empty() && placed.is_some() {
                return Err(BrokerError::zone_independent(format!("subnet {subnet:?} not found (DescribeSubnets)")));
            }
            Ok(zones)
        })
    }

    fn retag_instance(&self, id: InstanceId, tags: InstanceTags) -> BrokerFuture<()> {
        let client = self.client.clone();
        let model = self.config.model_uuid.clone();
        Box::pin(async move {
            let set = identity_tags(&tags.model.unwrap_or(model), tags.machine.as_ref(), tags.start.as_deref());
            client
                .create_tags()
                .resources(id.to_string())
                .set_tags(Some(set))
                .send()
                .await
                .map_err(|e| sdk_error(e, None))?;
            Ok(())
        })
    }

    fn supports_interruptions(&self) -> bool {
        self.interruptions.is_some()
    }

    fn capacity_short(&self, zone: Option<&str>, instance_type: &str, capacity: CapacityType) {
        let outcome = Attempted::OutOfCapacity(instance_type.to_owned());
        let zone = zone.map(str::to_owned);
        self.memory.do_send(Attempt { now: self.now(), zone, capacity, token: String::new(), outcome });
    }

    fn interruption_notices(&self) -> BrokerFuture<Vec<InterruptionNotice>> {
        let queue = self.interruptions.clone();
        Box::pin(async move {
            let Some(queue) = queue else { return Err(BrokerError::NotSupported("interruption_notices")) };
            let notices = queue.receive().await?;
            // The deadlines are wall-clock times (the events' `time`): counted from the wall
            // clock's now, when the notices arrived.
            let now = wall_clock();
            Ok(notices.iter().map(|n| n.to_port(now)).collect())
        })
    }

    fn acknowledge_notices(&self, receipts: Vec<String>) -> BrokerFuture<()> {
        let queue = self.interruptions.clone();
        Box::pin(async move {
            match queue {
                Some(queue) if !receipts.is_empty() => queue.acknowledge(receipts).await,
                _ => Ok(()),
            }
        })
    }

    fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
        let client = self.client.clone();
        Box::pin(async move {
            if ids.is_empty() {
                return Ok(());
            }
            client
                .delete_tags()
                .set_resources(Some(ids.iter().map(ToString::to_string).collect()))
                .tags(Tag::builder().key(TAG_MODEL).build())
                .send()
                .await
                .map_err(|e| sdk_error(e, None))?;
            Ok(())
        })
    }
}
