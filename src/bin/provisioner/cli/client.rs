//! The client commands: blocking HTTP calls to a running service (`ureq`), human or JSON
//! output, and `machine add --wait` with a progress bar when stderr is a terminal.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use provisioner::service::wire::{
    AddApplication, AddMachines, AddedMachines, ApplicationView, ConfigValue, DestroyRequest, DestroyView, DriftView,
    ErrorBody, InstanceView, MachineDetail, MachineView, RemoveMachines, RetryMachines, SetConstraints, StatusView,
};
use provisioner::service::wire::{AddModel, ModelDetail, ModelView};
use provisioner::service::wire::{CreateToken, CreatedToken, TokenScope, TokenView};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{ApplicationCmd, ClientCmd, ConfigCmd, Conn, InstanceCmd, MachineCmd, ModelCmd, TokenCmd};

/// The default service URL.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7878";

/// A client failure: one sentence and the exit code (2 bad input, 1 run-time failure).
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// The sentence.
    pub message: String,
}

impl Failure {
    pub(super) fn usage(message: impl Into<String>) -> Self {
        Self { code: 2, message: message.into() }
    }
    pub(super) fn runtime(message: impl Into<String>) -> Self {
        Self { code: 1, message: message.into() }
    }
}

/// Talks to one service.
pub struct Client {
    base: String,
    token: String,
    agent: ureq::Agent,
    /// The model per-model paths go to (`-m`, `$PROVISIONER_MODEL`, else `default`).
    model: String,
    /// The model the user named (`-m`, else `$PROVISIONER_MODEL`), if any: `token create`
    /// scopes its token to it.
    named_model: Option<String>,
    /// The `--ca-cert` file (or `$PROVISIONER_CA_CERT`), if given.
    ca: Option<PathBuf>,
}

fn non_empty(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.trim().is_empty())
}

/// The certificate to trust: `--ca-cert`, else `$PROVISIONER_CA_CERT`.
fn ca_cert(conn: &Conn) -> Option<PathBuf> {
    conn.ca_cert.clone().or_else(|| non_empty(std::env::var("PROVISIONER_CA_CERT").ok()).map(PathBuf::from))
}

/// What a transport error means to an operator; a TLS failure gets a sentence that says what
/// is wrong with the certificate and what to do (`ca`: the `--ca-cert` file, if given).
fn transport_error(base: &str, ca: Option<&std::path::Path>, e: &ureq::Error) -> String {
    match provisioner::service::tls::tls_error(e) {
        Some(tls) => {
            format!("cannot reach the provisioner service at {base}: {}", provisioner::service::tls::explain(tls, ca))
        }
        None => format!("cannot reach the provisioner service at {base}: {e}"),
    }
}

impl Client {
    /// The server from `--server`, `$PROVISIONER_URL` or the default; the token from `--token`,
    /// `$PROVISIONER_TOKEN` or `DIR/token`.
    pub fn from_conn(conn: &Conn) -> Result<Self, Failure> {
        let base = non_empty(conn.server.clone())
            .or_else(|| non_empty(std::env::var("PROVISIONER_URL").ok()))
            .unwrap_or_else(|| DEFAULT_URL.to_owned());
        let base = base.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") && !base.starts_with("https://") {
            return Err(Failure::usage(format!("invalid server URL {base:?}: it must start with http:// or https://")));
        }
        let token = match non_empty(conn.token.clone()).or_else(|| non_empty(std::env::var("PROVISIONER_TOKEN").ok())) {
            Some(t) => t.trim().to_owned(),
            None => {
                let dir = conn.data_dir.clone().unwrap_or_else(|| PathBuf::from("./provisioner-data"));
                let path = dir.join("token");
                std::fs::read_to_string(&path).map(|t| t.trim().to_owned()).map_err(|e| {
                    Failure::usage(format!(
                        "no API token: pass --token, set PROVISIONER_TOKEN, or point --data-dir at the service's data directory (cannot read {}: {e})",
                        path.display()
                    ))
                })?
            }
        };
        let mut agent =
            ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(5)).timeout(Duration::from_secs(60));
        let ca = ca_cert(conn);
        if let Some(ca) = &ca {
            let config = provisioner::service::tls::client_config(ca).map_err(|e| Failure::usage(e.to_string()))?;
            agent = agent.tls_config(std::sync::Arc::new(config));
        }
        let named_model = non_empty(conn.model.clone()).or_else(|| non_empty(std::env::var("PROVISIONER_MODEL").ok()));
        let model = named_model.clone().unwrap_or_else(|| "default".to_owned());
        Ok(Self { base, token, agent: agent.build(), model, named_model, ca })
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        self.agent
            .request(method, &format!("{}{}", self.base, model_path(&self.model, path)))
            .set("Authorization", &format!("Bearer {}", self.token))
    }

    fn answer(&self, result: Result<ureq::Response, ureq::Error>) -> Result<ureq::Response, Failure> {
        match result {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(status, r)) => {
                let text = r.into_string().unwrap_or_default();
                let message = serde_json::from_str::<ErrorBody>(&text)
                    .map(|b| b.error)
                    .unwrap_or_else(|_| format!("the service answered {status}: {}", text.trim()));
                Err(match status {
                    400 | 404 | 413 => Failure::usage(message),
                    401 => Failure::runtime(format!("the service refused the API token: {message}")),
                    _ => Failure::runtime(message),
                })
            }
            Err(e) => Err(Failure::runtime(transport_error(&self.base, self.ca.as_deref(), &e))),
        }
    }

    fn decode<T: DeserializeOwned>(r: ureq::Response) -> Result<T, Failure> {
        r.into_json().map_err(|e| Failure::runtime(format!("the service's answer is not what was expected: {e}")))
    }

    /// `GET path`, decoded.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Failure> {
        Self::decode(self.answer(self.request("GET", path).call())?)
    }

    /// `GET path?k=v...` (the values given, encoded), decoded.
    pub fn get_query<T: DeserializeOwned>(&self, path: &str, query: &[(&str, Option<String>)]) -> Result<T, Failure> {
        let mut req = self.request("GET", path);
        for (k, v) in query {
            if let Some(v) = v {
                req = req.query(k, v);
            }
        }
        Self::decode(self.answer(req.call())?)
    }

    /// `DELETE path`, decoded.
    pub fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, Failure> {
        Self::decode(self.answer(self.request("DELETE", path).call())?)
    }

    /// `METHOD path` with a JSON body, decoded.
    pub fn send<B: Serialize, T: DeserializeOwned>(&self, method: &str, path: &str, body: &B) -> Result<T, Failure> {
        Self::decode(self.answer(self.request(method, path).send_json(body))?)
    }

    /// `METHOD path` with a JSON body, answer ignored.
    pub fn send_only<B: Serialize>(&self, method: &str, path: &str, body: &B) -> Result<(), Failure> {
        self.answer(self.request(method, path).send_json(body)).map(drop)
    }
}

/// `path` for `model`: a per-model path (`/v1/machines`, ...) goes under
/// `/v1/models/MODEL/` for a model other than `default` (whose plain paths old services
/// understand too); the service's own paths (`/v1/models`, `/v1/tokens`) stay as they are.
fn model_path(model: &str, path: &str) -> String {
    let service_wide = ["/v1/models", "/v1/tokens", "/v1/openapi.json"];
    match path.strip_prefix("/v1") {
        Some(rest) if model != "default" && !service_wide.iter().any(|p| path.starts_with(p)) => {
            format!("/v1/models/{}{rest}", encode_segment(model))
        }
        _ => path.to_owned(),
    }
}

/// `model add|list|show|destroy`.
fn model(c: &Client, cmd: ModelCmd) -> Result<(), Failure> {
    let print = |m: &ModelDetail| {
        println!("model:     {} ({})", m.name, m.life);
        println!("uuid:      {}", m.uuid.as_deref().unwrap_or("-"));
        println!("cloud:     {}", m.broker);
        println!("zones:     {}", if m.zones.is_empty() { "-".to_owned() } else { m.zones.join(",") });
        let lxd = m.lxd.as_ref().map(|l| l.named()).unwrap_or_default();
        let ec2 = [("account", &m.account), ("region", &m.region), ("endpoint", &m.endpoint), ("image", &m.image)];
        for (k, v) in ec2.into_iter().chain(lxd.iter().map(|(k, v)| (*k, v))) {
            if let Some(v) = v {
                println!("{:<10} {v}", format!("{k}:"));
            }
        }
        println!("machines:  {}", m.machines.map_or_else(|| "-".to_owned(), |n| n.to_string()));
        if let Some(leader) = &m.leader {
            println!("leader:    {leader} (epoch {})", m.epoch.map_or_else(|| "-".to_owned(), |e| e.to_string()));
        }
        if let Some(n) = m.account_throttled {
            println!("throttled: {n} starts refused by its account (all its models)");
        }
        if let Some(e) = &m.error {
            println!("error:     {e}");
        }
    };
    match cmd {
        ModelCmd::Add { name, broker, zones, account, region, endpoint, image, lxd, json } => {
            let zones = zones.map(|z| z.split(',').map(|s| s.trim().to_owned()).collect());
            let lxd = (lxd != provisioner::service::settings::LxdSettings::default()).then_some(lxd);
            let body = AddModel { name, broker, zones, account, region, endpoint, image, lxd };
            let added: ModelDetail = c.send("POST", "/v1/models", &body)?;
            if json {
                print_json(&added);
            } else {
                print(&added);
            }
        }
        ModelCmd::List { json } => {
            let list: Vec<ModelView> = c.get("/v1/models")?;
            if json {
                print_json(&list);
            } else {
                table(
                    &["MODEL", "LIFE", "MACHINES", "LEADER", "EPOCH"],
                    list.iter()
                        .map(|m| {
                            vec![
                                m.name.clone(),
                                m.life.clone(),
                                m.machines.map_or_else(|| "-".to_owned(), |n| n.to_string()),
                                dash(&m.leader),
                                m.epoch.map_or_else(|| "-".to_owned(), |e| e.to_string()),
                            ]
                        })
                        .collect(),
                );
            }
        }
        ModelCmd::Show { name, json } => {
            let m: ModelDetail = c.get(&format!("/v1/models/{}", encode_segment(&name)))?;
            if json {
                print_json(&m);
            } else {
                print(&m);
            }
        }
        ModelCmd::Destroy { name, force } => {
            let path = format!("/v1/models/{}{}", encode_segment(&name), if force { "?force=true" } else { "" });
            let m: ModelDetail = c.delete(&path)?;
            if m.life == "removed" {
                println!("model {name} removed (it did not run: its files are left where they are)");
            } else {
                println!("destroying model {name}: its instances are stopped, then it is removed");
            }
        }
    }
    Ok(())
}

/// A scope as the service spells it.
fn scope_name(s: TokenScope) -> &'static str {
    match s {
        TokenScope::Admin => "admin",
        TokenScope::ReadOnly => "read-only",
    }
}

/// `token create | list | revoke`.
fn token(c: &Client, cmd: TokenCmd) -> Result<(), Failure> {
    match cmd {
        TokenCmd::Create { read_only, for_model, json } => {
            let model = token_model(for_model, c.named_model.clone())?;
            let t: CreatedToken = c.send("POST", "/v1/tokens", &CreateToken { read_only, model })?;
            if json {
                print_json(&t);
            } else {
                let only = t.model.as_ref().map(|m| format!(", model {m} only")).unwrap_or_default();
                println!("created {} ({}{only}); the token is shown only now, keep it:", t.id, scope_name(t.scope));
                println!("{}", t.token);
            }
        }
        TokenCmd::List { json } => {
            let list: Vec<TokenView> = c.get("/v1/tokens")?;
            if json {
                print_json(&list);
            } else {
                table(
                    &["ID", "SCOPE", "MODEL", "CREATED", "REVOKED"],
                    list.iter()
                        .map(|t| {
                            let model = t.model.clone().unwrap_or_else(|| "(all)".to_owned());
                            vec![t.id.clone(), scope_name(t.scope).into(), model, t.created.clone(), dash(&t.revoked)]
                        })
                        .collect(),
                );
            }
        }
        TokenCmd::Revoke { id } => {
            let path = format!("/v1/tokens/{}", encode_segment(&id));
            let t: TokenView = c.delete(&path)?;
            println!("revoked {} (at {})", t.id, dash(&t.revoked));
        }
    }
    Ok(())
}

/// The model a new token is scoped to: `--for-model`, else the model the command is about
/// (`-m`, `$PROVISIONER_MODEL`), else none (every model). `-m team-a` is what a user writes to
/// mean team-a's token: it never makes a token for every model. Both naming different models
/// is refused (exit 2), naming both.
fn token_model(for_model: Option<String>, named: Option<String>) -> Result<Option<String>, Failure> {
    match (for_model, named) {
        (Some(f), Some(m)) if f != m => Err(Failure::usage(format!(
            "token create: --for-model {f:?} and -m/$PROVISIONER_MODEL {m:?} name different models; \
             name the token's model once (-m MODEL scopes the token to MODEL, as --for-model does)"
        ))),
        (Some(f), _) => Ok(Some(f)),
        (None, m) => Ok(m),
    }
}

/// How many machines one page of `machine list` asks for.
const MACHINE_PAGE: usize = 1000;

/// Reads `GET /v1/machines` page by page (`?after=ID&limit=N`, in id order, with `filters`),
/// handing each page to `each`, until a page comes back short.
fn machine_pages(
    c: &Client,
    filters: &[(&str, Option<String>)],
    mut each: impl FnMut(&[MachineView]),
) -> Result<(), Failure> {
    let mut after: Option<String> = None;
    loop {
        let mut query: Vec<(&str, Option<String>)> = filters.to_vec();
        query.push(("limit", Some(MACHINE_PAGE.to_string())));
        query.push(("after", after.clone()));
        let page: Vec<MachineView> = c.get_query("/v1/machines", &query)?;
        each(&page);
        match page.last() {
            Some(last) if page.len() == MACHINE_PAGE => after = Some(last.id.clone()),
            _ => return Ok(()),
        }
    }
}

fn print_json<T: Serialize>(v: &T) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  "));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.iter().map(|h| (*h).to_owned()).collect());
    for r in rows {
        line(r);
    }
}

fn dash(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "-".into())
}

/// Runs a client command.
pub fn run(conn: Conn, cmd: ClientCmd) -> ExitCode {
    let result = Client::from_conn(&conn).and_then(|c| dispatch(&c, cmd));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn dispatch(c: &Client, cmd: ClientCmd) -> Result<(), Failure> {
    match cmd {
        ClientCmd::Machine(MachineCmd::Add {
            n,
            zones,
            constraints,
            to,
            container,
            host,
            manual,
            address,
            capacity,
            wait,
            timeout,
            json,
        }) => {
            let zones = zones.map(|z| z.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect());
            // The service parses the constraints and checks the placement (one set of rules).
            let body = AddMachines {
                constraints: constraints.map(serde_json::Value::String),
                placement: to,
                container,
                host,
                manual,
                address,
                capacity,
                ..AddMachines::plain(n as usize, zones)
            };
            let added: AddedMachines = c.send("POST", "/v1/machines", &body)?;
            let waited = if wait { Some(wait_for(c, &added.ids, timeout)?) } else { None };
            if json {
                print_json(&added.ids);
            } else {
                for id in &added.ids {
                    println!("{id}");
                }
            }
            match waited {
                Some(failed) if !failed.is_empty() => Err(Failure::runtime(format!(
                    "{} of {} new machines failed to provision: {}",
                    failed.len(),
                    added.ids.len(),
                    failed.iter().map(|m| format!("{} ({})", m.id, m.message)).collect::<Vec<_>>().join("; ")
                ))),
                _ => Ok(()),
            }
        }
        ClientCmd::Machine(MachineCmd::Show { id, json }) => show_machine(c, &id, json),
        ClientCmd::Application(cmd) => application(c, cmd),
        ClientCmd::Token(cmd) => token(c, cmd),
        ClientCmd::Model(cmd) => model(c, cmd),
        ClientCmd::Machine(MachineCmd::List { application, status, zone, json }) => {
            let filters = [("application", application), ("status", status), ("zone", zone)];
            if json {
                // Page by page, each printed as it comes: a 100,000-machine list is never one
                // answer on the server nor one string here. The output is one JSON array.
                let mut first = true;
                print!("[");
                machine_pages(c, &filters, |page| {
                    for m in page {
                        let text = serde_json::to_string_pretty(m).unwrap_or_default();
                        print!("{}\n  {}", if first { "" } else { "," }, text.replace('\n', "\n  "));
                        first = false;
                    }
                })?;
                println!("{}]", if first { "" } else { "\n" });
            } else {
                let mut list = Vec::new();
                machine_pages(c, &filters, |page| list.extend_from_slice(page))?;
                table(
                    &["ID", "LIFE", "STATUS", "INSTANCE", "ZONE", "INSTANCE-STATUS", "MESSAGE"],
                    list.iter()
                        .map(|m| {
                            vec![
                                m.id.clone(),
                                m.life.clone(),
                                m.status.clone(),
                                dash(&m.instance),
                                dash(&m.zone),
                                if m.instance_status.is_empty() { "-".into() } else { m.instance_status.clone() },
                                m.message.clone(),
                            ]
                        })
                        .collect(),
                );
            }
            Ok(())
        }
        ClientCmd::Machine(MachineCmd::Remove { ids, keep_instance, force }) => {
            c.send_only("POST", "/v1/machines/remove", &RemoveMachines { ids: ids.clone(), keep_instance, force })?;
            let what = if keep_instance { "its instance is kept" } else { "its instance is stopped" };
            for id in ids {
                println!("removing machine {id} ({what})");
            }
            Ok(())
        }
        ClientCmd::Machine(MachineCmd::Retry { ids }) => {
            c.send_only("POST", "/v1/machines/retry", &RetryMachines { ids: ids.clone() })?;
            for id in ids {
                println!("retrying machine {id}");
            }
            Ok(())
        }
        ClientCmd::Machine(MachineCmd::SetConstraints { id, constraints, json }) => {
            let path = format!("/v1/machines/{}/constraints", encode_segment(&id));
            let m: MachineDetail = c.send("PUT", &path, &SetConstraints { constraints })?;
            print_machine(&m, json);
            Ok(())
        }
        ClientCmd::Instance(InstanceCmd::List { json }) => {
            let list: Vec<InstanceView> = c.get("/v1/instances")?;
            if json {
                print_json(&list);
            } else {
                table(
                    &["ID", "STATE", "ZONE", "MACHINE"],
                    list.iter().map(|i| vec![i.id.clone(), i.state.clone(), dash(&i.zone), dash(&i.machine)]).collect(),
                );
            }
            Ok(())
        }
        ClientCmd::Drift { json } => {
            let list: Vec<DriftView> = c.get("/v1/drift")?;
            if json {
                print_json(&list);
            } else if list.is_empty() {
                println!("no machine has drifted");
            } else {
                let rows = list
                    .iter()
                    .flat_map(|d| {
                        d.reasons
                            .iter()
                            .map(|r| vec![d.machine.clone(), d.instance.clone(), r.kind.clone(), r.message.clone()])
                    })
                    .collect();
                table(&["MACHINE", "INSTANCE", "KIND", "REASON"], rows);
            }
            Ok(())
        }
        ClientCmd::Config(ConfigCmd::Get { key }) => {
            let v: ConfigValue = c.get(&format!("/v1/config/{key}"))?;
            println!("{}", v.value);
            Ok(())
        }
        ClientCmd::Config(ConfigCmd::Set { key, value }) => {
            let v: ConfigValue =
                c.send("PUT", &format!("/v1/config/{key}"), &ConfigValue { key: key.clone(), value })?;
            println!("{key} = {}", v.value);
            Ok(())
        }
        ClientCmd::Status { json } => {
            let s: StatusView = c.get("/v1/status")?;
            if json {
                print_json(&s);
            } else {
                let by_status: Vec<String> = s.machines_by_status.iter().map(|(k, v)| format!("{v} {k}")).collect();
                println!("model:     {} ({})", s.model_uuid, s.model_life);
                println!(
                    "cloud:     {} (zones: {})",
                    s.broker,
                    if s.zones.is_empty() { "none".into() } else { s.zones.join(", ") }
                );
                println!(
                    "machines:  {} ({}); {} in error",
                    s.machines,
                    if by_status.is_empty() { "none".into() } else { by_status.join(", ") },
                    s.machines_in_error
                );
                match (s.instances, &s.instances_error) {
                    (Some(n), _) => println!("instances: {n}"),
                    (None, why) => {
                        println!("instances: unknown ({})", why.as_deref().unwrap_or("listing the cloud failed"))
                    }
                }
                println!(
                    "workers:   {} ({} jobs running, {} queued; {} cloud calls in flight)",
                    s.workers, s.jobs_in_flight, s.jobs_queued, s.broker_calls_in_flight
                );
                println!("harvest:   {}", s.harvest_mode);
                println!("state:     {} (up {:.0} s)", if s.idle { "idle" } else { "busy" }, s.uptime_s);
                print_replica(&s);
            }
            Ok(())
        }
        ClientCmd::DestroyModel { force, json } => {
            let d: DestroyView = c.send("POST", "/v1/destroy-model", &DestroyRequest { force })?;
            if json {
                print_json(&d);
            } else {
                println!(
                    "the model is dying: stopping {} instance(s); {} start(s) in flight will be stopped as they land",
                    d.stopping.len(),
                    d.awaiting_starts.len()
                );
                if !d.manual_machines.is_empty() {
                    println!(
                        "manually provisioned machines left as they are (--force): {}",
                        d.manual_machines.join(", ")
                    );
                }
            }
            Ok(())
        }
    }
}

/// Polls until every machine in `ids` is provisioned or in error; returns those in error.
/// A machine that disappears (removed meanwhile) counts as settled.
fn wait_for(c: &Client, ids: &[String], timeout: Option<Duration>) -> Result<Vec<MachineView>, Failure> {
    let wanted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(ids.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} machines {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    // The client is a blocking command-line program, not an actor: wall-clock time and sleeping
    // are what it needs here.
    #[allow(clippy::disallowed_methods, clippy::disallowed_types)]
    let began = std::time::Instant::now();
    loop {
        let list: Vec<MachineView> = c.get("/v1/machines")?;
        let mine: Vec<&MachineView> = list.iter().filter(|m| wanted.contains(m.id.as_str())).collect();
        let settled = mine.iter().filter(|m| m.settled()).count() + (wanted.len() - mine.len());
        let failed: Vec<MachineView> = mine.iter().filter(|m| m.is_error()).map(|m| (*m).clone()).collect();
        bar.set_position(settled as u64);
        if !failed.is_empty() {
            bar.set_message(format!("({} failed)", failed.len()));
        }
        if settled == wanted.len() {
            bar.finish_and_clear();
            return Ok(failed);
        }
        if timeout.is_some_and(|t| began.elapsed() >= t) {
            bar.abandon();
            return Err(Failure::runtime(format!(
                "gave up waiting: {} of {} new machines are provisioned or in error",
                settled,
                wanted.len()
            )));
        }
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A path segment with everything but unreserved characters percent-encoded (a container id's
/// `/` becomes `%2F`).
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn or_dash(v: Option<&str>) -> String {
    v.filter(|s| !s.is_empty()).unwrap_or("-").to_owned()
}

/// `machine show ID [--json]`.
fn show_machine(c: &Client, id: &str, json: bool) -> Result<(), Failure> {
    let m: MachineDetail = c.get(&format!("/v1/machines/{}", encode_segment(id)))?;
    print_machine(&m, json);
    Ok(())
}

/// One machine as `machine show` prints it (`json`: its [`MachineDetail`]).
fn print_machine(m: &MachineDetail, json: bool) {
    if json {
        print_json(m);
        return;
    }
    let v = &m.machine;
    let status =
        |s: &str, msg: &str| if msg.is_empty() { or_dash(Some(s)) } else { format!("{} ({msg})", or_dash(Some(s))) };
    let rows: Vec<(&str, String)> = vec![
        ("id", v.id.clone()),
        ("life", v.life.clone()),
        ("status", status(&v.status, &m.status_message)),
        ("instance", or_dash(v.instance.as_deref())),
        ("zone", or_dash(v.zone.as_deref())),
        ("instance-status", status(&v.instance_status, &m.instance_status_message)),
        ("constraints", if m.constraints_text.is_empty() { "-".into() } else { m.constraints_text.clone() }),
        ("placement", or_dash(m.placement.as_deref())),
        ("application", or_dash(m.application.as_deref())),
        ("container-type", or_dash(v.container_type.as_deref())),
        ("host", or_dash(v.host.as_deref())),
        ("address", or_dash(m.address.as_deref())),
        ("manual", v.manual.to_string()),
        ("capacity", v.capacity.clone()),
        ("capacity-type", or_dash(v.capacity_type.as_deref())),
        ("keep-instance", m.keep_instance.to_string()),
        ("retry-requested", m.retry_requested.to_string()),
        ("start-attempts", m.start_attempts.to_string()),
        ("last-error", or_dash(m.last_error.as_deref())),
        ("changed", or_dash(m.changed_at.as_deref())),
    ];
    for (k, val) in rows {
        println!("{:<16} {val}", format!("{k}:"));
    }
}

/// `application add|list|remove`.
fn application(c: &Client, cmd: ApplicationCmd) -> Result<(), Failure> {
    match cmd {
        ApplicationCmd::Add { name, units, constraints, capacity, json } => {
            let body = AddApplication {
                name,
                units: units as usize,
                constraints: constraints.map(serde_json::Value::String),
                capacity,
            };
            let added: ApplicationView = c.send("POST", "/v1/applications", &body)?;
            if json {
                print_json(&added.machines);
            } else {
                for id in &added.machines {
                    println!("{id}");
                }
            }
            Ok(())
        }
        ApplicationCmd::List { json } => {
            let list: Vec<ApplicationView> = c.get("/v1/applications")?;
            if json {
                print_json(&list);
            } else {
                table(
                    &["NAME", "UNITS", "MACHINES", "CONSTRAINTS"],
                    list.iter()
                        .map(|a| {
                            let text = provisioner::model::Constraints::from(a.constraints.clone()).to_string();
                            vec![
                                a.name.clone(),
                                a.units.to_string(),
                                if a.machines.is_empty() { "-".into() } else { a.machines.join(",") },
                                if text.is_empty() { "-".into() } else { text },
                            ]
                        })
                        .collect(),
                );
            }
            Ok(())
        }
        ApplicationCmd::Remove { name } => {
            let gone: ApplicationView = c.delete(&format!("/v1/applications/{}", encode_segment(&name)))?;
            if gone.machines.is_empty() {
                println!("removing application {name}");
            } else {
                println!(
                    "removing application {name} and its machines {} (their instances are stopped)",
                    gone.machines.join(", ")
                );
            }
            Ok(())
        }
    }
}

/// The replica's lines of `status` (replicas on PostgreSQL only).
fn print_replica(s: &StatusView) {
    let Some(role) = &s.role else { return };
    println!(
        "replica:   {} ({role}; leader {}, epoch {})",
        s.replica.as_deref().unwrap_or("?"),
        s.leader.as_deref().unwrap_or("unknown"),
        s.epoch.map_or_else(|| "none".to_owned(), |e| e.to_string())
    );
    if let Some(t) = &s.last_transition {
        println!("last role change: {} -> {} ({}, {:.0} s ago)", t.from, t.to, t.why, t.seconds_ago);
    }
    if let Some(n) = s.models_led {
        println!("models led by this replica: {n}");
    }
}
