//! `[[events]]`: an event is `at` plus exactly one action key, and [`Action`] is that key's
//! meaning once validated. One table, the invocation of `event_actions!` below, maps every key to
//! its action: the event struct's fields, the action enum, [`Action::key`] (naming),
//! [`EventSpec::new`] (what the generator writes) and [`EventSpec::action`] (reading) all come
//! from it, so a new action is one line there.
//!
//! An event with no action key, or with several, has no action: [`EventSpec::action`] says so
//! as an error, and validation refuses such a file.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::spec::{
    DestroyModelSpec, FailNextSpec, InterruptSpec, LaunchSpec, MachineSpec, SetConstraintsSpec, SetLifeSpec,
    SetStatusSpec, SetZonesSpec,
};
use super::units::{Dur, Workers};
use crate::model::HarvestMode;

/// An event that does not have exactly one action key.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EventError {
    /// No action key.
    #[error("an event needs exactly one action key (add_machine, set_life, ...); it has none")]
    NoAction,
    /// Several action keys (in the table's order).
    #[error("an event needs exactly one action key; it has {}", .0.join(", "))]
    SeveralActions(Vec<&'static str>),
}

/// How an action key's value in the file becomes the action's payload, and back.
trait ActionValue: Sized {
    /// What the action carries.
    type Payload;
    fn into_payload(self) -> Self::Payload;
    fn from_payload(payload: Self::Payload) -> Self;
}

/// The value is the payload.
macro_rules! same_value {
    ($($t:ty),* $(,)?) => {$(
        impl ActionValue for $t {
            type Payload = $t;
            fn into_payload(self) -> $t {
                self
            }
            fn from_payload(payload: $t) -> $t {
                payload
            }
        }
    )*};
}
same_value!(SetLifeSpec, SetConstraintsSpec, SetStatusSpec, HarvestMode, Vec<String>, SetZonesSpec, String);
same_value!(LaunchSpec, FailNextSpec, DestroyModelSpec, InterruptSpec);

/// `set_workers = N`: the pool size, checked while parsing.
impl ActionValue for Workers {
    type Payload = usize;
    fn into_payload(self) -> usize {
        self.0
    }
    fn from_payload(payload: usize) -> Self {
        Workers(payload)
    }
}

/// `restart = true`: the action carries nothing (`false` is refused by validation).
/// A machine spec is large: the action boxes it.
impl ActionValue for MachineSpec {
    type Payload = Box<MachineSpec>;
    fn into_payload(self) -> Box<MachineSpec> {
        Box::new(self)
    }
    fn from_payload(payload: Box<MachineSpec>) -> Self {
        *payload
    }
}

impl ActionValue for bool {
    type Payload = ();
    fn into_payload(self) {}
    fn from_payload((): ()) -> Self {
        true
    }
}

/// Generates [`EventSpec`], [`Action`] and their mapping from one table of
/// `key: value type => Variant(payload type)` (payload omitted: a unit variant).
macro_rules! event_actions {
    ($( $(#[$doc:meta])* $key:ident: $value:ty => $variant:ident $(($payload:ty))?; )*) => {
        /// `[[events]]`: `at` plus exactly one action key.
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct EventSpec {
            /// When.
            pub at: Dur,
            $(
                $(#[$doc])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $key: Option<$value>,
            )*
        }

        /// One event's action, once validated.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Action {
            $(
                #[doc = concat!("See [`EventSpec::", stringify!($key), "`].")]
                $variant $(($payload))?,
            )*
        }

        impl Action {
            /// The action's key in the file.
            pub fn key(&self) -> &'static str {
                match self {
                    $( event_actions!(@pattern $variant, _payload $(, $payload)?) => stringify!($key), )*
                }
            }
        }

        impl EventSpec {
            /// An event at `at` doing `action`.
            pub fn new(at: Duration, action: Action) -> Self {
                let mut e = EventSpec { at: Dur(at), ..EventSpec::default() };
                match action {
                    $(
                        event_actions!(@pattern $variant, payload $(, $payload)?) => {
                            e.$key = Some(ActionValue::from_payload(event_actions!(@payload payload $(, $payload)?)))
                        }
                    )*
                }
                e
            }

            /// The action keys given, in the table's order, each with its action.
            fn given(&self) -> Vec<(&'static str, Action)> {
                let mut out = Vec::new();
                $(
                    if let Some(value) = self.$key.clone() {
                        let payload = ActionValue::into_payload(value);
                        out.push((stringify!($key), event_actions!(@build $variant, payload $(, $payload)?)));
                    }
                )*
                out
            }
        }
    };
    (@pattern $variant:ident, $bind:ident, $payload:ty) => { Action::$variant($bind) };
    (@pattern $variant:ident, $bind:ident) => { Action::$variant };
    (@payload $bind:ident, $payload:ty) => { $bind };
    (@payload $bind:ident) => { () };
    (@build $variant:ident, $bind:ident, $payload:ty) => { Action::$variant($bind) };
    (@build $variant:ident, $bind:ident) => {{
        let () = $bind;
        Action::$variant
    }};
}

event_actions! {
    /// A machine is added.
    add_machine: MachineSpec => AddMachine(Box<MachineSpec>);
    /// A machine's life changes.
    set_life: SetLifeSpec => SetLife(SetLifeSpec);
    /// Someone else writes a status.
    set_status: SetStatusSpec => SetStatus(SetStatusSpec);
    /// Model config: harvest mode.
    set_harvest_mode: HarvestMode => SetHarvestMode(HarvestMode);
    /// Model config: pool size.
    set_workers: Workers => SetWorkers(usize);
    /// `retry-provisioning`.
    retry_provisioning: Vec<String> => RetryProvisioning(Vec<String>);
    /// The cloud's zone list changes.
    set_zones: SetZonesSpec => SetZones(SetZonesSpec);
    /// Out-of-band stop.
    cloud_stop: String => CloudStop(String);
    /// Out-of-band start.
    cloud_start: String => CloudStart(String);
    /// Out-of-band terminate.
    cloud_terminate: String => CloudTerminate(String);
    /// A machine's constraints change (an addition, issue 34: its instance may drift).
    set_constraints: SetConstraintsSpec => SetConstraints(SetConstraintsSpec);
    /// The image every later start uses changes (an addition, issue 34: instances started
    /// from another have drifted).
    set_image: String => SetImage(String);
    /// The instance's status checks start failing (an addition, issue 34).
    cloud_impair: String => CloudImpair(String);
    /// The instance's status checks pass again (an addition, issue 34).
    cloud_recover: String => CloudRecover(String);
    /// Out-of-band launch.
    cloud_launch: LaunchSpec => CloudLaunch(LaunchSpec);
    /// Break the next calls.
    fail_next: FailNextSpec => FailNext(FailNextSpec);
    /// Crash and restart the provisioner.
    restart: bool => Restart;
    /// Destroy the model.
    destroy_model: DestroyModelSpec => DestroyModel(DestroyModelSpec);
    /// The cloud warns it takes an instance away, and does when the warning runs out (an
    /// addition, issue 33).
    interrupt: InterruptSpec => Interrupt(InterruptSpec);
}

impl EventSpec {
    /// The event's one action; an event with none or several has no action.
    pub fn action(&self) -> Result<Action, EventError> {
        let mut given = self.given();
        match given.len() {
            0 => Err(EventError::NoAction),
            1 => Ok(given.remove(0).1),
            _ => Err(EventError::SeveralActions(given.into_iter().map(|(key, _)| key).collect())),
        }
    }
}
