//! The embedded store: one SQLite database in the data directory holding the model (machines,
//! lives, statuses, instance ids, settings) and the simulated cloud's instances.
//!
//! [`StoreCore`] is the plain core: every read and write as a method over one
//! `rusqlite::Connection`, each write one transaction (WAL journal, `synchronous=FULL`: a
//! transaction that returned has been fsynced, so it survives `kill -9` and a power cut).
//! [`StoreActor`] owns the core on a `SyncArbiter` thread of its own (SQLite calls block), and
//! [`Store`] is the cheap, cloneable client every other part of the service talks to. The
//! actor also plays the model's machine watcher: after each committed change it sends
//! `MachinesChanged` (and `RetryTick` after a retry) to its watchers, as Juju's model does.

mod actor;
mod backend;
#[cfg(test)]
mod behaviour;
mod errors;
mod messages;
#[cfg(feature = "postgres")]
mod postgres;
mod records;
mod sqlite;
mod writes;

pub use actor::{Store, StoreActor};
pub use backend::{Fence, StoreBackend};
pub use errors::{PgFailure, StoreError};
pub use messages::{Apply, CountsChanged, Exec, SetFence, Watch, WatchCounts, WatchRetries};
#[cfg(feature = "postgres")]
pub(crate) use postgres::MIGRATION_LOCK;
#[cfg(feature = "postgres")]
pub use postgres::{Notice, PgStore, CHANGES_CHANNEL, EPOCH_TABLES_SQL, PG_SCHEMA_VERSION, RECORD_WRITE_SQL};
pub use records::{ApplicationRecord, InstanceRecord, MachineRecord, NewMachine, Settings, StoreCounts};
pub use sqlite::{StoreCore, DB_FILE, SCHEMA_VERSION};
pub use writes::{Write, Written};
