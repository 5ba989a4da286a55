//! The model's store: machines, lives, statuses, instance ids, settings, tokens, start intents
//! and the simulated cloud's instances, in SQLite (the data directory's database, the default)
//! or PostgreSQL (feature `postgres`, what replicas share).
//!
//! The layout, by backend:
//! - `backend.rs`: [`StoreBackend`], every read and write as one trait (each write one
//!   transaction), and the operations both backends derive alike; `records.rs` and `errors.rs`:
//!   the records, counts and errors both share; `writes.rs`: write-behind units as data.
//! - `sqlite/`: [`StoreCore`], the plain core over one `rusqlite::Connection` (WAL journal,
//!   `synchronous=FULL`: a transaction that returned survives `kill -9` and a power cut),
//!   implementing [`StoreBackend`] itself; split into schema, rows, group commits, instances,
//!   tokens and start intents.
//! - `postgres/`: `PgStore` (feature `postgres`), likewise, over one connection with
//!   versioned migrations, the leader's fence and change notifications.
//! - `actor.rs` and `messages.rs`: [`StoreActor`] owns one backend on its lane's thread
//!   (database calls block) and groups the units of work it is sent into group commits;
//!   [`Store`] is the cheap, cloneable client every other part of the service talks to.
//!   `lanes.rs`: the threads the stores run on, a fixed set shared by every store of the
//!   process (each store pinned to one), so that an idle model costs no thread. The store also plays the model's machine watcher: after each committed change it
//!   sends `MachinesChanged` (and `RetryTick` after a retry) to its watchers, as Juju's model
//!   does.
//! - `behaviour.rs` (tests): the behaviour suite, written once against `&mut dyn StoreBackend`
//!   and run on both backends; each backend's own tests are in its folder.

mod actor;
mod backend;
#[cfg(test)]
mod behaviour;
mod errors;
mod lanes;
mod messages;
#[cfg(feature = "postgres")]
mod postgres;
mod records;
mod sqlite;
mod writes;

pub(crate) use actor::Store;
#[cfg(feature = "postgres")]
pub(crate) use backend::Fence;
pub(crate) use backend::StoreBackend;
pub(crate) use errors::StoreError;
pub(crate) use lanes::configure as configure_threads;
pub(crate) use messages::CountsChanged;
#[cfg(feature = "postgres")]
pub(crate) use postgres::MIGRATION_LOCK;
#[cfg(feature = "postgres")]
pub use postgres::PG_SCHEMA_VERSION;
#[cfg(feature = "postgres")]
pub(crate) use postgres::{Notice, PgStore, EPOCH_TABLES_SQL};
#[cfg(test)]
pub(crate) use records::InstanceRecord;
pub(crate) use records::{ApplicationRecord, MachineRecord, NewMachine, StoreCounts};
pub(crate) use sqlite::DB_FILE;
pub(crate) use writes::{Write, Written};
