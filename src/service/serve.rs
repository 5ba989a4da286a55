//! `provisioner serve`: opens the data directory, wires the store, the simulated cloud, the
//! provisioner and the HTTP API, and runs until SIGTERM (or SIGINT), then shuts down in order:
//! the HTTP server stops taking requests, the provisioner starts nothing new, in-flight cloud
//! calls are given `shutdown_grace` to finish and be recorded, then the actors stop.

use std::path::Path;

use actix::Actor;
use actix_rt::time::Instant;

use crate::service::datadir::{ensure_token, prepare_data_dir, TOKEN_FILE};
#[cfg(feature = "postgres")]
use crate::service::datadir::{read_token, write_token};
use crate::service::error::{data_dir_io, FileOp, ServeError};
use crate::service::host::{DirectoryStore, ModelHost};
use crate::service::http;
use crate::service::metrics::Metrics;
use crate::service::runtime::accounts::Accounts;
#[cfg(feature = "postgres")]
use crate::service::runtime::ReplicaLinks;
use crate::service::runtime::{stop_models, ModelStarter, Shared};
use crate::service::settings::{ServeSettings, StoreUrl};
use crate::service::store::{Store, StoreError, DB_FILE};

/// Runs the service until SIGTERM or SIGINT. Must be called inside an actix system.
pub async fn serve(opts: ServeSettings) -> Result<(), ServeError> {
    #[cfg(not(feature = "ec2"))]
    if opts.broker() == crate::service::settings::BrokerKind::Ec2 {
        return Err(ServeError::NoEc2Broker);
    }
    // TLS first: a bad certificate or key is refused before the data directory is touched.
    let tls = match opts.tls_files() {
        Some((cert, key)) => Some(crate::service::tls::server_config(cert, key).map_err(ServeError::Tls)?),
        None => None,
    };
    let started = Instant::now();
    // The threads every store runs on, made with the first store.
    if let Err(running) = crate::service::store::configure_threads(opts.store.threads()) {
        tracing::warn!(running, wanted = opts.store.threads(), "the store threads run already: their number is kept");
    }
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
    let directory = directory_store.load().await.map_err(|e| ServeError::Models(Box::new(e)))?;
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
        accounts: Accounts::default().start(),
        replica_id,
        models_led: std::sync::Arc::default(),
        #[cfg(feature = "postgres")]
        replica_links,
    };
    let host = ModelHost::start(shared, directory_store, directory, std::sync::Arc::new(ModelStarter));
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
            Some(crate::service::host::spread::Spread::start(host.clone(), url, replica, t).await)
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
