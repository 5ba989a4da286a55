//! `provisioner serve`: opens the data directory, wires the store, the simulated cloud, the
//! provisioner and the HTTP API, and runs until SIGTERM (or SIGINT), then shuts down in order:
//! the HTTP server stops taking requests, the provisioner starts nothing new, in-flight cloud
//! calls are given `shutdown_grace` to finish and be recorded, then the actors stop.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use actix::Actor;
use actix_rt::time::Instant;
use thiserror::Error;

use crate::config::ProvisionerConfig;
use crate::service::cloud::sim::{SimCloud, SimSettings};
use crate::service::http;
use crate::service::metrics::{MeteredBroker, Metrics};
use crate::service::models::{DirectoryStore, ModelHost, Shared};
use crate::service::runtime::ModelRuntime;
use crate::service::runtime::StoreModel;
use crate::service::settings::{BrokerKind, ServeSettings, StoreUrl};

/// What holds the starts a previous run or leader may have left in flight, repeated before the
/// provisioner starts: the simulated cloud's pending instances, or the start intents a real
/// cloud's broker wrote before its calls (`service::cloud::intents`).
#[derive(Clone)]
pub enum PendingStarts {
    /// The simulated cloud lands its pending instances.
    Sim(Box<SimCloud>),
    /// A real cloud's starts are repeated by their client tokens.
    #[cfg_attr(not(feature = "ec2"), allow(dead_code))]
    Intents(crate::service::cloud::intents::IntentBroker),
}

impl PendingStarts {
    /// Repeats them: how many.
    pub async fn resume(&self) -> Result<usize, StoreError> {
        match self {
            PendingStarts::Sim(sim) => sim.resume().await,
            PendingStarts::Intents(intents) => intents.resume().await,
        }
    }

    /// Sets the leader's fence on the cloud's own store, if it has one apart from the model's
    /// (the simulated cloud on PostgreSQL: [`Store::companion`]); the intents' store is the
    /// model's, fenced with it.
    #[cfg(feature = "postgres")]
    async fn set_fence(&self, fence: crate::service::store::Fence) -> Result<(), StoreError> {
        match self {
            PendingStarts::Sim(sim) => sim.set_fence(fence).await,
            PendingStarts::Intents(_) => Ok(()),
        }
    }
}
use crate::service::store::{Store, StoreError, DB_FILE};

/// The token file's name inside the data directory.
pub const TOKEN_FILE: &str = "token";

/// Why the service could not start or run. [`ServeError::exit_code`] says how the binary exits.
#[derive(Debug, Error)]
pub enum ServeError {
    /// `--broker ec2` in a build without the EC2 broker (exit 2).
    #[error("this build has no EC2 broker: build with `--features serve,ec2`, or use --broker sim")]
    NoEc2Broker,
    /// `[sim] out_of_capacity` has an entry that is not `TYPE:ZONE` (exit 2).
    #[error("[sim] out_of_capacity: every entry must be TYPE:ZONE, e.g. \"m5.large:az1\"")]
    SimOutOfCapacity,
    /// The EC2 broker's settings are incomplete or wrong (exit 2).
    #[cfg(feature = "ec2")]
    #[error("{0}")]
    Ec2Settings(#[source] crate::adapters::ec2::Ec2ConfigError),
    /// The EC2 broker cannot list its availability zones (exit 1).
    #[cfg(feature = "ec2")]
    #[error("EC2: cannot list availability zones: {0}")]
    Ec2Zones(#[source] crate::ports::BrokerError),
    /// `--init` on a data directory that holds a model's database (exit 2).
    #[error(
        "--init creates a new model only in a data directory without one, and {} already holds model database {}; \
         to start over, stop the service and move provisioner.db, provisioner.db-wal and provisioner.db-shm aside first",
        dir.display(),
        db.display()
    )]
    InitOverModel {
        /// The data directory.
        dir: PathBuf,
        /// Its database.
        db: PathBuf,
    },
    /// The data directory cannot be used as it is (exit 1): a model it held is lost, or its
    /// token file is empty.
    #[error("cannot use data directory {path}: {message}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why, and what to do.
        message: String,
    },
    /// A file operation in the data directory failed (exit 1).
    #[error("cannot use data directory {path}: {}{source}", op.context(file))]
    DataDirIo {
        /// The directory.
        path: PathBuf,
        /// What was being done.
        op: FileOp,
        /// To which file (the directory itself for [`FileOp::CreateDir`]).
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The database failed (exit 1).
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The models directory cannot be read or written (exit 1).
    #[error("{0}")]
    Models(#[source] crate::service::models::PersistError),
    /// `--store` names a store this build cannot open (exit 2).
    #[error("--store: {0}")]
    StoreUrl(String),
    /// `--store postgres://...` in a build without PostgreSQL (exit 2).
    #[error("--store: this build has no PostgreSQL store: build with `--features postgres`, or use --store sqlite")]
    NoPostgres,
    /// The database is damaged: the service will not run on it (exit 1).
    #[error(
        "the database {path} is damaged, so the service will not run on it ({source}). Restore provisioner.db \
         (with its provisioner.db-wal, if any) from a backup; or, to give up this model (its instances in the \
         cloud will no longer be managed), move provisioner.db, provisioner.db-wal and provisioner.db-shm aside \
         and start with `serve --init` to create a new model"
    )]
    Damaged {
        /// The database file.
        path: PathBuf,
        /// What the check found.
        #[source]
        source: StoreError,
    },
    /// The provisioner refused its configuration (exit 2).
    #[error("invalid provisioner configuration: {0}")]
    Provisioner(#[from] crate::config::ConfigError),
    /// The listen address cannot be bound (exit 1).
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The audit log cannot be opened (exit 2): the message names the file.
    #[error("{0}")]
    Audit(#[source] crate::service::audit::AuditError),
    /// The TLS certificate or key cannot be used (exit 2); the message names the file.
    #[error("{0}")]
    Tls(#[source] crate::service::tls::TlsError),
    /// Signals cannot be watched (exit 1).
    #[error("cannot watch {signal}: {source}")]
    Signals {
        /// `SIGTERM`, `SIGINT` or `Ctrl-C`.
        signal: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ServeError {
    /// 2 for bad usage or input, 1 for a failure at run time.
    pub fn exit_code(&self) -> u8 {
        match self {
            ServeError::NoEc2Broker
            | ServeError::InitOverModel { .. }
            | ServeError::Provisioner(_)
            | ServeError::StoreUrl(_)
            | ServeError::NoPostgres
            | ServeError::SimOutOfCapacity
            | ServeError::Tls(_)
            | ServeError::Audit(_) => 2,
            #[cfg(feature = "ec2")]
            ServeError::Ec2Settings(_) => 2,
            _ => 1,
        }
    }
}

/// A file operation on the data directory, as [`ServeError::DataDirIo`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOp {
    /// Creating the directory.
    CreateDir,
    /// Reading a file.
    Read,
    /// Creating a file.
    Create,
    /// Writing a file.
    Write,
    /// Removing a file.
    Remove,
    /// Moving a file aside.
    MoveAside,
    /// Making a file private (0600).
    MakePrivate,
}

impl FileOp {
    /// What was being done to `file`, as the error's text says it before the cause.
    fn context(self, file: &Path) -> String {
        let f = file.display();
        match self {
            FileOp::CreateDir => String::new(),
            FileOp::Read => format!("cannot read {f}: "),
            FileOp::Create => format!("cannot create {f}: "),
            FileOp::Write => format!("cannot write {f}: "),
            FileOp::Remove => format!("cannot remove {f}: "),
            FileOp::MoveAside => format!("cannot move {f} aside: "),
            FileOp::MakePrivate => format!("cannot make {f} private: "),
        }
    }
}

fn data_dir_error(path: &Path, message: String) -> ServeError {
    ServeError::DataDir { path: path.to_owned(), message }
}

/// The error of `op` on `file` in the data directory `path`.
fn data_dir_io(path: &Path, op: FileOp, file: &Path) -> impl FnOnce(std::io::Error) -> ServeError {
    let (path, file) = (path.to_owned(), file.to_owned());
    move |source| ServeError::DataDirIo { path, op, file, source }
}

/// The permission bits others than the owner have on `path` (0 where there are no such bits).
fn shared_mode(path: &Path) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).ok().map(|m| m.permissions().mode() & 0o777).filter(|m| m & 0o077 != 0)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// Reads the API token from `dir/token`, or creates it (32 random bytes, hex; mode 0600). An
/// existing token file that others can read is used, with a warning.
pub fn ensure_token(dir: &Path) -> Result<String, ServeError> {
    match read_token(dir)? {
        Some(token) => Ok(token),
        None => write_new_token(dir),
    }
}

/// Reads the API token from `dir/token`, if there is one (an empty file is an error).
fn read_token(dir: &Path) -> Result<Option<String>, ServeError> {
    let path = dir.join(TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => {
            if let Some(mode) = shared_mode(&path) {
                tracing::warn!(
                    "the API token file {} is readable by others (mode {mode:o}): anyone who can read it can drive \
                     the API; make it private with `chmod 600 {}`",
                    path.display(),
                    path.display()
                );
            }
            Ok(Some(t.trim().to_owned()))
        }
        Ok(_) => Err(data_dir_error(dir, format!("{} is empty; delete it to get a new token", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(data_dir_io(dir, FileOp::Read, &path)(e)),
    }
}

/// Writes a new API token to `dir/token` (mode 0600, fsynced) and answers it.
fn write_new_token(dir: &Path) -> Result<String, ServeError> {
    write_token(dir, crate::service::token::new_secret())
}

/// Writes `token` to `dir/token` atomically: whole to `token.tmp` (mode 0600), synced, renamed
/// over `token`, the directory synced; a crash leaves no token file or the whole one.
fn write_token(dir: &Path, token: String) -> Result<String, ServeError> {
    let path = dir.join(TOKEN_FILE);
    let tmp = dir.join(format!("{TOKEN_FILE}.tmp"));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&tmp).map_err(data_dir_io(dir, FileOp::Create, &tmp))?;
    f.write_all(format!("{token}\n").as_bytes()).and_then(|()| f.sync_all()).map_err(data_dir_io(
        dir,
        FileOp::Write,
        &tmp,
    ))?;
    std::fs::rename(&tmp, &path).map_err(data_dir_io(dir, FileOp::Create, &path))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(data_dir_io(dir, FileOp::Write, dir))?;
    Ok(token)
}

/// `name`, or `name.1`, `name.2`... : the first that does not exist.
fn aside(path: &Path) -> PathBuf {
    let base = path.with_file_name(format!(
        "{}.orphaned",
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    ));
    let mut candidate = base.clone();
    let mut n = 0;
    while candidate.exists() {
        n += 1;
        candidate = PathBuf::from(format!("{}.{n}", base.display()));
    }
    candidate
}

/// Decides whether the data directory may be opened as it is, before anything is written to
/// it. A new model is created only in a directory with no database, no WAL and no token, or
/// with `init`; a zero-length database, or a WAL or token without their database, mean a model
/// existed here and was lost, so that is refused (its instances would be orphaned). With
/// `init` on such a directory, the leftovers are cleared (a WAL is moved aside, not replayed
/// into the new model). `init` on a directory that holds a database is refused.
/// A new database file is created private (0600; SQLite gives its WAL the same mode), and an
/// existing one that others can read is made private.
pub fn prepare_data_dir(dir: &Path, init: bool) -> Result<(), ServeError> {
    let db = dir.join(DB_FILE);
    let wal = dir.join(format!("{DB_FILE}-wal"));
    let shm = dir.join(format!("{DB_FILE}-shm"));
    let token = dir.join(TOKEN_FILE);
    let size = match std::fs::metadata(&db) {
        Ok(m) => Some(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(data_dir_io(dir, FileOp::Read, &db)(e)),
    };
    let recover = "restore it from a backup; or, to create a new model (the old model's instances in the cloud \
                   will no longer be managed), start with `serve --init`";
    match size {
        Some(n) if n > 0 && init => {
            return Err(ServeError::InitOverModel { dir: dir.to_owned(), db });
        }
        Some(0) if !init => {
            return Err(data_dir_error(
                dir,
                format!("the database {} is empty (zero length): the model it held is lost; {recover}", db.display()),
            ))
        }
        None if !init && (wal.exists() || token.exists()) => {
            let left: Vec<String> = [&wal, &token]
                .iter()
                .filter(|p| p.exists())
                .map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned())
                .collect();
            return Err(data_dir_error(
                dir,
                format!(
                    "the database {} is missing, but {} from an earlier run {} still there: the model is lost unless \
                     you {recover}",
                    db.display(),
                    left.join(" and "),
                    if left.len() > 1 { "are" } else { "is" }
                ),
            ));
        }
        _ => {}
    }
    if size.is_some_and(|n| n == 0) {
        std::fs::remove_file(&db).map_err(data_dir_io(dir, FileOp::Remove, &db))?;
    }
    if size.is_none_or(|n| n == 0) {
        // A new model: no leftovers of the old one may be replayed into it.
        if wal.exists() {
            let to = aside(&wal);
            std::fs::rename(&wal, &to).map_err(data_dir_io(dir, FileOp::MoveAside, &wal))?;
            tracing::warn!(from = %wal.display(), to = %to.display(), "moved the old model's write-ahead log aside");
        }
        if shm.exists() {
            std::fs::remove_file(&shm).map_err(data_dir_io(dir, FileOp::Remove, &shm))?;
        }
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        opts.open(&db).map_err(data_dir_io(dir, FileOp::Create, &db))?;
        if init {
            tracing::info!(database = %db.display(), "--init: creating a new model");
        }
    } else {
        #[cfg(unix)]
        for f in [&db, &wal, &shm] {
            if let Some(mode) = shared_mode(f) {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).map_err(data_dir_io(
                    dir,
                    FileOp::MakePrivate,
                    f,
                ))?;
                tracing::warn!(file = %f.display(), "the file was readable by others (mode {mode:o}); made it 0600");
            }
        }
    }
    Ok(())
}

/// Waits for SIGTERM or SIGINT.
async fn terminated() -> Result<&'static str, ServeError> {
    #[cfg(unix)]
    {
        use actix_rt::signal::unix::{signal as signal_stream, SignalKind};
        let watch = |kind, signal| signal_stream(kind).map_err(|source| ServeError::Signals { signal, source });
        let mut term = watch(SignalKind::terminate(), "SIGTERM")?;
        let mut int = watch(SignalKind::interrupt(), "SIGINT")?;
        Ok(tokio_select(term.recv(), int.recv()).await)
    }
    #[cfg(not(unix))]
    {
        actix_rt::signal::ctrl_c().await.map_err(|source| ServeError::Signals { signal: "Ctrl-C", source })?;
        Ok("Ctrl-C")
    }
}

#[cfg(unix)]
async fn tokio_select(
    term: impl std::future::Future<Output = Option<()>>,
    int: impl std::future::Future<Output = Option<()>>,
) -> &'static str {
    futures::pin_mut!(term, int);
    match futures::future::select(term, int).await {
        futures::future::Either::Left(_) => "SIGTERM",
        futures::future::Either::Right(_) => "SIGINT",
    }
}

/// Connects the EC2 broker and reads its zones (the ones machines may ask for).
#[cfg(feature = "ec2")]
async fn ec2_broker(
    s: &crate::service::settings::Ec2Settings,
    model_uuid: &str,
) -> Result<(crate::adapters::ec2::Ec2Broker, Vec<String>), ServeError> {
    let config = crate::adapters::ec2::Ec2Config {
        model_uuid: model_uuid.to_owned(),
        region: s.region.clone(),
        endpoint: s.endpoint.clone(),
        image_id: s.image.clone().unwrap_or_default(),
        instance_type: s.instance_type.clone(),
        subnet_id: s.subnet.clone(),
        security_group_ids: s.security_groups.clone(),
        ..crate::adapters::ec2::Ec2Config::default()
    };
    let broker = crate::adapters::ec2::Ec2Broker::connect(config).await.map_err(ServeError::Ec2Settings)?;
    let zones = crate::ports::Broker::availability_zones(&broker).await.map_err(ServeError::Ec2Zones)?;
    Ok((broker, zones.into_iter().map(|z| z.name).collect()))
}

/// Starts the environ provisioner over the store, and the container provisioners beside it,
/// both heard by the metrics and the event stream, and both fed the store's changes: what a
/// lone service runs at start and a replica runs when it becomes the leader.
fn start_provisioners(
    opts: &ServeSettings,
    config: ProvisionerConfig,
    broker: &MeteredBroker,
    store: &Store,
    metrics: &actix::Addr<Metrics>,
    events: &actix::Addr<crate::service::events::EventHub>,
    limiter: Option<&crate::SharedLimiter>,
) -> Result<(crate::ProvisionerHandle, Option<crate::ContainersHandle>), ServeError> {
    let (cloud, model) = (Arc::new(broker.clone()), Arc::new(StoreModel::new(store.clone())));
    // Paced by its account's limiter, shared with the other models there.
    let handle = match limiter {
        Some(l) => crate::start_sharing(config.clone(), cloud, model, l)?,
        None => crate::start(config.clone(), cloud, model)?,
    };
    handle.subscribe(metrics.clone().recipient());
    handle.subscribe(events.clone().recipient());
    let subscribers = vec![metrics.clone().recipient(), events.clone().recipient()];
    let containers = start_container_provisioners(opts, config, broker, store, &handle, subscribers)?;
    store.watch(handle.machines_changed());
    store.watch_retries(handle.retry_ticks());
    // A retry asked for before this provisioner watched (while no replica led the model: a
    // start-up, a fail-over, a hand-over) is acted on now: only machines flagged for a retry.
    handle.retry_ticks().do_send(crate::RetryTick);
    Ok((handle, containers))
}

/// Starts the lazy container provisioners beside the environ provisioner `handle`, with the
/// simulated cloud only (`None` with EC2: no real container initialiser exists yet, so the API
/// refuses containers there). They hear every store change (as the environ provisioner does)
/// and its events (to learn when a host is provisioned); each host and container type gets its
/// supervisor, which prepares the host through the simulated initialiser
/// (`--sim-container-init-delay`, `--sim-container-init-failures`) on the first container of
/// that type, then runs a container provisioner whose broker is the same metered cloud, every
/// container in its host's zone (`HostZoneBroker`).
fn start_container_provisioners(
    opts: &ServeSettings,
    config: ProvisionerConfig,
    broker: &MeteredBroker,
    store: &Store,
    handle: &crate::ProvisionerHandle,
    subscribers: Vec<actix::Recipient<crate::ProvisionerEvent>>,
) -> Result<Option<crate::ContainersHandle>, ServeError> {
    if opts.broker() != BrokerKind::Sim {
        return Ok(None);
    }
    let plan = crate::service::cloud::initialiser::SimInitPlan {
        delay: opts.sim.container_init_delay(),
        failures: opts.sim.container_init_failures(),
    };
    let containers = crate::start_containers(
        config,
        crate::containers::HostZoneBroker::factory(Arc::new(broker.clone())),
        Arc::new(StoreModel::new(store.clone())),
        Arc::new(crate::service::cloud::initialiser::SimInitialiser::start(plan)),
        crate::containers::DEFAULT_CONTAINER_TYPES.iter().map(|k| (*k).to_owned()).collect(),
        subscribers,
    )?;
    handle.subscribe(containers.provisioner_events());
    store.watch(containers.machines_changed());
    Ok(Some(containers))
}

/// The store `serve` runs on, and the API token as this replica knows it.
struct OpenedStore {
    store: Store,
    /// The token itself (empty when this replica only knows its hash).
    token: String,
    /// The token's hash (SHA-256, hex) when this replica does not hold the token.
    token_sha256: Option<String>,
}

/// Opens the store `--store` names: SQLite in the data directory (checked as it always was),
/// or PostgreSQL (waited for while it cannot be reached, see [`open_postgres`]).
async fn open_store(
    opts: &ServeSettings,
    dir: &Path,
    tls: Option<&rustls::ServerConfig>,
) -> Result<OpenedStore, ServeError> {
    // The stand-in that answers while PostgreSQL is waited for serves over the same TLS.
    #[cfg(not(feature = "postgres"))]
    let _ = tls;
    match opts.store.url() {
        StoreUrl::Sqlite => {
            prepare_data_dir(dir, opts.init)?;
            let db = dir.join(DB_FILE);
            let store = Store::start(&db).map_err(|e| match e {
                e @ StoreError::Damaged { .. } => ServeError::Damaged { path: db.clone(), source: e },
                other => ServeError::Store(other),
            })?;
            // The token after the database: a token without a database means a lost model.
            let token = ensure_token(dir)?;
            Ok(OpenedStore { store, token, token_sha256: None })
        }
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(url) => open_postgres(opts, dir, &url, tls).await,
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres(_) => Err(ServeError::NoPostgres),
    }
}

/// Opens the PostgreSQL store: the URL is checked now (a bad one exits 2 naming `--store`);
/// while the database cannot be reached, the service answers `/healthz` and `/readyz` with 503
/// and the reason on the listen address, and the store retries with backoff (logging why).
/// Then the API token: the replica that finds no token's hash in the database (it initialises
/// it) writes a new token to its data directory and its hash to the database; the others use
/// their token file if it holds that token, else the hash alone.
#[cfg(feature = "postgres")]
async fn open_postgres(
    opts: &ServeSettings,
    dir: &Path,
    url: &str,
    tls: Option<&rustls::ServerConfig>,
) -> Result<OpenedStore, ServeError> {
    let shown = opts.store.url().redacted();
    let store = Store::start_postgres(url).map_err(|e| ServeError::StoreUrl(e.to_string()))?;
    let waiting = crate::service::http::start_waiting_server(store.clone(), opts.listen(), tls.cloned())
        .map_err(|source| ServeError::Listen { addr: opts.listen().to_owned(), source })?;
    let mut logged = false;
    let reached = loop {
        match store.exec(|s| s.model_uuid()).await {
            Ok(_) => break Ok(()),
            Err(StoreError::Unavailable(why)) => {
                if !logged {
                    tracing::warn!(store = %shown, reason = %why, "waiting for the database; /readyz answers 503 meanwhile");
                    logged = true;
                }
                actix_rt::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => break Err(e),
        }
    };
    waiting.stop(false).await;
    reached?;
    let file = read_token(dir)?;
    // A replica without a token file offers a new token, written to its file first: were its
    // hash committed and the file then not written, nobody would hold the admin token. (If the
    // commit's outcome is not known, the file stays: the next start offers the same token.)
    let offered = match &file {
        Some(token) => token.clone(),
        None => write_token(dir, crate::service::token::new_secret())?,
    };
    let hash = crate::service::token::sha256_hex(&offered);
    let offer = hash.clone();
    let kept = store.exec(move |s| s.api_token_hash(&offer)).await?;
    Ok(match file {
        Some(token) if kept == hash => OpenedStore { store, token, token_sha256: None },
        Some(_) => {
            tracing::warn!(
                "the token file in {} is not this database's API token: requests need the database's token",
                dir.display()
            );
            OpenedStore { store, token: String::new(), token_sha256: Some(kept) }
        }
        // This replica initialised the token: it keeps the token file it wrote.
        None if kept == hash => OpenedStore { token: offered, store, token_sha256: None },
        // Another replica initialised it first: the file just written is no token of this
        // database's, and goes.
        None => {
            let path = dir.join(TOKEN_FILE);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(file = %path.display(), error = %e, "cannot delete a token file that is not the database's");
            }
            OpenedStore { store, token: String::new(), token_sha256: Some(kept) }
        }
    })
}

/// On PostgreSQL, makes this service one replica of many: its lease actor contends for the
/// model's leader lease, and the hooks below start the provisioner (the environ provisioner,
/// the container provisioners, the simulated cloud's resumption) only while it leads, after
/// setting the store's fence for the epoch; on losing the lease they stop it at once (the fence
/// stays: nothing it still tries to write commits). `None` on SQLite.
#[allow(clippy::too_many_arguments)]
fn start_replica(
    opts: &ServeSettings,
    model: &str,
    store: &Store,
    cloud_store: &Option<Store>,
    model_uuid: &str,
    config: &ProvisionerConfig,
    broker: &MeteredBroker,
    pending: &Option<PendingStarts>,
    metrics: &actix::Addr<Metrics>,
    events: &actix::Addr<crate::service::events::EventHub>,
    limiter: &Option<crate::SharedLimiter>,
    shared: &Shared,
) -> Result<Option<crate::service::runtime::ModelReplica>, ServeError> {
    #[cfg(feature = "postgres")]
    if let StoreUrl::Postgres(url) = opts.store.url() {
        use crate::service::lease::actor::{LeaseActor, LeaseConfig};
        let timings = opts.lease.timings().map_err(|e| ServeError::StoreUrl(e.to_string()))?;
        // One id for the process: every model's lease is held under it (the spread counts
        // replicas, not leases).
        let replica = shared.replica_id.clone();
        let leading = crate::service::lease::leading::Leading::new(store.clone())
            .for_model(model_uuid)
            .with_cloud_store(cloud_store.clone())
            .start();
        // The replica's lease thread, listener and lease arbiter, shared by its models.
        let links = match &shared.replica_links {
            Some(l) => l.clone(),
            None => return Err(ServeError::StoreUrl("the replica's lease thread was not started".into())),
        };
        // What the other replicas commit (adds, removals, retries through their API) reaches
        // the leader's provisioners by LISTEN/NOTIFY, not by polling.
        links.notices.do_send(crate::service::lease::listen::Subscribe {
            model_uuid: model_uuid.to_owned(),
            to: leading.clone().recipient(),
        });
        metrics.do_send(crate::service::metrics::LeaderChanged { leader: false, transition: false });
        let hooks = ReplicaHooks {
            opts: opts.clone(),
            store: store.clone(),
            model_uuid: model_uuid.to_owned(),
            replica: replica.clone(),
            config: config.clone(),
            broker: broker.clone(),
            pending: pending.clone(),
            metrics: metrics.clone(),
            events: events.clone(),
            leading: leading.clone(),
            limiter: limiter.clone(),
            models_led: shared.models_led.clone(),
            main: actix_rt::Arbiter::current(),
        };
        tracing::info!(%replica, lease = ?timings.lease(), renew_deadline = ?timings.renew_deadline(),
                       retry = ?timings.retry(), "replica: contending for the leader lease");
        let config = LeaseConfig {
            url,
            model_uuid: model_uuid.to_owned(),
            schema: (model != crate::service::models::DEFAULT_MODEL)
                .then(|| crate::service::models::host::schema_name(model)),
            replica,
            timings,
            spread: true,
        };
        let lease = LeaseActor::start_on(&links.arbiter, config, Box::new(hooks), links.sql);
        return Ok(Some(crate::service::runtime::ModelReplica {
            lease,
            leading,
            models_led: shared.models_led.clone(),
        }));
    }
    let _ = (opts, model, store, cloud_store, model_uuid, config, broker, pending, metrics, events, limiter, shared);
    Ok(None)
}

/// Releases a replica's lease (stopping its provisioner), waiting at most two retry periods
/// for the database to answer.
async fn release_lease(r: &crate::service::runtime::ModelReplica, opts: &ServeSettings) {
    #[cfg(feature = "postgres")]
    {
        let wait = opts.lease.timings().map(|t| t.retry() * 2).unwrap_or(std::time::Duration::from_secs(4));
        if actix_rt::time::timeout(wait, r.lease.send(crate::service::lease::actor::ReleaseLease)).await.is_err() {
            tracing::warn!("the lease's release did not answer in time: it expires on its own");
        }
        r.leading.do_send(crate::service::lease::leading::Follow);
    }
    #[cfg(not(feature = "postgres"))]
    let _ = (r, opts);
}

/// What a replica does at each change of role.
#[cfg(feature = "postgres")]
struct ReplicaHooks {
    opts: ServeSettings,
    store: Store,
    model_uuid: String,
    replica: String,
    config: ProvisionerConfig,
    broker: MeteredBroker,
    pending: Option<PendingStarts>,
    metrics: actix::Addr<Metrics>,
    events: actix::Addr<crate::service::events::EventHub>,
    leading: actix::Addr<crate::service::lease::leading::Leading>,
    limiter: Option<crate::SharedLimiter>,
    /// The models this replica leads, all models together.
    models_led: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The arbiter the model's actors run on (the lease's hooks run on the lease arbiter).
    main: actix_rt::ArbiterHandle,
}

/// What a replica's models share on PostgreSQL: one lease thread and connection
/// ([`LeaseSql`](crate::service::lease::sql::LeaseSql)), one listener
/// ([`NoticeHub`](crate::service::lease::listen::NoticeHub)), and one arbiter that only the
/// lease actors run on, so that no model's work delays a renewal.
#[cfg(feature = "postgres")]
#[derive(Clone)]
pub struct ReplicaLinks {
    sql: crate::service::lease::sql::LeaseSql,
    notices: actix::Addr<crate::service::lease::listen::NoticeHub>,
    arbiter: actix_rt::ArbiterHandle,
}

#[cfg(feature = "postgres")]
impl ReplicaLinks {
    /// Starts them for replica `replica` on the service's database at `url` (the service's
    /// own URL: a model's schema is set per lease step).
    pub fn start(url: &str, replica: &str, timings: crate::service::lease::LeaseTimings) -> Result<Self, ServeError> {
        let sql = crate::service::lease::sql::LeaseSql::start(
            url.to_owned(),
            replica.to_owned(),
            timings.retry(),
            timings.lease(),
        )
        .map_err(|e| ServeError::StoreUrl(format!("cannot start the lease thread: {e}")))?;
        let notices = crate::service::lease::listen::NoticeHub::start_listening(url.to_owned(), timings.retry())
            .map_err(|e| ServeError::StoreUrl(format!("cannot start the LISTEN thread: {e}")))?;
        let arbiter = actix_rt::Arbiter::new().handle();
        Ok(Self { sql, notices, arbiter })
    }
}

#[cfg(feature = "postgres")]
impl std::fmt::Debug for ReplicaLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaLinks").finish_non_exhaustive()
    }
}

#[cfg(feature = "postgres")]
impl ReplicaHooks {
    fn announce(&self, role: &'static str, epoch: Option<i64>, why: &'static str) {
        self.metrics.do_send(crate::service::metrics::LeaderChanged { leader: role == "leader", transition: true });
        self.events.do_send(crate::service::events::RoleChanged { role, epoch, replica: self.replica.clone(), why });
    }
}

#[cfg(feature = "postgres")]
impl crate::service::lease::actor::RoleHooks for ReplicaHooks {
    fn lead(&mut self, epoch: i64, t: crate::service::lease::Transition) {
        use crate::service::lease::leading::{Lead, Provisioners, Started};
        self.models_led.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.leading.do_send(Lead(epoch));
        self.announce("leader", Some(epoch), t.why.name());
        let fence =
            crate::service::store::Fence { model_uuid: self.model_uuid.clone(), holder: self.replica.clone(), epoch };
        let (store, broker, pending, opts) =
            (self.store.clone(), self.broker.clone(), self.pending.clone(), self.opts.clone());
        let (metrics, events, leading) = (self.metrics.clone(), self.events.clone(), self.leading.clone());
        let limiter = self.limiter.clone();
        let config = self.config.clone().with_random_seed();
        // On the model's arbiter: its provisioners are its actors, not the lease arbiter's.
        self.main.spawn_fn(move || {
            actix_rt::spawn(async move {
                // The fence first: from here on every write of this provisioner commits only under
                // this epoch.
                if let Err(e) = store.set_fence(Some(fence.clone())).await {
                    tracing::error!(error = %e, "cannot set the leader's fence: not acting");
                    return;
                }
                if let Some(p) = &pending {
                    if let Err(e) = p.set_fence(fence).await {
                        tracing::error!(error = %e, "cannot set the leader's fence on the cloud's store: not acting");
                        return;
                    }
                }
                // The starts an earlier leader left in flight (their client tokens were written,
                // fenced, before the cloud call): landed now, once.
                if let Some(pending) = &pending {
                    match pending.resume().await {
                        Ok(n) if n > 0 => {
                            tracing::info!(instances = n, epoch, "resuming starts an earlier leader left pending")
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "cannot resume pending starts"),
                    }
                }
                let started = start_provisioners(&opts, config, &broker, &store, &metrics, &events, limiter.as_ref())
                    .map(|(handle, containers)| Provisioners { handle, containers });
                match started {
                    Ok(p) => {
                        tracing::info!(epoch, "leading: the provisioner runs");
                        leading.do_send(Started(epoch, p));
                    }
                    Err(e) => tracing::error!(error = %e, "cannot start the provisioner"),
                }
            });
        });
    }

    fn follow(&mut self, why: crate::service::lease::Why, t: crate::service::lease::Transition) {
        self.leading.do_send(crate::service::lease::leading::Follow);
        let epoch = match t.from {
            crate::service::lease::Role::Leader { epoch } => {
                self.models_led.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                Some(epoch)
            }
            crate::service::lease::Role::Follower => None,
        };
        self.announce("follower", epoch, why.name());
    }

    fn probe(&mut self) -> Option<futures::future::LocalBoxFuture<'static, bool>> {
        use crate::service::lease::leading::Current;
        // A real read (a round trip to the database), queued behind the store's other work: it
        // answers only if the store's thread is free and the database answers. Then the
        // provisioner, if it runs: its pool answers a question on the model's arbiter.
        let store = self.store.read(|s| s.model_life().map(|_| ()));
        let leading = self.leading.send(Current);
        Some(Box::pin(async move {
            if store.await.is_err() {
                return false;
            }
            match leading.await {
                Ok(Some(p)) => p.handle.pool().await.is_ok(),
                Ok(None) => true,
                Err(_) => false,
            }
        }))
    }
}

/// Runs the service until SIGTERM or SIGINT. Must be called inside an actix system.
pub async fn serve(opts: ServeSettings) -> Result<(), ServeError> {
    #[cfg(not(feature = "ec2"))]
    if opts.broker() == BrokerKind::Ec2 {
        return Err(ServeError::NoEc2Broker);
    }
    // TLS first: a bad certificate or key is refused before the data directory is touched.
    let tls = match opts.tls_files() {
        Some((cert, key)) => Some(crate::service::tls::server_config(cert, key).map_err(ServeError::Tls)?),
        None => None,
    };
    let started = Instant::now();
    let dir = opts.data_dir();
    std::fs::create_dir_all(dir).map_err(data_dir_io(dir, FileOp::CreateDir, dir))?;
    let OpenedStore { store, token, token_sha256 } = open_store(&opts, dir, tls.as_ref()).await?;
    let audit = std::sync::Arc::new(
        crate::service::audit::AuditLog::open(&opts.audit_log(), opts.audit.rotation()).map_err(ServeError::Audit)?,
    );
    // The models directory: `default` alone for a new service (or one from before models).
    let directory_store = match opts.store.url() {
        StoreUrl::Sqlite => DirectoryStore::File(dir.to_owned()),
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(url) => DirectoryStore::postgres(url),
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres(_) => return Err(ServeError::NoPostgres),
    };
    let directory = directory_store.load().await.map_err(ServeError::Models)?;
    let replica_id = opts
        .lease
        .replica_id
        .clone()
        .unwrap_or_else(|| uuid::Builder::from_random_bytes(rand::random()).into_uuid().to_string());
    #[cfg(feature = "postgres")]
    let replica_links = match (opts.store.url(), opts.lease.timings()) {
        (StoreUrl::Postgres(url), Ok(t)) => Some(ReplicaLinks::start(&url, &replica_id, t)?),
        _ => None,
    };
    let shared = Shared {
        opts: opts.clone(),
        token,
        token_sha256,
        audit,
        started,
        service_store: store.clone(),
        metrics: Metrics::default().start(),
        streams: crate::service::events::StreamGate::new(opts.events, store.clone()).start(),
        accounts: crate::service::models::limits::Accounts::default(),
        replica_id,
        models_led: std::sync::Arc::default(),
        #[cfg(feature = "postgres")]
        replica_links,
    };
    let host = ModelHost::new(shared, directory_store, directory);
    if let Err(e) = host.start_all(store).await {
        stop_models(host.running().await, &opts).await;
        return Err(e);
    }
    // Replicas follow the models other replicas add and remove.
    // and spread the models' leaders over them.
    #[cfg(feature = "postgres")]
    let spread = match (opts.store.url(), opts.lease.timings()) {
        (StoreUrl::Postgres(url), Ok(t)) => {
            host.spawn_sync(t.retry());
            let replica = host.shared().replica_id.clone();
            Some(crate::service::models::spread::Spread::start(host.clone(), url, replica, t).await)
        }
        _ => None,
    };

    let app_host = host.clone();
    let http = actix_web::HttpServer::new(move || http::app(app_host.clone()))
        .workers(2)
        // A client that closes its connection is let go at once: its event stream's place is
        // free for another (half-closed, the stream would go on until a heartbeat's write failed).
        .h1_allow_half_closed(false)
        .disable_signals()
        .shutdown_timeout(opts.shutdown_grace.as_secs().max(1));
    let scheme = if tls.is_some() { "https" } else { "http" };
    let bound = match tls {
        Some(config) => http.bind_rustls_0_23(opts.listen(), config),
        None => http.bind(opts.listen()),
    };
    let server = match bound {
        Ok(server) => server.run(),
        Err(source) => {
            // The provisioners' actors are running: stop them while the runtime is still
            // here (dropped with it, their timers would panic), then say why.
            stop_models(host.running().await, &opts).await;
            actix_rt::time::sleep(std::time::Duration::from_millis(50)).await;
            return Err(ServeError::Listen { addr: opts.listen().to_owned(), source });
        }
    };
    let server_handle = server.handle();
    let server_task = actix_rt::spawn(server);
    tracing::info!(
        listen = %opts.listen(),
        scheme,
        data_dir = %dir.display(),
        models = host.running().await.len(),
        "provisioner service ready; the API token is in {}",
        dir.join(TOKEN_FILE).display()
    );

    let signal = terminated().await?;
    tracing::info!(%signal, "shutting down");
    // The other replicas stop counting this one before its leases are released.
    #[cfg(feature = "postgres")]
    if let Some(spread) = &spread {
        spread.leave().await;
    }
    let states = host.running().await;
    // Event streams never end on their own: end them, so the server need not wait for them.
    for st in &states {
        let _ = st.events.send(crate::service::events::CloseStreams).await;
    }
    server_handle.stop(true).await;
    drop(server_task);
    stop_models(states, &opts).await;
    tracing::info!("stopped");
    Ok(())
}

/// Opens the store of a model other than `default`: SQLite `models/NAME.db` in the data
/// directory (a new model's file created, private; an existing model's must be there), or
/// PostgreSQL with the connections' `search_path` set to the model's schema (created first).
#[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
pub(crate) async fn open_model_store(
    service: &ServeSettings,
    opts: &ServeSettings,
    name: &str,
    new: bool,
) -> Result<Store, ServeError> {
    match opts.store.url() {
        StoreUrl::Sqlite => {
            let dir = opts.data_dir();
            let db = crate::service::models::host::model_db(dir, name);
            let folder = dir.join(crate::service::models::host::MODELS_DIR);
            std::fs::create_dir_all(&folder).map_err(data_dir_io(dir, FileOp::CreateDir, &folder))?;
            if new {
                // Leftovers of an earlier model of the same name are not its history.
                for suffix in ["", "-wal", "-shm"] {
                    let f = PathBuf::from(format!("{}{suffix}", db.display()));
                    if f.exists() {
                        let to = aside(&f);
                        std::fs::rename(&f, &to).map_err(data_dir_io(dir, FileOp::MoveAside, &f))?;
                        tracing::warn!(from = %f.display(), to = %to.display(), "moved an old model's file aside");
                    }
                }
                let mut o = std::fs::OpenOptions::new();
                o.write(true).create_new(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
                o.open(&db).map_err(data_dir_io(dir, FileOp::Create, &db))?;
            } else if std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0) == 0 {
                return Err(data_dir_error(
                    dir,
                    format!("the database {} of model {name:?} is missing or empty: the model is lost", db.display()),
                ));
            }
            Store::start(&db).map_err(|e| match e {
                e @ StoreError::Damaged { .. } => ServeError::Damaged { path: db.clone(), source: e },
                other => ServeError::Store(other),
            })
        }
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(url) => {
            let schema = crate::service::models::host::schema_name(name);
            // The schema is created over the service's URL (the model's sets a search_path
            // to a schema that may not exist yet).
            let StoreUrl::Postgres(service_url) = service.store.url() else {
                return Err(ServeError::StoreUrl("the model's store is PostgreSQL, the service's is not".into()));
            };
            crate::service::models::persist::pg_schema(
                &service_url,
                &schema,
                if new {
                    crate::service::models::persist::SchemaOp::Fresh
                } else {
                    crate::service::models::persist::SchemaOp::Open
                },
            )
            .await
            .map_err(|e| ServeError::StoreUrl(e.to_string()))?;
            let store = Store::start_postgres(&url).map_err(|e| ServeError::StoreUrl(e.to_string()))?;
            store.exec(|s| s.model_uuid()).await?;
            Ok(store)
        }
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres(_) => Err(ServeError::NoPostgres),
    }
}

/// Starts one model over its open store: its cloud (the simulated one over the store, or
/// EC2), the starts a previous run left pending, its metrics and event stream, and its
/// provisioners (on PostgreSQL, only while this replica holds the model's lease). `opts` are
/// the model's settings ([`crate::service::models::host::model_settings`]).
pub(crate) async fn start_model(
    shared: &Shared,
    model: &str,
    opts: &ServeSettings,
    cloud_settings: &crate::service::models::CloudSettings,
    store: Store,
) -> Result<ModelRuntime, ServeError> {
    let model_uuid = store.exec(|s| s.model_uuid()).await?;
    // The account its calls count against: its limiter shared with the other models there.
    let account = match crate::service::models::limits::account_of(opts, cloud_settings) {
        Some((key, limits, sim_rate)) => Some(shared.accounts.get(&key, limits, sim_rate).await),
        None => None,
    };
    let settings = store.exec(|s| s.settings()).await?;
    // `default`'s families are the service's `/metrics`; another model's are its own.
    let metrics = if model == crate::service::models::DEFAULT_MODEL {
        shared.metrics.clone()
    } else {
        Metrics::default().start()
    };
    store.watch_counts(metrics.clone().recipient());
    let pending: Option<PendingStarts>;
    let cloud_store: Option<Store>;
    let (cloud, zones, broker_name): (Arc<dyn crate::ports::Broker>, Vec<String>, &str) = match opts.broker() {
        BrokerKind::Sim => {
            let settings = SimSettings {
                zones: opts.sim.zones(),
                unavailable_zones: opts.sim.unavailable_zones.clone(),
                start_latency: opts.sim.start_latency(),
                stop_latency: opts.sim.stop_latency,
                subnets: opts.sim.subnets(),
                instance_type: opts.sim.instance_type.clone(),
                out_of_capacity: crate::service::cloud::sim::parse_out_of_capacity(&opts.sim.out_of_capacity)
                    .ok_or(ServeError::SimOutOfCapacity)?,
                start_failures: opts.sim.start_failures(),
                account: account.as_ref().and_then(|a| a.sim.clone()),
            };
            let zones = settings.known_zones();
            // On PostgreSQL the cloud's instances are written on a connection of their own
            // (`Store::companion`), counted there.
            cloud_store = store.companion();
            if let Some(own) = &cloud_store {
                own.watch_counts(crate::service::metrics::CloudCountsTo(metrics.clone()).start().recipient());
            }
            let cloud =
                SimCloud::new(cloud_store.clone().unwrap_or_else(|| store.clone()), model_uuid.clone(), settings);
            pending = Some(PendingStarts::Sim(Box::new(cloud.clone())));
            (Arc::new(cloud), zones, "sim")
        }
        #[cfg(feature = "ec2")]
        BrokerKind::Ec2 => {
            let (ec2, zones) = ec2_broker(&opts.ec2, &model_uuid).await?;
            // Each start's token and parameters are written before the call (`intents`).
            let ec2 = crate::service::cloud::intents::IntentBroker::new(Arc::new(ec2), store.clone());
            cloud_store = None;
            pending = Some(PendingStarts::Intents(ec2.clone()));
            (Arc::new(ec2), zones, "ec2")
        }
        #[cfg(not(feature = "ec2"))]
        BrokerKind::Ec2 => return Err(ServeError::NoEc2Broker),
    };
    // Replicas: the leader resumes them, at each epoch it leads (its writes fenced); a lone
    // service now, before its provisioner starts.
    if let (Some(pending), false) = (&pending, matches!(opts.store.url(), StoreUrl::Postgres(_))) {
        let resumed = pending.resume().await?;
        if resumed > 0 {
            tracing::info!(starts = resumed, "resuming starts a previous run left in flight");
        }
    }
    // A real cloud's readers are served from the listings made (issue 30, item 8): the
    // listings' own calls go through the plain metered broker, the provisioner's through the
    // one that reports them. The simulated cloud's listing is a read of the store, as fresh and
    // as cheap as any other read: its readers read it.
    let plain = MeteredBroker::new(cloud, metrics.clone().recipient());
    let broker = if broker_name == "sim" {
        plain
    } else {
        let listings = crate::service::cloud::listing::InstanceListings::start(Arc::new(plain.clone()));
        plain.with_listings(listings)
    };
    let config = ProvisionerConfig {
        model_uuid: model_uuid.clone(),
        harvest_mode: settings.harvest_mode.unwrap_or(opts.harvest_mode),
        workers: settings.workers.unwrap_or(opts.workers),
        retry: opts.retry.strategy(),
        resync_interval: opts.resync,
        // The simulated cloud does not throttle: pacing it like EC2 would only slow it down.
        // Against EC2 the client-side limiter keeps its EC2-sized defaults.
        rate_limits: match opts.broker() {
            BrokerKind::Sim => crate::config::rate_limits::RateLimits::unlimited(),
            BrokerKind::Ec2 => crate::config::rate_limits::RateLimits::ec2(),
        },
        // A start's record waits for a group commit: not holding a worker meanwhile.
        record_outside_worker: true,
        ..ProvisionerConfig::default()
    }
    .with_random_seed();
    let hub = crate::service::events::EventHub::new(opts.events.idle_timeout);
    let events_dropped = hub.dropped_counter();
    let events = hub.start();
    // On PostgreSQL the service is one replica of many: only the lease's holder runs the
    // provisioner (see `start_replica`); on SQLite it runs it, as the only one.
    let limiter = account.as_ref().map(|a| a.limiter.clone());
    let replica = start_replica(
        opts,
        model,
        &store,
        &cloud_store,
        &model_uuid,
        &config,
        &broker,
        &pending,
        &metrics,
        &events,
        &limiter,
        shared,
    )?;
    let (handle, containers) = match &replica {
        Some(_) => (None, None),
        None => {
            let (handle, containers) =
                start_provisioners(opts, config, &broker, &store, &metrics, &events, limiter.as_ref())?;
            (Some(handle), containers)
        }
    };
    Ok(ModelRuntime {
        store,
        cloud_store,
        handle,
        replica,
        broker,
        metrics,
        events,
        events_dropped,
        token: shared.token.clone(),
        token_sha256: shared.token_sha256.clone(),
        zones,
        // The simulated cloud's subnets are known (`--to subnet=` is checked against them);
        // another cloud's are the broker's to judge.
        subnets: matches!(opts.broker(), BrokerKind::Sim).then(|| opts.sim.subnets()),
        broker_name: broker_name.into(),
        model_uuid,
        started: shared.started,
        containers,
        audit: shared.audit.clone(),
        sim_account: account.and_then(|a| a.sim),
    })
}

/// Stops models in order: a replica releases its lease at once (so that another takes over
/// within one retry; what it left in flight the next leader resumes by client token); a lone
/// service's provisioners start nothing new, are given `shutdown_grace` to finish their cloud
/// calls (all models at once), then stop.
pub(crate) async fn stop_models(states: Vec<ModelRuntime>, opts: &ServeSettings) {
    for st in &states {
        if let Some(r) = &st.replica {
            release_lease(r, opts).await;
        }
        if let Some(h) = &st.handle {
            h.close_starts();
        }
    }
    // The provisioners say when they are idle (their jobs, and so their cloud calls, are done);
    // the grace period bounds the wait. (A periodic listing still in flight is only a read.)
    let drained = futures::future::join_all(states.iter().filter(|st| st.handle.is_some()).map(|st| async move {
        if let Some(h) = &st.handle {
            h.wait_idle().await;
        }
        if let Some(c) = &st.containers {
            c.wait_idle().await;
        }
    }));
    if !states.iter().all(|st| st.handle.is_none())
        && actix_rt::time::timeout(opts.shutdown_grace, drained).await.is_err()
    {
        let in_flight: usize = states.iter().map(|st| st.broker.in_flight()).sum();
        tracing::warn!(in_flight, "shutdown grace over; cloud calls still in flight are resumed at the next start");
    }
    for st in &states {
        if let Some(h) = &st.handle {
            h.shutdown();
        }
        if let Some(c) = &st.containers {
            c.shutdown();
        }
        let _ = st.events.send(crate::service::events::CloseStreams).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_file_operation_keeps_the_io_error_as_its_source() {
        let dir = std::env::temp_dir().join(format!("provisioner-run-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // The token file is a directory: reading it fails, and not because it is missing.
        std::fs::create_dir_all(dir.join(TOKEN_FILE)).unwrap();
        let err = ensure_token(&dir).unwrap_err();
        let source = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<std::io::Error>());
        let io = source.expect("the io::Error is the source");
        assert!(matches!(err, ServeError::DataDirIo { op: FileOp::Read, .. }), "{err:?}");
        let token = dir.join(TOKEN_FILE);
        assert_eq!(
            err.to_string(),
            format!("cannot use data directory {}: cannot read {}: {io}", dir.display(), token.display())
        );
        assert_eq!(err.exit_code(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stopped_store_is_reported_as_stopped() {
        let e = StoreError::Stopped(actix::MailboxError::Closed);
        assert_eq!(e.to_string(), "the store is not running: Mailbox has closed");
        assert!(std::error::Error::source(&e).is_some());
    }
}
