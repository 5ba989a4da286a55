//! The PostgreSQL schema: versioned migrations ([`PG_SCHEMA_VERSION`](super::PG_SCHEMA_VERSION),
//! table `schema_migrations`), each a statement batch applied in order at each connection
//! (`connect.rs`), and the epochs' record the leader's fence writes to.

/// Version 1: the whole model, the simulated cloud, and the leader lease.
pub(super) const SCHEMA_V1: &str = r#"
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE constraints (
    id BIGSERIAL PRIMARY KEY,
    spec TEXT NOT NULL UNIQUE,
    zones TEXT,
    arch TEXT,
    cores BIGINT,
    mem_mb BIGINT,
    root_disk_mb BIGINT,
    instance_type TEXT,
    spaces TEXT,
    tags TEXT
);
CREATE TABLE applications (
    name TEXT PRIMARY KEY,
    constraints_id BIGINT REFERENCES constraints(id)
);
CREATE TABLE machines (
    seq BIGINT PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    life TEXT NOT NULL DEFAULT 'alive',
    status TEXT NOT NULL DEFAULT 'pending',
    status_message TEXT NOT NULL DEFAULT '',
    instance_status TEXT NOT NULL DEFAULT '',
    instance_status_message TEXT NOT NULL DEFAULT '',
    instance TEXT,
    zone TEXT,
    nonce TEXT,
    display_name TEXT NOT NULL DEFAULT '',
    zones TEXT,
    keep_instance BOOLEAN NOT NULL DEFAULT false,
    transient BOOLEAN NOT NULL DEFAULT false,
    constraints_id BIGINT REFERENCES constraints(id),
    placement TEXT,
    application TEXT,
    changed_at TEXT,
    manual BOOLEAN NOT NULL DEFAULT false,
    address TEXT
);
CREATE INDEX machines_by_application ON machines(application) WHERE application IS NOT NULL;
CREATE FUNCTION machines_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (TG_OP = 'INSERT' AND NEW.changed_at IS NULL)
       OR (TG_OP = 'UPDATE' AND NEW.changed_at IS NOT DISTINCT FROM OLD.changed_at) THEN
        NEW.changed_at := to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"');
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER machines_stamp BEFORE INSERT OR UPDATE ON machines
    FOR EACH ROW EXECUTE FUNCTION machines_stamp();
CREATE TABLE instances (
    seq BIGINT PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    zone TEXT,
    model TEXT,
    machine TEXT,
    start TEXT,
    client_token TEXT UNIQUE
);
CREATE TABLE leader_lease (
    model_uuid TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
"#;

/// Every migration, in order: version `n` takes a database from `n - 1` to `n`.
/// Version 2: each machine's start attempts and its last start error (`machine show`).
pub(super) const SCHEMA_V2: &str = "
ALTER TABLE machines ADD COLUMN IF NOT EXISTS start_attempts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE machines ADD COLUMN IF NOT EXISTS last_start_error TEXT;
";

/// Version 3: the epochs' record ([`EPOCH_TABLES_SQL`]): each lease acquisition and the writes
/// made under each epoch, ordered by one sequence (what proves no write committed under a
/// stale epoch).
pub(super) const MIGRATIONS: &[(i64, &str)] = &[
    (1, SCHEMA_V1),
    (2, SCHEMA_V2),
    (3, EPOCH_TABLES_SQL),
    (4, SCHEMA_V4),
    (5, SCHEMA_V5),
    (6, SCHEMA_V6),
    (7, SCHEMA_V7),
    (8, SCHEMA_V8),
    (9, SCHEMA_V9),
    (10, SCHEMA_V10),
    (11, SCHEMA_V11),
    (12, SCHEMA_V12),
];

/// The epochs' record, created by migration 3 (and by the lease where missing, so that the
/// lease can be used and tested on its own): `fence_seq` orders acquisitions and fenced writes;
/// `lease_epochs` has a row per acquisition (`acquired_seq` drawn after the lease row was
/// locked); `epoch_writes` a row per model, epoch, holder and writing session (`writer`, its
/// backend's process id: schema version 9; the writes' count and the last `fence_seq` value
/// drawn by one of them while it held the lease row share-locked).
pub(crate) const EPOCH_TABLES_SQL: &str = "
CREATE SEQUENCE IF NOT EXISTS fence_seq;
CREATE TABLE IF NOT EXISTS lease_epochs (
    model_uuid TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    holder TEXT NOT NULL,
    acquired_seq BIGINT NOT NULL,
    acquired_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (model_uuid, epoch)
);
CREATE TABLE IF NOT EXISTS epoch_writes (
    model_uuid TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    holder TEXT NOT NULL,
    writes BIGINT NOT NULL,
    first_seq BIGINT NOT NULL,
    last_seq BIGINT NOT NULL,
    writer INT NOT NULL DEFAULT 0,
    PRIMARY KEY (model_uuid, epoch, holder, writer)
);
";

/// What a fenced write records, in its transaction, once the fence passed (the lease row is
/// share-locked, so no acquisition can draw from `fence_seq` until this commits): `$1` model,
/// `$2` holder, `$3` epoch.
pub(crate) const RECORD_WRITE_SQL: &str =
    "INSERT INTO epoch_writes AS w (model_uuid, epoch, holder, writer, writes, first_seq, last_seq)
    SELECT $1, $3, $2, pg_backend_pid(), 1, s, s FROM nextval('fence_seq') AS s
    ON CONFLICT (model_uuid, epoch, holder, writer) DO UPDATE SET writes = w.writes + 1, last_seq = EXCLUDED.last_seq";

/// [`RECORD_WRITE_SQL`] for a group commit's fenced writes, recorded at once just before its
/// commit (the lease row share-locked since the group checked the fence): `$4` writes.
pub(super) const RECORD_WRITES_SQL: &str = "INSERT INTO epoch_writes AS w (model_uuid, epoch, holder, writer, writes, first_seq, last_seq)
    SELECT $1, $3, $2, pg_backend_pid(), $4, s, s FROM nextval('fence_seq') AS s
    ON CONFLICT (model_uuid, epoch, holder, writer) DO UPDATE SET writes = w.writes + EXCLUDED.writes, last_seq = EXCLUDED.last_seq";

/// Version 4: the created API tokens (their SHA-256 only), looked up by hash on every request
/// that carries one.
pub(super) const SCHEMA_V4: &str = "
CREATE TABLE IF NOT EXISTS api_tokens (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    scope TEXT NOT NULL,
    sha256 TEXT NOT NULL UNIQUE,
    created TEXT NOT NULL,
    revoked TEXT
);
";

/// Version 5: start intents (each start's client token, machine and parameters, written fenced
/// before the cloud call and dropped once settled; `service::cloud::intents`).
pub(super) const SCHEMA_V5: &str = "
CREATE TABLE IF NOT EXISTS start_intents (
    seq BIGSERIAL PRIMARY KEY,
    client_token TEXT NOT NULL UNIQUE,
    machine TEXT NOT NULL,
    params TEXT NOT NULL
);
";

/// Version 6: a partial index of the machines in error, so that `/v1/status` counts them
/// without reading every machine.
pub(super) const SCHEMA_V6: &str = "
CREATE INDEX IF NOT EXISTS machines_in_error ON machines(seq) WHERE status = 'error' OR instance_status = 'provisioning error';
";

/// Version 10: the uuid of the model a token is scoped to (valid for that model only, not for
/// a later model of the same name).
pub(super) const SCHEMA_V10: &str = "ALTER TABLE api_tokens ADD COLUMN IF NOT EXISTS model_uuid TEXT;";

/// Version 11 (issue 33): each machine's capacity preference (`NULL`: `on-demand`) and the
/// capacity its instance runs on (`NULL`: not known), and each application's capacity
/// preference.
pub(super) const SCHEMA_V11: &str = "
ALTER TABLE machines ADD COLUMN IF NOT EXISTS capacity TEXT;
ALTER TABLE machines ADD COLUMN IF NOT EXISTS capacity_type TEXT;
ALTER TABLE applications ADD COLUMN IF NOT EXISTS capacity TEXT;
";

/// Version 12 (issue 37): the trace context (W3C `traceparent`) of the request that added a
/// machine (`NULL`: not traced), read with its provisioning info.
pub(super) const SCHEMA_V12: &str = "ALTER TABLE machines ADD COLUMN IF NOT EXISTS trace_parent TEXT;";

/// Version 7: the model a token is scoped to (`NULL`: every model).
pub(super) const SCHEMA_V7: &str = "ALTER TABLE api_tokens ADD COLUMN IF NOT EXISTS model TEXT;";

/// Version 8: the provisioner's writes to a machine's row made *HOT* (heap-only: the new row
/// version on the same page, no index entry written). An update is HOT only if no index names
/// a column it changes (a partial index's predicate counts) and the page has room, so the
/// machines in error are kept in a table of their own (`machine_errors`, by triggers that fire
/// only when a machine goes into or out of error) instead of version 6's partial index over
/// `status` and `instance_status`, and the machines' pages are filled to 70 % (room for a few
/// versions of their rows; the dead ones are pruned as the page is next written). Measured: a
/// start's two updates, 15 rows a statement over 100,000 machines, 5.9 s → 4.1 s, 87 % of them
/// HOT (`docs/performance.md`).
pub(super) const SCHEMA_V8: &str = "
DROP INDEX IF EXISTS machines_in_error;
ALTER TABLE machines SET (fillfactor = 70);
CREATE TABLE IF NOT EXISTS machine_errors (seq BIGINT PRIMARY KEY);
INSERT INTO machine_errors SELECT seq FROM machines
    WHERE status = 'error' OR instance_status = 'provisioning error' ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION machine_errors_track() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND (OLD.status = 'error' OR OLD.instance_status = 'provisioning error') THEN
        DELETE FROM machine_errors WHERE seq = OLD.seq;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND (NEW.status = 'error' OR NEW.instance_status = 'provisioning error') THEN
        INSERT INTO machine_errors (seq) VALUES (NEW.seq) ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER machine_errors_insert AFTER INSERT ON machines FOR EACH ROW
    WHEN (NEW.status = 'error' OR NEW.instance_status = 'provisioning error')
    EXECUTE FUNCTION machine_errors_track();
CREATE TRIGGER machine_errors_update AFTER UPDATE ON machines FOR EACH ROW
    WHEN ((OLD.status = 'error' OR OLD.instance_status = 'provisioning error')
          IS DISTINCT FROM (NEW.status = 'error' OR NEW.instance_status = 'provisioning error'))
    EXECUTE FUNCTION machine_errors_track();
CREATE TRIGGER machine_errors_delete AFTER DELETE ON machines FOR EACH ROW
    WHEN (OLD.status = 'error' OR OLD.instance_status = 'provisioning error')
    EXECUTE FUNCTION machine_errors_track();
";

/// Version 9: the epochs' record keeps a row per writing session (`epoch_writes.writer`, the
/// backend's process id), so that two sessions of one holder (the model's store and the
/// simulated cloud's, `Store::companion`) do not queue on one row lock for every group commit;
/// the audit (`lease::pg::audit_epochs`) checks each row as before. And `changed_at` stamped by
/// the trigger only for a write that does not stamp it itself (`WHEN` clauses: the function is not even called for the others). The provisioner's
/// set-based writes and the adds stamp their rows with one value a statement
/// ([`stamp_sql`]), so that no row they write runs the PL/pgSQL function (7 % of the server's
/// time at 100,000 machines went to calling it once a row). Any other write leaves the column
/// alone and is stamped as before.
pub(super) const SCHEMA_V9: &str = "
ALTER TABLE epoch_writes ADD COLUMN IF NOT EXISTS writer INT NOT NULL DEFAULT 0;
ALTER TABLE epoch_writes DROP CONSTRAINT IF EXISTS epoch_writes_pkey;
ALTER TABLE epoch_writes ADD PRIMARY KEY (model_uuid, epoch, holder, writer);
DROP TRIGGER IF EXISTS machines_stamp ON machines;
DROP TRIGGER IF EXISTS machines_stamp_insert ON machines;
DROP TRIGGER IF EXISTS machines_stamp_update ON machines;
CREATE TRIGGER machines_stamp_insert BEFORE INSERT ON machines FOR EACH ROW
    WHEN (NEW.changed_at IS NULL) EXECUTE FUNCTION machines_stamp();
CREATE TRIGGER machines_stamp_update BEFORE UPDATE ON machines FOR EACH ROW
    WHEN (NEW.changed_at IS NOT DISTINCT FROM OLD.changed_at) EXECUTE FUNCTION machines_stamp();
";
