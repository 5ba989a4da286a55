//! [`Ec2Broker`]: the calls themselves.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{
    AvailabilityZoneState, Filter, Instance, InstanceStateName, InstanceType, Placement, ResourceType, Tag,
    TagSpecification,
};
use aws_sdk_ec2::Client;

use super::config::{Ec2Config, Ec2ConfigError};
use super::errors::classify;
use crate::model::{CloudInstance, InstanceId, InstanceState, InstanceTags, MachineId};
use crate::ports::{AvailabilityZone, Broker, BrokerError, BrokerFuture, StartInstanceParams, StartedInstance};

/// Tag key carrying the model's uuid: the provisioner's identity on an instance.
pub const TAG_MODEL: &str = "provisioner-model";
/// Tag key carrying the machine id the instance was started for.
pub const TAG_MACHINE: &str = "provisioner-machine";
/// Tag key carrying the start's nonce.
pub const TAG_START: &str = "provisioner-start";

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

/// A [`Broker`] over EC2.
#[derive(Clone)]
pub struct Ec2Broker {
    client: Client,
    config: Arc<Ec2Config>,
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
        machine: value(TAG_MACHINE).map(MachineId::new),
        start: value(TAG_START),
    };
    if tags.model.as_deref() != Some(model) {
        return None;
    }
    let zone = i.placement().and_then(|p| p.availability_zone()).map(str::to_owned);
    let age = i
        .launch_time()
        .and_then(|t| SystemTime::try_from(*t).ok())
        .map(|launched| now.duration_since(launched).unwrap_or(Duration::ZERO));
    Some(CloudInstance { id: InstanceId::new(id), state, zone, tags, age })
}

/// The wall clock, to age instances from their `LaunchTime` (a wall-clock timestamp). The one
/// place the library reads it: an instance's age is not a matter of the provisioner's own
/// (possibly paused) clock.
#[allow(clippy::disallowed_methods)]
fn wall_clock() -> SystemTime {
    SystemTime::now()
}

impl Ec2Broker {
    /// Connects: loads the AWS configuration (credentials from the standard chain; region and
    /// endpoint from `config` when given).
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
        Ok(Self { client: Client::new(&sdk), config: Arc::new(config) })
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
    fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
        let client = self.client.clone();
        let config = self.config.clone();
        Box::pin(async move {
            let mut tags = vec![
                tag(TAG_MODEL, config.model_uuid.clone()),
                tag(TAG_MACHINE, params.machine.to_string()),
                tag("Name", format!("provisioner-{}", params.machine)),
            ];
            if let Some(start) = &params.tags.start {
                tags.push(tag(TAG_START, start.clone()));
            }
            for (k, v) in &params.extra_tags {
                tags.push(tag(k, v.clone()));
            }
            let spec = TagSpecification::builder().resource_type(ResourceType::Instance).set_tags(Some(tags)).build();
            let mut call = client
                .run_instances()
                .image_id(config.image_id.clone())
                .instance_type(InstanceType::from(config.instance_type.as_str()))
                .min_count(1)
                .max_count(1)
                .client_token(client_token(&config.model_uuid, &params.client_token))
                .tag_specifications(spec);
            if let Some(zone) = &params.zone {
                call = call.placement(Placement::builder().availability_zone(zone.clone()).build());
            }
            if let Some(subnet) = &config.subnet_id {
                call = call.subnet_id(subnet.clone());
            }
            if !config.security_group_ids.is_empty() {
                call = call.set_security_group_ids(Some(config.security_group_ids.clone()));
            }
            let out = call.send().await.map_err(|e| sdk_error(e, params.zone.as_deref()))?;
            let instance = out
                .instances()
                .first()
                .and_then(|i| to_cloud_instance(i, &config.model_uuid, wall_clock()))
                .ok_or_else(|| BrokerError::transient("RunInstances answered without an instance of ours"))?;
            let display_name = format!("provisioner-{}", params.machine);
            Ok(StartedInstance { instance: CloudInstance { age: None, ..instance }, display_name })
        })
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

    fn instances_of_start(&self, machine: MachineId, nonce: String) -> BrokerFuture<Vec<CloudInstance>> {
        let client = self.client.clone();
        let model = self.config.model_uuid.clone();
        Box::pin(async move {
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
        // A placement directive `zone=NAME` pins the zone; a configured subnet lives in one.
        let pinned = params.placement.as_deref().and_then(|p| p.strip_prefix("zone=")).map(str::to_owned);
        let client = self.client.clone();
        let subnet = self.config.subnet_id.clone();
        Box::pin(async move {
            if let Some(zone) = pinned {
                return Ok(vec![zone]);
            }
            let Some(subnet) = subnet else { return Ok(Vec::new()) };
            let out = client.describe_subnets().subnet_ids(subnet).send().await.map_err(|e| sdk_error(e, None))?;
            Ok(out.subnets().iter().filter_map(|s| s.availability_zone().map(str::to_owned)).collect())
        })
    }

    fn retag_instance(&self, id: InstanceId, tags: InstanceTags) -> BrokerFuture<()> {
        let client = self.client.clone();
        let model = self.config.model_uuid.clone();
        Box::pin(async move {
            let mut set = vec![tag(TAG_MODEL, tags.model.unwrap_or(model))];
            if let Some(m) = tags.machine {
                set.push(tag(TAG_MACHINE, m.to_string()));
                set.push(tag("Name", format!("provisioner-{m}")));
            }
            if let Some(s) = tags.start {
                set.push(tag(TAG_START, s));
            }
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
