//! The broker contract suite (feature `test-util`): what the provisioner relies on from every
//! [`Broker`], as checks an embedder runs against their own broker.
//!
//! The provisioner trusts a broker's tags, listings and client tokens with its safety (never
//! two instances for one machine, never a stranger's instance harvested). This suite states
//! those promises once, as async checks over two brokers on the same cloud: the broker under
//! test (`ours`) and a second one for another model (`theirs`), which only the check of
//! foreign instances uses. This crate runs it against its fake cloud, the service's simulated
//! cloud and the EC2 broker on moto; a broker of your own runs it the same way:
//!
//! ```no_run
//! use provisioner::testing::broker_contract::{run_all, ContractConfig};
//! use provisioner::Broker;
//!
//! # async fn demo(ours: &dyn Broker, theirs: &dyn Broker) {
//! // `ours` serves the model "model-a", `theirs` the model "model-b", on the same cloud.
//! let config = ContractConfig::new("model-a", "model-b");
//! let report = run_all(ours, theirs, config).await.expect("the broker keeps the contract");
//! assert!(report.all_passed(), "{report}"); // or accept what `report` lists as not supported
//! # }
//! ```
//!
//! Or one property at a time (one `#[test]` each, say), with [`BrokerContract::check`] and
//! [`Property::ALL`]. A failure is a [`ContractError`] naming the property, what was expected
//! and what the broker did (or the call that failed, its [`BrokerError`] kept as the source).
//!
//! The properties ([`Property`]):
//!
//! - a start returns an instance tagged with the model, the machine and the start's nonce,
//!   pending or running, and [`Broker::all_instances`] lists it with those tags and state;
//! - a start repeated with the same client token and the same parameters returns the same
//!   instance and makes no other (the retry of an ambiguous failure relies on it);
//! - [`Broker::instances_of_start`] finds exactly the live instances of that machine and nonce;
//! - [`Broker::stop_instances`] terminates (the instance is listed no more), is idempotent,
//!   and succeeds for ids already gone;
//! - [`Broker::release_instances`] removes the model's identity: the instance is listed no
//!   more;
//! - [`Broker::retag_instance`] moves the instance to another machine and start (a broker may
//!   answer [`BrokerError::NotSupported`]: reported, not a failure);
//! - only the model's instances are listed: one started through a second broker for another
//!   model on the same cloud, even with the same machine, nonce and client token, is a
//!   different instance, never listed or found as ours (client tokens are the model's own);
//! - zones, where [`Broker::supports_zones`]: [`Broker::availability_zones`] lists them
//!   (named, once each, at least one available), and a start into an available zone lands
//!   there;
//! - [`Broker::start_instances`] (native or the per-machine fallback) answers one entry per
//!   machine in launch order, each instance tagged with its own machine and start, in the
//!   call's zone, and listed so; a machine refused in a partial launch gets no instance; the
//!   same call repeated (same token, same machines) answers the same instances and makes no
//!   other.
//!
//! Every check is bounded: a fixed number of calls, at most [`ContractConfig::polls`]
//! listings (one every [`ContractConfig::poll_interval`]) while waiting for the cloud to show
//! a change, and [`ContractConfig::timeout`] in all. Each check stops the instances it made
//! when it ends, passed or failed. Time is tokio's: on a paused clock
//! ([`PausedSystem`](crate::testing::PausedSystem)) the waits take no real time.
//!
//! Use a model of its own for each run (two runs' instances would see each other), and on a
//! cloud that remembers client tokens across runs (EC2 does, for a while) a fresh
//! [`ContractConfig::run_id`] too.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use thiserror::Error;

use crate::model::{CloudInstance, InstanceId, InstanceState, InstanceTags, MachineId};
use crate::ports::{BatchMember, BatchStartParams, Broker, BrokerError, StartInstanceParams, StartedInstance};

/// One promise of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Property {
    /// A start returns a tagged instance that `all_instances` lists with its tags and state.
    StartIsTaggedAndListed,
    /// A repeated client token with the same parameters returns the same instance, no other.
    RepeatedTokenIsIdempotent,
    /// `instances_of_start` finds exactly the instances of that start.
    InstancesOfStart,
    /// `stop_instances` terminates, is idempotent and tolerates ids already gone.
    StopTerminates,
    /// `release_instances` removes the model's identity: the instance is listed no more.
    ReleaseRemovesIdentity,
    /// `retag_instance` moves the instance to another machine (or is not supported).
    RetagMovesInstance,
    /// Only the model's instances are listed; client tokens are the model's own.
    OnlyOurModelIsListed,
    /// Zones are listed with availability, and a start into one lands there.
    ZonesAreHonoured,
    /// A batched start maps instances to machines by launch index, tags each with its machine,
    /// and is idempotent on its one client token (partial launches included).
    BatchedStarts,
}

impl Property {
    /// Every property, in the order [`run_all`] checks them.
    pub const ALL: [Property; 9] = [
        Property::StartIsTaggedAndListed,
        Property::RepeatedTokenIsIdempotent,
        Property::InstancesOfStart,
        Property::StopTerminates,
        Property::ReleaseRemovesIdentity,
        Property::RetagMovesInstance,
        Property::OnlyOurModelIsListed,
        Property::ZonesAreHonoured,
        Property::BatchedStarts,
    ];

    /// Its name (snake case), as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Property::StartIsTaggedAndListed => "start_is_tagged_and_listed",
            Property::RepeatedTokenIsIdempotent => "repeated_token_is_idempotent",
            Property::InstancesOfStart => "instances_of_start",
            Property::StopTerminates => "stop_terminates",
            Property::ReleaseRemovesIdentity => "release_removes_identity",
            Property::RetagMovesInstance => "retag_moves_instance",
            Property::OnlyOurModelIsListed => "only_our_model_is_listed",
            Property::ZonesAreHonoured => "zones_are_honoured",
            Property::BatchedStarts => "batched_starts",
        }
    }
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a property that holds was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The broker keeps it.
    Passed,
    /// The broker does not offer what it is about (a `NotSupported` retag, no zones): allowed.
    NotSupported(&'static str),
}

/// What [`run_all`] found, property by property.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// Each property checked, with its outcome, in the order checked.
    pub outcomes: Vec<(Property, Outcome)>,
}

impl Report {
    /// Whether every property passed (none was reported as not supported).
    pub fn all_passed(&self) -> bool {
        self.outcomes.iter().all(|(_, o)| *o == Outcome::Passed)
    }

    /// The properties the broker does not support, with what it does not support.
    pub fn not_supported(&self) -> Vec<(Property, &'static str)> {
        self.outcomes
            .iter()
            .filter_map(|(p, o)| match o {
                Outcome::NotSupported(what) => Some((*p, *what)),
                Outcome::Passed => None,
            })
            .collect()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (p, o) in &self.outcomes {
            match o {
                Outcome::Passed => writeln!(f, "{p}: passed")?,
                Outcome::NotSupported(what) => writeln!(f, "{p}: not supported ({what})")?,
            }
        }
        Ok(())
    }
}

/// How a broker broke the contract.
#[derive(Debug, Error)]
pub enum ContractError {
    /// The broker answered, but not as the contract says.
    #[error("{property}: {what}")]
    Violated {
        /// The property broken.
        property: Property,
        /// What was expected, and what the broker did.
        what: String,
    },
    /// A call the property needs failed.
    #[error("{property}: `{call}` failed")]
    Call {
        /// The property being checked.
        property: Property,
        /// The broker call.
        call: &'static str,
        /// The broker's error.
        #[source]
        source: BrokerError,
    },
    /// The check did not finish in time.
    #[error("{property}: not done within {after:?}")]
    TimedOut {
        /// The property being checked.
        property: Property,
        /// The bound ([`ContractConfig::timeout`]).
        after: Duration,
    },
}

impl ContractError {
    /// The property the error is about.
    pub fn property(&self) -> Property {
        match self {
            ContractError::Violated { property, .. }
            | ContractError::Call { property, .. }
            | ContractError::TimedOut { property, .. } => *property,
        }
    }
}

/// The suite's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractConfig {
    /// The model the broker under test serves: the model tag its instances carry.
    pub model_uuid: String,
    /// The model of the second broker (for the check of foreign instances).
    pub other_model_uuid: String,
    /// Part of every machine id, nonce and client token the suite makes, so that two runs
    /// on one cloud do not share tokens.
    pub run_id: String,
    /// An instance id no instance has ever had, well-formed for the cloud (stops of it must
    /// succeed).
    pub missing_instance: InstanceId,
    /// The bound on each check.
    pub timeout: Duration,
    /// How many listings a check makes, at most, while waiting for the cloud to show a change.
    pub polls: u32,
    /// The wait between two such listings.
    pub poll_interval: Duration,
}

impl ContractConfig {
    /// The defaults for these two models: run id `contract`, missing instance
    /// `i-0fffffffffffffff0` (well-formed for EC2), 60 s per check, 40 listings 250 ms apart.
    pub fn new(model_uuid: impl Into<String>, other_model_uuid: impl Into<String>) -> Self {
        Self {
            model_uuid: model_uuid.into(),
            other_model_uuid: other_model_uuid.into(),
            run_id: "contract".into(),
            missing_instance: InstanceId::new("i-0fffffffffffffff0"),
            timeout: Duration::from_secs(60),
            polls: 40,
            poll_interval: Duration::from_millis(250),
        }
    }
}

/// Runs every property in [`Property::ALL`] against `ours` (serving
/// [`ContractConfig::model_uuid`]), with `theirs` (serving [`ContractConfig::other_model_uuid`]
/// on the same cloud) as the stranger; stops at the first broken one.
pub async fn run_all(ours: &dyn Broker, theirs: &dyn Broker, config: ContractConfig) -> Result<Report, ContractError> {
    BrokerContract::new(ours, theirs, config).run_all().await
}

/// The suite over two brokers on one cloud; see the [module docs](self).
pub struct BrokerContract<'a> {
    ours: &'a dyn Broker,
    theirs: &'a dyn Broker,
    config: ContractConfig,
    /// Numbers the machines and nonces of this run's starts.
    seq: AtomicU32,
}

/// One start the suite makes: its machine, nonce and parameters.
struct Start {
    machine: MachineId,
    nonce: String,
    params: StartInstanceParams,
}

/// Which broker a call goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Ours,
    Theirs,
}

impl<'a> BrokerContract<'a> {
    /// The suite for `ours`, with `theirs` (another model, same cloud) as the stranger.
    pub fn new(ours: &'a dyn Broker, theirs: &'a dyn Broker, config: ContractConfig) -> Self {
        Self { ours, theirs, config, seq: AtomicU32::new(0) }
    }

    /// Every property, in order; stops at the first broken one.
    pub async fn run_all(&self) -> Result<Report, ContractError> {
        let mut report = Report::default();
        for property in Property::ALL {
            report.outcomes.push((property, self.check(property).await?));
        }
        Ok(report)
    }

    /// Checks one property within [`ContractConfig::timeout`], then stops the instances the
    /// check made (whatever its outcome).
    pub async fn check(&self, property: Property) -> Result<Outcome, ContractError> {
        let c = Check { suite: self, property, made: RefCell::new(Vec::new()) };
        let body = async {
            match property {
                Property::StartIsTaggedAndListed => c.start_is_tagged_and_listed().await,
                Property::RepeatedTokenIsIdempotent => c.repeated_token_is_idempotent().await,
                Property::InstancesOfStart => c.instances_of_start().await,
                Property::StopTerminates => c.stop_terminates().await,
                Property::ReleaseRemovesIdentity => c.release_removes_identity().await,
                Property::RetagMovesInstance => c.retag_moves_instance().await,
                Property::OnlyOurModelIsListed => c.only_our_model_is_listed().await,
                Property::ZonesAreHonoured => c.zones_are_honoured().await,
                Property::BatchedStarts => c.batched_starts().await,
            }
        };
        let after = self.config.timeout;
        let outcome =
            actix_rt::time::timeout(after, body).await.unwrap_or(Err(ContractError::TimedOut { property, after }));
        self.clean_up(c.made.take()).await;
        outcome
    }

    /// Stops what a check made (best effort: bounded by the timeout, errors ignored).
    async fn clean_up(&self, made: Vec<(bool, InstanceId)>) {
        for (side, broker) in [(true, self.ours), (false, self.theirs)] {
            let ids: Vec<InstanceId> = made.iter().filter(|(s, _)| *s == side).map(|(_, id)| id.clone()).collect();
            if !ids.is_empty() {
                let _ = actix_rt::time::timeout(self.config.timeout, broker.stop_instances(ids)).await;
            }
        }
    }

    fn broker(&self, side: Side) -> &'a dyn Broker {
        match side {
            Side::Ours => self.ours,
            Side::Theirs => self.theirs,
        }
    }

    fn model(&self, side: Side) -> &str {
        match side {
            Side::Ours => &self.config.model_uuid,
            Side::Theirs => &self.config.other_model_uuid,
        }
    }

    /// A new machine id of this run.
    fn machine(&self) -> MachineId {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        MachineId::new(format!("{}-{n}", self.config.run_id))
    }

    /// A start for `machine` with a new nonce (or `nonce`), as the provisioner would make it.
    fn start(&self, side: Side, machine: &MachineId, nonce: Option<&str>, zone: Option<String>) -> Start {
        let nonce = match nonce {
            Some(n) => n.to_owned(),
            None => format!("{}:{}-{}", machine.tag(), self.config.run_id, self.seq.fetch_add(1, Ordering::Relaxed)),
        };
        let params = StartInstanceParams {
            machine: machine.clone(),
            zone,
            constraints: Default::default(),
            placement: None,
            volumes: Vec::new(),
            nonce: nonce.clone(),
            tags: InstanceTags {
                model: Some(self.model(side).to_owned()),
                machine: Some(machine.clone()),
                start: Some(nonce.clone()),
            },
            extra_tags: Default::default(),
            client_token: format!("{machine}/{nonce}/0"),
            distribution_group: Vec::new(),
            capacity: Default::default(),
            spot_max_price: None,
        };
        Start { machine: machine.clone(), nonce, params }
    }
}

/// One property being checked.
struct Check<'s, 'a> {
    suite: &'s BrokerContract<'a>,
    property: Property,
    /// The instances it made (`true`: through `ours`), stopped when it ends. The check runs on
    /// one task: a cell, no lock.
    made: RefCell<Vec<(bool, InstanceId)>>,
}

fn ids(instances: &[CloudInstance]) -> BTreeSet<InstanceId> {
    instances.iter().map(|i| i.id.clone()).collect()
}

fn live(state: InstanceState) -> bool {
    matches!(state, InstanceState::Pending | InstanceState::Running)
}

impl Check<'_, '_> {
    fn violated(&self, what: impl Into<String>) -> ContractError {
        ContractError::Violated { property: self.property, what: what.into() }
    }

    fn ensure(&self, ok: bool, what: impl FnOnce() -> String) -> Result<(), ContractError> {
        if ok {
            Ok(())
        } else {
            Err(self.violated(what()))
        }
    }

    fn call<T>(&self, call: &'static str, res: Result<T, BrokerError>) -> Result<T, ContractError> {
        res.map_err(|source| ContractError::Call { property: self.property, call, source })
    }

    /// The zone a start goes to: the first available one on a zoned cloud.
    async fn zone(&self) -> Result<Option<String>, ContractError> {
        if !self.suite.ours.supports_zones() {
            return Ok(None);
        }
        let zones = self.call("availability_zones", self.suite.ours.availability_zones().await)?;
        let zone = zones.into_iter().find(|z| z.available).map(|z| z.name);
        zone.map(Some).ok_or_else(|| self.violated("a zoned cloud lists no available zone"))
    }

    /// Starts (recording the instance for the clean-up).
    async fn run(&self, side: Side, start: &Start) -> Result<StartedInstance, ContractError> {
        let res = self.suite.broker(side).start_instance(start.params.clone()).await;
        let started = self.call("start_instance", res)?;
        let made = (side == Side::Ours, started.instance.id.clone());
        self.made.borrow_mut().push(made);
        Ok(started)
    }

    /// A start for a new machine of ours, into the default zone.
    async fn run_new(&self) -> Result<(Start, StartedInstance), ContractError> {
        let zone = self.zone().await?;
        let start = self.suite.start(Side::Ours, &self.suite.machine(), None, zone);
        let started = self.run(Side::Ours, &start).await?;
        Ok((start, started))
    }

    async fn list(&self, side: Side) -> Result<Vec<CloudInstance>, ContractError> {
        self.call("all_instances", self.suite.broker(side).all_instances().await)
    }

    async fn of_start(
        &self,
        side: Side,
        machine: &MachineId,
        nonce: &str,
    ) -> Result<Vec<CloudInstance>, ContractError> {
        let res = self.suite.broker(side).instances_of_start(machine.clone(), nonce.to_owned()).await;
        self.call("instances_of_start", res)
    }

    async fn stop(&self, ids: Vec<InstanceId>) -> Result<(), ContractError> {
        self.call("stop_instances", self.suite.ours.stop_instances(ids).await)
    }

    /// Lists (at most [`ContractConfig::polls`] times) until `ok` holds of the listing;
    /// returns the last listing, or the violation `what` describes.
    async fn eventually(
        &self,
        side: Side,
        ok: impl Fn(&[CloudInstance]) -> bool,
        what: impl FnOnce(&[CloudInstance]) -> String,
    ) -> Result<Vec<CloudInstance>, ContractError> {
        let polls = self.suite.config.polls.max(1);
        let mut listed = Vec::new();
        for n in 0..polls {
            if n > 0 {
                actix_rt::time::sleep(self.suite.config.poll_interval).await;
            }
            listed = self.list(side).await?;
            if ok(&listed) {
                return Ok(listed);
            }
        }
        Err(self.violated(what(&listed)))
    }

    /// The same for `instances_of_start`: until it finds exactly `want`.
    async fn eventually_of_start(
        &self,
        machine: &MachineId,
        nonce: &str,
        want: &BTreeSet<InstanceId>,
    ) -> Result<(), ContractError> {
        let polls = self.suite.config.polls.max(1);
        let mut found = BTreeSet::new();
        for n in 0..polls {
            if n > 0 {
                actix_rt::time::sleep(self.suite.config.poll_interval).await;
            }
            found = ids(&self.of_start(Side::Ours, machine, nonce).await?);
            if &found == want {
                return Ok(());
            }
        }
        Err(self.violated(format!("instances_of_start({machine}, {nonce}) found {found:?}, not {want:?}")))
    }

    async fn start_is_tagged_and_listed(&self) -> Result<Outcome, ContractError> {
        let (start, started) = self.run_new().await?;
        let got = &started.instance;
        let want = &start.params.tags;
        self.ensure(got.tags == *want, || format!("the start returned tags {:?}, not {want:?}", got.tags))?;
        self.ensure(live(got.state), || format!("the start returned an instance {}", got.state))?;
        let id = got.id.clone();
        let listed = self
            .eventually(Side::Ours, |l| l.iter().any(|i| i.id == id), |l| format!("{id} is not listed: {:?}", ids(l)))
            .await?;
        let Some(it) = listed.iter().find(|i| i.id == id) else { return Err(self.violated("listed and gone")) };
        self.ensure(it.tags == *want, || format!("{id} is listed with tags {:?}, not {want:?}", it.tags))?;
        self.ensure(live(it.state), || format!("{id} is listed {}", it.state))?;
        self.ensure(it.zone == got.zone, || {
            format!("{id} is listed in zone {:?}, started in {:?}", it.zone, got.zone)
        })?;
        Ok(Outcome::Passed)
    }

    async fn repeated_token_is_idempotent(&self) -> Result<Outcome, ContractError> {
        let (start, first) = self.run_new().await?;
        let again = self.run(Side::Ours, &start).await?;
        let (a, b) = (&first.instance.id, &again.instance.id);
        self.ensure(a == b, || format!("a repeat of client token {} made {b}, not {a}", start.params.client_token))?;
        let machine = start.machine.clone();
        let want = BTreeSet::from([a.clone()]);
        let of_machine = |l: &[CloudInstance]| -> BTreeSet<InstanceId> {
            l.iter().filter(|i| i.tags.machine.as_ref() == Some(&machine)).map(|i| i.id.clone()).collect()
        };
        self.eventually(
            Side::Ours,
            |l| of_machine(l) == want,
            |l| format!("machine {machine} has instances {:?} after a repeated start, not only {a}", of_machine(l)),
        )
        .await?;
        self.eventually_of_start(&start.machine, &start.nonce, &want).await?;
        Ok(Outcome::Passed)
    }

    async fn instances_of_start(&self) -> Result<Outcome, ContractError> {
        let zone = self.zone().await?;
        let (m, other) = (self.suite.machine(), self.suite.machine());
        let first = self.suite.start(Side::Ours, &m, None, zone.clone());
        // A second start of the same machine, and a start of another machine with the same
        // nonce: the lookup must match both the machine and the nonce.
        let second = self.suite.start(Side::Ours, &m, None, zone.clone());
        let same_nonce = self.suite.start(Side::Ours, &other, Some(&first.nonce), zone);
        let a = self.run(Side::Ours, &first).await?.instance.id;
        let b = self.run(Side::Ours, &second).await?.instance.id;
        let c = self.run(Side::Ours, &same_nonce).await?.instance.id;
        self.ensure(a != b && b != c && a != c, || format!("three starts made {a}, {b}, {c}"))?;
        self.eventually_of_start(&m, &first.nonce, &BTreeSet::from([a.clone()])).await?;
        self.eventually_of_start(&m, &second.nonce, &BTreeSet::from([b])).await?;
        self.eventually_of_start(&other, &first.nonce, &BTreeSet::from([c])).await?;
        let unknown = format!("{}:{}-never", m.tag(), self.suite.config.run_id);
        self.eventually_of_start(&m, &unknown, &BTreeSet::new()).await?;
        self.stop(vec![a]).await?;
        self.eventually_of_start(&m, &first.nonce, &BTreeSet::new()).await?;
        Ok(Outcome::Passed)
    }

    async fn stop_terminates(&self) -> Result<Outcome, ContractError> {
        let a = self.run_new().await?.1.instance.id;
        let b = self.run_new().await?.1.instance.id;
        self.eventually(
            Side::Ours,
            |l| ids(l).is_superset(&BTreeSet::from([a.clone(), b.clone()])),
            |l| format!("{a} and {b} are not both listed: {:?}", ids(l)),
        )
        .await?;
        self.stop(vec![a.clone()]).await?;
        self.eventually(
            Side::Ours,
            |l| !ids(l).contains(&a) && ids(l).contains(&b),
            |l| format!("after stopping {a} (only), the listing is {:?}", ids(l)),
        )
        .await?;
        // Again (a stop whose answer was lost is repeated), and with an id that never was.
        self.stop(vec![a.clone()]).await?;
        let missing = self.suite.config.missing_instance.clone();
        self.stop(vec![a.clone(), missing, b.clone()]).await?;
        self.stop(Vec::new()).await?;
        self.eventually(
            Side::Ours,
            |l| !ids(l).contains(&a) && !ids(l).contains(&b),
            |l| format!("after stopping {a} and {b}, the listing is {:?}", ids(l)),
        )
        .await?;
        Ok(Outcome::Passed)
    }

    async fn release_removes_identity(&self) -> Result<Outcome, ContractError> {
        let (start, started) = self.run_new().await?;
        let a = started.instance.id;
        self.eventually(Side::Ours, |l| ids(l).contains(&a), |l| format!("{a} is not listed: {:?}", ids(l))).await?;
        let res = self.suite.ours.release_instances(vec![a.clone()]).await;
        self.call("release_instances", res)?;
        self.call("release_instances", self.suite.ours.release_instances(Vec::new()).await)?;
        self.eventually(
            Side::Ours,
            |l| !ids(l).contains(&a),
            |l| format!("{a} is still listed after its release: {:?}", ids(l)),
        )
        .await?;
        self.eventually_of_start(&start.machine, &start.nonce, &BTreeSet::new()).await?;
        Ok(Outcome::Passed)
    }

    async fn retag_moves_instance(&self) -> Result<Outcome, ContractError> {
        let (start, started) = self.run_new().await?;
        let a = started.instance.id;
        let next = self.suite.start(Side::Ours, &self.suite.machine(), None, None);
        match self.suite.ours.retag_instance(a.clone(), next.params.tags.clone()).await {
            Err(BrokerError::NotSupported(what)) => return Ok(Outcome::NotSupported(what)),
            res => self.call("retag_instance", res)?,
        }
        let want = next.params.tags.clone();
        self.eventually(
            Side::Ours,
            |l| l.iter().any(|i| i.id == a && i.tags == want),
            |l| {
                let now = l.iter().find(|i| i.id == a).map(|i| &i.tags);
                format!("{a} is listed with tags {now:?} after its retag, not {want:?}")
            },
        )
        .await?;
        self.eventually_of_start(&next.machine, &next.nonce, &BTreeSet::from([a])).await?;
        self.eventually_of_start(&start.machine, &start.nonce, &BTreeSet::new()).await?;
        Ok(Outcome::Passed)
    }

    async fn only_our_model_is_listed(&self) -> Result<Outcome, ContractError> {
        let zone = self.zone().await?;
        let m = self.suite.machine();
        let ours = self.suite.start(Side::Ours, &m, None, zone.clone());
        // The stranger's start has the same machine, nonce and client token: only the model
        // differs.
        let theirs = self.suite.start(Side::Theirs, &m, Some(&ours.nonce), zone);
        let a = self.run(Side::Ours, &ours).await?.instance.id;
        let b = self.run(Side::Theirs, &theirs).await?;
        self.ensure(b.instance.id != a, || {
            format!("another model's start with the same client token got our instance {a}")
        })?;
        let b = b.instance.id;
        self.eventually(
            Side::Theirs,
            |l| ids(l).contains(&b),
            |l| format!("the other model's broker does not list its {b}: {:?}", ids(l)),
        )
        .await?;
        let listed = self
            .eventually(Side::Ours, |l| ids(l).contains(&a), |l| format!("{a} is not listed: {:?}", ids(l)))
            .await?;
        self.ensure(!ids(&listed).contains(&b), || format!("another model's instance {b} is listed as ours"))?;
        let ours_elsewhere: Vec<&CloudInstance> =
            listed.iter().filter(|i| i.tags.model.as_deref() != Some(self.suite.model(Side::Ours))).collect();
        self.ensure(ours_elsewhere.is_empty(), || format!("listed without our model's tag: {ours_elsewhere:?}"))?;
        let theirs_listed = self.list(Side::Theirs).await?;
        self.ensure(!ids(&theirs_listed).contains(&a), || format!("our {a} is listed as the other model's"))?;
        self.eventually_of_start(&m, &ours.nonce, &BTreeSet::from([a])).await?;
        Ok(Outcome::Passed)
    }

    async fn zones_are_honoured(&self) -> Result<Outcome, ContractError> {
        if !self.suite.ours.supports_zones() {
            return Ok(Outcome::NotSupported("zones"));
        }
        let zones = self.call("availability_zones", self.suite.ours.availability_zones().await)?;
        let names: BTreeSet<&str> = zones.iter().map(|z| z.name.as_str()).collect();
        self.ensure(names.len() == zones.len() && !names.contains(""), || {
            format!("zones must be named, once each: {zones:?}")
        })?;
        let available: Vec<String> = zones.iter().filter(|z| z.available).map(|z| z.name.clone()).collect();
        self.ensure(!available.is_empty(), || format!("no zone is available: {zones:?}"))?;
        // Into the last available zone and the first: a broker that ignores the zone lands both
        // in one place.
        let targets: BTreeSet<&String> = [available.last(), available.first()].into_iter().flatten().collect();
        for zone in targets {
            let start = self.suite.start(Side::Ours, &self.suite.machine(), None, Some(zone.clone()));
            let got = self.run(Side::Ours, &start).await?.instance;
            let id = got.id.clone();
            self.ensure(got.zone.as_ref() == Some(zone), || {
                format!("a start into {zone} made {id} in {:?}", got.zone)
            })?;
            self.eventually(
                Side::Ours,
                |l| l.iter().any(|i| i.id == id && i.zone.as_ref() == Some(zone)),
                |l| {
                    let now = l.iter().find(|i| i.id == id).map(|i| &i.zone);
                    format!("{id}, started into {zone}, is listed in {now:?}")
                },
            )
            .await?;
        }
        Ok(Outcome::Passed)
    }

    /// Machines in one batched start of this property.
    const BATCH: usize = 3;

    async fn batched_starts(&self) -> Result<Outcome, ContractError> {
        let zone = self.zone().await?;
        let starts: Vec<Start> =
            (0..Self::BATCH).map(|_| self.suite.start(Side::Ours, &self.suite.machine(), None, zone.clone())).collect();
        let first = &starts[0].params;
        let params = BatchStartParams {
            zone: zone.clone(),
            constraints: first.constraints.clone(),
            placement: None,
            volumes: Vec::new(),
            extra_tags: Default::default(),
            client_token: format!("{}+{}", first.client_token, starts.len()),
            members: starts
                .iter()
                .map(|s| BatchMember {
                    machine: s.machine.clone(),
                    nonce: s.nonce.clone(),
                    tags: s.params.tags.clone(),
                    distribution_group: Vec::new(),
                })
                .collect(),
            capacity: Default::default(),
            spot_max_price: None,
        };
        let answer = self.call("start_instances", self.suite.ours.start_instances(params.clone()).await)?;
        let made = self.launched(&starts, &answer)?;
        self.ensure(made.iter().any(Option::is_some), || "a batched start launched no instance at all".into())?;
        // The same call again: the same instance for each machine, nothing new.
        let again = self.call("start_instances", self.suite.ours.start_instances(params).await)?;
        let repeated = self.launched(&starts, &again)?;
        self.ensure(repeated == made, || {
            format!(
                "a repeat of batch token {}+{} answered {repeated:?}, not {made:?}",
                first.client_token,
                starts.len()
            )
        })?;
        for (start, id) in starts.iter().zip(&made) {
            let want: BTreeSet<InstanceId> = id.iter().cloned().collect();
            let (machine, tags) = (start.machine.clone(), start.params.tags.clone());
            let of_machine = |l: &[CloudInstance]| -> BTreeSet<InstanceId> {
                l.iter().filter(|i| i.tags.machine.as_ref() == Some(&machine)).map(|i| i.id.clone()).collect()
            };
            self.eventually(
                Side::Ours,
                |l| of_machine(l) == want && l.iter().filter(|i| want.contains(&i.id)).all(|i| i.tags == tags),
                |l| format!("machine {machine} is listed with {:?} after a batched start, not {want:?}", of_machine(l)),
            )
            .await?;
            self.eventually_of_start(&start.machine, &start.nonce, &want).await?;
        }
        Ok(Outcome::Passed)
    }

    /// Checks a batched start's answer (one entry per machine, each instance tagged with its
    /// own machine and start, in the call's zone, none twice); the instance of each machine,
    /// `None` for one refused (a partial launch), recorded for the clean-up.
    fn launched(
        &self,
        starts: &[Start],
        answer: &[Result<StartedInstance, BrokerError>],
    ) -> Result<Vec<Option<InstanceId>>, ContractError> {
        self.ensure(answer.len() == starts.len(), || {
            format!("a batched start of {} machines answered {} entries", starts.len(), answer.len())
        })?;
        let mut made = Vec::with_capacity(starts.len());
        for (i, (start, entry)) in starts.iter().zip(answer).enumerate() {
            let Ok(got) = entry else {
                made.push(None);
                continue;
            };
            let got = &got.instance;
            self.made.borrow_mut().push((true, got.id.clone()));
            let want = &start.params.tags;
            self.ensure(got.tags == *want, || {
                format!("launch index {i} of a batched start is tagged {:?}, not {want:?} (its machine's)", got.tags)
            })?;
            self.ensure(got.zone == start.params.zone, || {
                format!("launch index {i} of a batched start into {:?} landed in {:?}", start.params.zone, got.zone)
            })?;
            self.ensure(!made.contains(&Some(got.id.clone())), || format!("{} answered for two machines", got.id))?;
            made.push(Some(got.id.clone()));
        }
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    //! The batched-start property against the fake cloud (native batching, a partial launch,
    //! the per-machine fallback) and against batching brokers broken on purpose.

    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::ports::{BatchStarted, BrokerFuture};
    use crate::testing::{FakeBroker, FakeCloud, PartialLaunch, PausedSystem};

    const OURS: &str = "model-contract";
    const THEIRS: &str = "model-stranger";

    /// What a batching mutant gets wrong.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Flaw {
        /// None: the fake cloud's own batched call, through the wrapper.
        Nothing,
        /// Every instance of a call is tagged with the first machine's tags.
        TagsAllWithTheFirstMachine,
        /// Every call gets a fresh client token: a repeated batch makes new instances.
        IgnoresTheBatchToken,
        /// Answers the instances in reverse launch order.
        Reorders,
        /// Does not batch: the per-machine fallback over the fake cloud's single starts.
        Fallback,
    }

    struct Mutant {
        inner: FakeBroker,
        flaw: Flaw,
        calls: AtomicU32,
    }

    impl Broker for Mutant {
        fn start_instance(&self, params: StartInstanceParams) -> BrokerFuture<StartedInstance> {
            self.inner.start_instance(params)
        }
        fn batches_starts(&self) -> bool {
            self.flaw != Flaw::Fallback
        }
        fn start_instances(&self, mut params: BatchStartParams) -> BrokerFuture<BatchStarted> {
            match self.flaw {
                Flaw::Fallback => {
                    // The trait's default, as a broker without batching has it.
                    let calls: Vec<_> = (0..params.members.len())
                        .filter_map(|i| params.member_params(i))
                        .map(|p| self.inner.start_instance(p))
                        .collect();
                    return Box::pin(async move {
                        let mut out = Vec::new();
                        for c in calls {
                            out.push(c.await);
                        }
                        Ok(out)
                    });
                }
                Flaw::TagsAllWithTheFirstMachine => {
                    let tags = params.members[0].tags.clone();
                    for m in &mut params.members {
                        m.tags = tags.clone();
                    }
                }
                Flaw::IgnoresTheBatchToken => {
                    params.client_token =
                        format!("{}~{}", params.client_token, self.calls.fetch_add(1, Ordering::Relaxed));
                }
                Flaw::Nothing | Flaw::Reorders => {}
            }
            let call = self.inner.start_instances(params);
            let reorder = self.flaw == Flaw::Reorders;
            Box::pin(async move {
                let mut answer = call.await?;
                if reorder {
                    answer.reverse();
                }
                Ok(answer)
            })
        }
        fn stop_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
            self.inner.stop_instances(ids)
        }
        fn all_instances(&self) -> BrokerFuture<Vec<CloudInstance>> {
            self.inner.all_instances()
        }
        fn supports_zones(&self) -> bool {
            self.inner.supports_zones()
        }
        fn availability_zones(&self) -> BrokerFuture<Vec<crate::ports::AvailabilityZone>> {
            self.inner.availability_zones()
        }
        fn release_instances(&self, ids: Vec<InstanceId>) -> BrokerFuture<()> {
            self.inner.release_instances(ids)
        }
    }

    /// The batched-start check of a mutant over a zoned fake cloud (`partial`: the cloud
    /// launches only the first machine of the first call).
    fn check(flaw: Flaw, partial: bool) -> Result<Outcome, ContractError> {
        PausedSystem::new().block_on(async move {
            let cloud = FakeCloud::with_zones(OURS, &["az1", "az2"]);
            if partial {
                cloud.add_partial_launch(PartialLaunch {
                    zone: None,
                    machine: None,
                    launched: 1,
                    times: 1,
                    message: "InsufficientInstanceCapacity".into(),
                });
            }
            let ours = Mutant { inner: cloud.broker(), flaw, calls: AtomicU32::new(0) };
            let theirs = cloud.broker_for(THEIRS);
            let suite = BrokerContract::new(&ours, &theirs, ContractConfig::new(OURS, THEIRS));
            suite.check(Property::BatchedStarts).await
        })
    }

    #[test]
    fn the_fake_clouds_batched_start_keeps_the_contract() {
        assert_eq!(check(Flaw::Nothing, false).unwrap(), Outcome::Passed);
        assert_eq!(check(Flaw::Nothing, true).unwrap(), Outcome::Passed, "a partial launch is within the contract");
        assert_eq!(check(Flaw::Fallback, false).unwrap(), Outcome::Passed, "so is the per-machine fallback");
    }

    #[test]
    fn broken_batching_fails_the_property() {
        let says = |flaw, what: &str| {
            let err = check(flaw, false).expect_err("a broken broker must fail");
            assert_eq!(err.property(), Property::BatchedStarts);
            assert!(err.to_string().contains(what), "{err}");
        };
        says(Flaw::TagsAllWithTheFirstMachine, "launch index 1 of a batched start is tagged");
        says(Flaw::IgnoresTheBatchToken, "a repeat of batch token");
        says(Flaw::Reorders, "launch index 0 of a batched start is tagged");
    }
}
