//! Real LXD daemons for tests (features `test-util` and `lxd`), as `moto` starts an
//! EC2 server: each [`LxdDaemon`] is an `lxd` process of its own, with its own `LXD_DIR` in a
//! temporary directory, listening on its unix socket and on HTTPS at a loopback address of its
//! own (`127.X.Y.Z`, distinct per process and per daemon, on a port checked free), gone with its
//! directory when the value is dropped. An [`LxdCluster`] is several daemons joined into one
//! cluster (one per "zone", optionally with failure domains); a [`ClientCert`] is a client
//! certificate for the HTTPS API, trusted with [`LxdDaemon::trust`].
//!
//! ```no_run
//! use provisioner::testing::lxd::{ensure_lxd, ClientCert, LxdDaemon};
//! if let Err(why) = ensure_lxd() {
//!     eprintln!("skipped: {why}");
//!     return;
//! }
//! let lxd = LxdDaemon::standalone("lxd1").unwrap();
//! lxd.import_busybox_image("busybox").unwrap();
//! let cert = ClientCert::generate(&std::env::temp_dir()).unwrap();
//! lxd.trust(&cert.cert_path).unwrap();
//! // lxd.https_url(), lxd.server_cert_path(), cert.cert_pem, cert.key_pem: what a broker needs.
//! ```
//!
//! The facts behind it (shared/reference/lxd.md): `lxd init --auto` cannot find a subnet here,
//! so a preseed sets the daemon up (a `dir` pool, a default profile with a root disk and no
//! network device: instances need no address to be provisioned, and bridges of several daemons
//! on one host would clash); images come from no image server, so a busybox image is built in
//! the test and imported; only containers work (no virtual machines).
//!
//! Instance names are host-wide in part: LXD names its cgroups `lxc.payload.NAME`, and a second
//! container of the same name on another daemon gets `lxc.payload.NAME-1`. A test that looks at
//! an instance's cgroup files should give it a name no other test uses ([`unique_name`]).
//!
//! Every wait is bounded. These functions block: call them from a test's thread before any
//! actor starts, or from a blocking task.

// Waits here block the calling test thread on purpose (a daemon is a process to wait for, not
// an actor): std's sleep is what the harness needs.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

/// The Debian packages the harness needs (the bridge's `dnsmasq-base` and `nftables` too:
/// LXD picks its firewall tool when it starts).
pub const PACKAGES: &[&str] = &["lxd", "lxd-client", "busybox-static", "dnsmasq-base", "nftables"];

/// How long `lxc` and `lxd` commands may take before the harness kills them.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether LXD can run on this machine: installs [`PACKAGES`] with apt-get when `lxd`, `lxc` or
/// `busybox` is missing (once per process). `Err` says why not (not root, no apt-get, no
/// cgroups, the install failed): a test should then skip with that reason.
pub fn ensure_lxd() -> Result<(), String> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY.get_or_init(check_and_install).clone()
}

fn check_and_install() -> Result<(), String> {
    if !cfg!(target_os = "linux") {
        return Err("LXD runs only on Linux".into());
    }
    let uid = Command::new("id").arg("-u").output().map_err(|e| format!("cannot run id: {e}"))?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Err("LXD's daemon needs root, and these tests do not run as root".into());
    }
    if !Path::new("/sys/fs/cgroup").is_dir() {
        return Err("no /sys/fs/cgroup: containers cannot run here".into());
    }
    let missing = ["lxd", "lxc", "busybox", "nft", "dnsmasq"].iter().any(|tool| find_in_path(tool).is_none());
    if missing {
        if find_in_path("apt-get").is_none() {
            return Err(format!("LXD is not installed and there is no apt-get to install {}", PACKAGES.join(" ")));
        }
        let install = || {
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends"])
                .args(PACKAGES)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .output()
                .map_err(|e| format!("cannot run apt-get: {e}"))
        };
        if !install()?.status.success() {
            // The package lists may be missing (a fresh image): update them once, try again.
            let _ = Command::new("apt-get").arg("update").output();
            let out = install()?;
            if !out.status.success() {
                return Err(format!(
                    "apt-get install {} failed: {}",
                    PACKAGES.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        if let Some(tool) = ["lxd", "lxc", "busybox"].iter().find(|tool| find_in_path(tool).is_none()) {
            return Err(format!("{tool} is still missing after installing {}", PACKAGES.join(" ")));
        }
    }
    Ok(())
}

fn find_in_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path).map(|dir| dir.join(tool)).find(|p| p.is_file())
}

/// A name no other test of any process running now uses: `PREFIX-PID-N` (for instances whose
/// cgroups a test reads, see the module's documentation). At most 63 characters.
pub fn unique_name(prefix: &str) -> String {
    static NAMES: AtomicUsize = AtomicUsize::new(0);
    let mut name = format!("{prefix}-{}-{}", std::process::id(), NAMES.fetch_add(1, Ordering::Relaxed));
    name.truncate(63);
    name
}

/// For a test: a standalone daemon (named `PREFIX-PID-N`) with the busybox image under
/// `alias`; `None`, the reason printed, where LXD cannot run here (the test then passes).
pub fn daemon_for_test(prefix: &str, alias: &str) -> Option<LxdDaemon> {
    if let Err(why) = ensure_lxd() {
        eprintln!("skipped: {why}");
        return None;
    }
    let daemon = LxdDaemon::standalone(&unique_name(prefix)).expect("an LXD daemon starts");
    daemon.import_busybox_image(alias).expect("the busybox image imports");
    Some(daemon)
}

/// For a test: a cluster of `n` members (failure domains as [`LxdCluster::start`] takes them)
/// with the busybox image under `alias`, imported on its first member; `None`, the reason
/// printed, where LXD cannot run here.
pub fn cluster_for_test(n: usize, failure_domains: Option<&[&str]>, alias: &str) -> Option<LxdCluster> {
    if let Err(why) = ensure_lxd() {
        eprintln!("skipped: {why}");
        return None;
    }
    let cluster = LxdCluster::start(n, failure_domains).expect("an LXD cluster forms");
    cluster.members[0].import_busybox_image(alias).expect("the busybox image imports");
    Some(cluster)
}

/// Runs `cmd`, killing it (by its own pid) if it takes longer than `timeout`; the output of a
/// killed command says so on stderr.
fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<Output, String> {
    let what = format!("{:?}", cmd.get_program());
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let waited = match rx.recv_timeout(timeout) {
        Ok(out) => out,
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            let mut out = rx.recv().map_err(|_| format!("{what} vanished"))?;
            if let Ok(out) = &mut out {
                out.stderr.extend_from_slice(format!("\n(killed after {timeout:?})").as_bytes());
            }
            out
        }
    };
    waited.map_err(|e| format!("{what} failed to run: {e}"))
}

/// `Ok(stdout)` when `out` succeeded, else `Err` with what failed and its stderr.
fn success(what: &str, out: Output) -> Result<String, String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    }
}

/// A loopback address of this process's own and a free port on it. The second octet comes from
/// the process id and the third and fourth from a counter, so neither the test threads of one
/// process nor several test processes clash (and the port is checked by binding it).
fn free_address() -> Result<(Ipv4Addr, u16), String> {
    static ADDRESSES: AtomicUsize = AtomicUsize::new(0);
    let pid = std::process::id() as usize;
    for _ in 0..100 {
        let n = ADDRESSES.fetch_add(1, Ordering::Relaxed);
        let ip = Ipv4Addr::new(127, (20 + pid % 200) as u8, ((pid / 200 + n / 250) % 256) as u8, (1 + n % 250) as u8);
        if let Ok(listener) = TcpListener::bind((ip, 0)) {
            if let Ok(addr) = listener.local_addr() {
                return Ok((ip, addr.port()));
            }
        }
    }
    Err("no free loopback address and port".into())
}

/// One instance as [`LxdDaemon::instances`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LxdInstance {
    /// Its name.
    pub name: String,
    /// `Running`, `Stopped`, `Error`...
    pub status: String,
    /// The cluster member it is on (`none` on a standalone daemon).
    pub location: String,
    /// Its `user.*` config keys (the free-form metadata), with their prefix.
    pub user: BTreeMap<String, String>,
}

/// One LXD daemon of a test's own (see the module's documentation); stopped, its instances
/// deleted and its directory removed when dropped.
pub struct LxdDaemon {
    root: PathBuf,
    dir: PathBuf,
    name: String,
    address: Ipv4Addr,
    port: u16,
    child: Option<Child>,
    /// Its instances are deleted already (a cluster deletes them all before any member stops).
    cleared: bool,
    /// How long `lxd shutdown` may take before the process is killed.
    grace: Duration,
}

impl std::fmt::Debug for LxdDaemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LxdDaemon")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .field("url", &self.https_url())
            .finish()
    }
}

impl LxdDaemon {
    /// Starts a bare daemon (not initialised yet) on a fresh directory and loopback address.
    fn spawn(server_name: &str) -> Result<Self, String> {
        ensure_lxd()?;
        static DAEMONS: AtomicUsize = AtomicUsize::new(0);
        let (address, port) = free_address()?;
        let root = std::env::temp_dir().join(format!(
            "plxd-{}-{}-{server_name}",
            std::process::id(),
            DAEMONS.fetch_add(1, Ordering::Relaxed)
        ));
        if root.exists() {
            let _ = std::fs::remove_dir_all(&root);
        }
        let dir = root.join("lxd");
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        std::fs::create_dir_all(root.join("conf")).map_err(|e| format!("cannot create the lxc config dir: {e}"))?;
        let log = root.join("lxd.log");
        let child = Command::new("lxd")
            .args(["--group", "root", "--logfile"])
            .arg(&log)
            .env("LXD_DIR", &dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // The test's process group: a terminal's ^C, which stops the test without its drops,
            // stops the daemon too.
            .spawn()
            .map_err(|e| format!("cannot start lxd: {e}"))?;
        let daemon = LxdDaemon {
            root,
            dir,
            name: server_name.to_owned(),
            address,
            port,
            child: Some(child),
            cleared: false,
            grace: Duration::from_secs(30),
        };
        let ready = run_bounded(
            Command::new("lxd").args(["waitready", "--timeout=60"]).env("LXD_DIR", &daemon.dir),
            Duration::from_secs(70),
        )?;
        success("lxd waitready", ready).map_err(|e| format!("{e}\n{}", daemon.log_tail()))?;
        Ok(daemon)
    }

    /// The last lines of the daemon's log (for error messages).
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.root.join("lxd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!("lxd.log:\n{}", lines[lines.len().saturating_sub(20)..].join("\n"))
    }

    /// `lxd init --preseed` with `preseed` (YAML; JSON is YAML too).
    fn preseed(&self, preseed: &serde_json::Value) -> Result<(), String> {
        let mut child = Command::new("lxd")
            .args(["init", "--preseed"])
            .env("LXD_DIR", &self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run lxd init: {e}"))?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin.write_all(preseed.to_string().as_bytes()).map_err(|e| format!("cannot write the preseed: {e}"))?;
        drop(stdin);
        let pid = child.id();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out = match rx.recv_timeout(COMMAND_TIMEOUT) {
            Ok(out) => out.map_err(|e| format!("lxd init failed to run: {e}"))?,
            Err(_) => {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
                return Err(format!("lxd init --preseed took longer than {COMMAND_TIMEOUT:?}"));
            }
        };
        success(&format!("lxd init --preseed on {}", self.name), out)
            .map(drop)
            .map_err(|e| format!("{e}\n{}", self.log_tail()))
    }

    /// A standalone daemon named `server_name` (its name in logs and errors; a cluster member's
    /// name in a cluster): a `dir` storage pool `local`, a default profile with a root disk and
    /// no network device, HTTPS on [`LxdDaemon::https_url`].
    pub fn standalone(server_name: &str) -> Result<Self, String> {
        let daemon = Self::spawn(server_name)?;
        daemon.preseed(&serde_json::json!({
            "config": { "core.https_address": daemon.https_address() },
            "storage_pools": [{ "name": "local", "driver": "dir" }],
            "profiles": [{
                "name": "default",
                "devices": { "root": { "type": "disk", "path": "/", "pool": "local" } }
            }],
        }))?;
        Ok(daemon)
    }

    /// `127.X.Y.Z:PORT`, its `core.https_address`.
    fn https_address(&self) -> String {
        format!("{}:{}", self.address, self.port)
    }

    /// Its unix socket (`LXD_DIR/unix.socket`): full trust, no certificate.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("unix.socket")
    }

    /// `https://127.X.Y.Z:PORT`, its HTTPS API.
    pub fn https_url(&self) -> String {
        format!("https://{}", self.https_address())
    }

    /// The certificate it serves on HTTPS, to pin (it names only the host's name, `127.0.0.1`
    /// and `::1`, not the address it listens on): `LXD_DIR/cluster.crt` in a cluster (all
    /// members serve it), else `LXD_DIR/server.crt`.
    pub fn server_cert_path(&self) -> PathBuf {
        let cluster = self.dir.join("cluster.crt");
        if cluster.exists() {
            cluster
        } else {
            self.dir.join("server.crt")
        }
    }

    /// The certificate of [`LxdDaemon::server_cert_path`] (PEM).
    pub fn server_cert_pem(&self) -> Result<String, String> {
        let path = self.server_cert_path();
        std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    }

    /// Its `LXD_DIR`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its name (the cluster member's name in a cluster).
    pub fn server_name(&self) -> &str {
        &self.name
    }

    /// The daemon's process id (0 once it stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Runs `lxc ARGS` against this daemon (its unix socket, through `LXD_DIR`), killed after
    /// two minutes (a frozen daemon does not answer until thawed).
    pub fn lxc(&self, args: &[&str]) -> Output {
        match run_bounded(&mut self.lxc_command(args), COMMAND_TIMEOUT) {
            Ok(out) => out,
            Err(e) => Output { status: ExitStatusExt::from_raw(127 << 8), stdout: Vec::new(), stderr: e.into_bytes() },
        }
    }

    fn lxc_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("lxc");
        cmd.args(args).env("LXD_DIR", &self.dir).env("LXD_CONF", self.root.join("conf"));
        cmd
    }

    /// `lxc ARGS`: its stdout if it succeeded, else what failed.
    pub fn lxc_ok(&self, args: &[&str]) -> Result<String, String> {
        success(&format!("lxc {} (on {})", args.join(" "), self.name), self.lxc(args))
    }

    /// `GET PATH` of the API (`lxc query`), parsed.
    pub fn query(&self, path: &str) -> Result<serde_json::Value, String> {
        let out = self.lxc_ok(&["query", path])?;
        serde_json::from_str(&out).map_err(|e| format!("lxc query {path}: {e}: {out}"))
    }

    /// `METHOD PATH` of the API with the JSON `body` (`lxc query -X METHOD -d BODY`).
    pub fn query_with(&self, method: &str, path: &str, body: &serde_json::Value) -> Result<String, String> {
        self.lxc_ok(&["query", "-X", method, "-d", &body.to_string(), path])
    }

    /// Freezes the daemon (SIGSTOP): it stops answering, as a hung host would; its containers
    /// keep running.
    pub fn freeze(&self) -> Result<(), String> {
        self.signal("STOP")?;
        // SIGSTOP reaches the daemon's threads asynchronously: frozen once its state says so
        // (a bounded wait: 5 s).
        let pid = self.pid();
        for _ in 0..250 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T')) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("{} (pid {pid}) was sent SIGSTOP and is not stopped after 5 s", self.name))
    }

    /// Resumes a frozen daemon (SIGCONT).
    pub fn thaw(&self) -> Result<(), String> {
        self.signal("CONT")
    }

    fn signal(&self, signal: &str) -> Result<(), String> {
        let pid = self.pid();
        if pid == 0 {
            return Err(format!("{} is not running", self.name));
        }
        let out = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).output();
        success(&format!("kill -{signal} {pid}"), out.map_err(|e| format!("cannot run kill: {e}"))?).map(drop)
    }

    /// Trusts the client certificate in the PEM file `cert_pem_path` (`lxc config trust add`):
    /// a client with it and its key may then use the HTTPS API.
    pub fn trust(&self, cert_pem_path: &Path) -> Result<(), String> {
        let path = cert_pem_path.to_str().ok_or("the certificate's path is not UTF-8")?;
        self.lxc_ok(&["config", "trust", "add", path]).map(drop)
    }

    /// Imports the busybox image (built once per process, see [`busybox_image`]) under `alias`;
    /// if the daemon (or its cluster) has it already, only adds the alias.
    pub fn import_busybox_image(&self, alias: &str) -> Result<(), String> {
        let image = busybox_image()?;
        if self.query(&format!("/1.0/images/{}", image.fingerprint)).is_ok() {
            return self.lxc_ok(&["image", "alias", "create", alias, &image.fingerprint]).map(drop);
        }
        let dir = self.root.join("image");
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let (meta_path, rootfs_path) = (dir.join("meta.tar.gz"), dir.join("rootfs.tar.gz"));
        std::fs::write(&meta_path, &image.meta).map_err(|e| format!("cannot write the image: {e}"))?;
        std::fs::write(&rootfs_path, &image.rootfs).map_err(|e| format!("cannot write the image: {e}"))?;
        let imported = self.lxc_ok(&[
            "image",
            "import",
            meta_path.to_str().ok_or("temp dir not UTF-8")?,
            rootfs_path.to_str().ok_or("temp dir not UTF-8")?,
            "--alias",
            alias,
        ]);
        let _ = std::fs::remove_dir_all(&dir);
        imported.map(drop)
    }

    /// Its instances (all the cluster's, on a cluster member), from
    /// `GET /1.0/instances?recursion=1`.
    pub fn instances(&self) -> Result<Vec<LxdInstance>, String> {
        let list = self.query("/1.0/instances?recursion=1")?;
        let text = |v: &serde_json::Value, key: &str| v[key].as_str().unwrap_or_default().to_owned();
        Ok(list
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|i| LxdInstance {
                        name: text(i, "name"),
                        status: text(i, "status"),
                        location: text(i, "location"),
                        user: i["config"]
                            .as_object()
                            .map(|config| {
                                config
                                    .iter()
                                    .filter(|(k, _)| k.starts_with("user."))
                                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                                    .collect()
                            })
                            .unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Sets cluster member `member`'s failure domain: its whole body, read and PUT back.
    pub fn set_failure_domain(&self, member: &str, domain: &str) -> Result<(), String> {
        let path = format!("/1.0/cluster/members/{member}");
        let current = self.query(&path)?;
        let body = serde_json::json!({
            "roles": current["roles"],
            "groups": current["groups"],
            "config": current["config"],
            "description": current["description"],
            "failure_domain": domain,
        });
        self.query_with("PUT", &path, &body).map(drop)
    }

    /// Deletes (forced) the instances on this daemon: on a cluster member, those located on it.
    fn delete_own_instances(&mut self) {
        if self.cleared || self.child.is_none() {
            return;
        }
        let _ = self.thaw();
        if let Ok(instances) = self.instances() {
            for i in
                instances.iter().filter(|i| i.location == self.name || i.location == "none" || i.location.is_empty())
            {
                let _ = self.lxc(&["delete", "--force", &i.name]);
            }
        }
        self.cleared = true;
    }

    /// Stops the daemon: `lxd shutdown` (its instances deleted first unless done already), its
    /// process killed by its own pid if it has not exited within its grace (30 s; 3 s for a
    /// cluster's member: see [`LxdCluster`]).
    fn stop(&mut self) {
        self.delete_own_instances();
        let Some(mut child) = self.child.take() else { return };
        let _ = Command::new("kill").args(["-CONT", &child.id().to_string()]).status();
        let shutdown = Command::new("lxd")
            .args(["shutdown", "--timeout=30"])
            .env("LXD_DIR", &self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut exited = false;
        for _ in 0..self.grace.as_millis() / 100 {
            if matches!(child.try_wait(), Ok(Some(_))) {
                exited = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Ok(mut shutdown) = shutdown {
            if !matches!(shutdown.try_wait(), Ok(Some(_))) {
                let _ = shutdown.kill();
            }
            let _ = shutdown.wait();
        }
    }
}

impl Drop for LxdDaemon {
    fn drop(&mut self) {
        self.stop();
        // Mounts the daemon may have left (its shmounts, a container's rootfs) would keep the
        // directory busy: unmount what is under it, deepest first.
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
            let root = self.root.to_string_lossy().into_owned();
            let mut under: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .filter(|m| m.starts_with(&format!("{root}/")))
                .collect();
            under.sort_by_key(|m| std::cmp::Reverse(m.len()));
            for m in under {
                let _ = Command::new("umount").args(["-l", m]).status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The busybox image of the tests: its two tarballs and its fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyboxImage {
    /// `meta.tar.gz`: `metadata.yaml` for this machine's architecture.
    pub meta: Vec<u8>,
    /// `rootfs.tar.gz`.
    pub rootfs: Vec<u8>,
    /// Its fingerprint in LXD (the SHA-256 of both tarballs, one after the other).
    pub fingerprint: String,
}

/// The busybox image, built once per process: a rootfs with `/bin/busybox` (from
/// `busybox-static`), a link per applet, `/sbin/init`, `/etc/passwd`, `/etc/group`, an
/// `/etc/inittab` that starts nothing, and `/etc/udhcpc/default.script` (where Debian's
/// busybox looks for it) for a container with a network device; and a `metadata.yaml`.
pub fn busybox_image() -> Result<&'static BusyboxImage, String> {
    static IMAGE: OnceLock<Result<BusyboxImage, String>> = OnceLock::new();
    IMAGE.get_or_init(build_busybox_image).as_ref().map_err(Clone::clone)
}

fn build_busybox_image() -> Result<BusyboxImage, String> {
    ensure_lxd()?;
    let work = std::env::temp_dir().join(format!("plxd-{}-image", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let built = write_busybox_image(&work);
    let _ = std::fs::remove_dir_all(&work);
    built
}

fn write_busybox_image(work: &Path) -> Result<BusyboxImage, String> {
    let io = |what: &str| {
        let what = what.to_owned();
        move |e: std::io::Error| format!("building the busybox image: {what}: {e}")
    };
    let rootfs = work.join("rootfs");
    for d in ["bin", "sbin", "etc/udhcpc", "dev", "proc", "sys", "tmp", "root", "run", "var/log", "usr/bin"] {
        std::fs::create_dir_all(rootfs.join(d)).map_err(io(d))?;
    }
    let busybox = find_in_path("busybox").ok_or("busybox is not installed")?;
    std::fs::copy(&busybox, rootfs.join("bin/busybox")).map_err(io("copy busybox"))?;
    let list = success("busybox --list", Command::new(&busybox).arg("--list").output().map_err(io("busybox --list"))?)?;
    for applet in list.lines().map(str::trim).filter(|a| !a.is_empty() && *a != "busybox" && !a.contains('/')) {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).map_err(io(applet))?;
    }
    std::os::unix::fs::symlink("/bin/busybox", rootfs.join("sbin/init")).map_err(io("sbin/init"))?;
    let files: [(&str, &str); 5] = [
        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
        ("etc/group", "root:x:0:\n"),
        ("etc/inittab", "::sysinit:/bin/mount -t tmpfs tmpfs /tmp\n::shutdown:/bin/true\n"),
        ("etc/hostname", "busybox\n"),
        (
            "etc/udhcpc/default.script",
            "#!/bin/sh\ncase \"$1\" in\n  bound|renew)\n    ip addr flush dev \"$interface\"\n    \
             ip addr add \"$ip/${mask:-24}\" dev \"$interface\"\n    \
             [ -n \"$router\" ] && ip route add default via \"${router%% *}\"\n    ;;\nesac\nexit 0\n",
        ),
    ];
    for (path, text) in files {
        std::fs::write(rootfs.join(path), text).map_err(io(path))?;
    }
    let script = rootfs.join("etc/udhcpc/default.script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).map_err(io("chmod"))?;
    let arch = success("uname -m", Command::new("uname").arg("-m").output().map_err(io("uname"))?)?;
    let created = std::fs::metadata(&busybox)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let meta = work.join("meta");
    std::fs::create_dir_all(&meta).map_err(io("meta"))?;
    std::fs::write(
        meta.join("metadata.yaml"),
        format!(
            "architecture: {}\ncreation_date: {created}\nproperties:\n  description: busybox (provisioner tests)\n  os: busybox\n",
            arch.trim()
        ),
    )
    .map_err(io("metadata.yaml"))?;
    let tar = |from: &Path, to: &Path| -> Result<Vec<u8>, String> {
        let out = Command::new("tar")
            .args(["--numeric-owner", "-czf"])
            .arg(to)
            .arg("-C")
            .arg(from)
            .arg(".")
            .output()
            .map_err(io("tar"))?;
        success("tar", out)?;
        std::fs::read(to).map_err(io("read the tarball"))
    };
    let (meta, rootfs) = (tar(&meta, &work.join("meta.tar.gz"))?, tar(&rootfs, &work.join("rootfs.tar.gz"))?);
    let both = work.join("both");
    std::fs::write(&both, [meta.as_slice(), rootfs.as_slice()].concat()).map_err(io("both tarballs"))?;
    let sum = success("sha256sum", Command::new("sha256sum").arg(&both).output().map_err(io("sha256sum"))?)?;
    let fingerprint = sum.split_whitespace().next().unwrap_or_default().to_owned();
    Ok(BusyboxImage { meta, rootfs, fingerprint })
}

/// How long a cluster member's `lxd shutdown` may take before it is killed. Members that stop
/// at the same time lose their quorum: one of them may then wait 5 to 20 s for the database
/// before exiting, for nothing (its instances are gone already): it is killed instead.
const MEMBER_GRACE: Duration = Duration::from_secs(3);

/// Several daemons on distinct loopback addresses joined into one cluster, named `m1`, `m2`...;
/// when dropped, the instances of all deleted, then all stopped at the same time (any that has
/// not exited after 3 s killed).
#[derive(Debug)]
pub struct LxdCluster {
    /// Its members, `m1` first.
    pub members: Vec<LxdDaemon>,
}

impl LxdCluster {
    /// A cluster of `n` members `m1`..`mN`: `m1` bootstraps it (a `dir` pool `local`, a default
    /// profile with a root disk and no network device), the others join it one by one with a
    /// token from `lxc cluster add`. With `failure_domains`, member `mK` gets the K-th (each
    /// member's whole body is PUT: LXD wants its `groups` too).
    pub fn start(n: usize, failure_domains: Option<&[&str]>) -> Result<Self, String> {
        if n == 0 {
            return Err("a cluster needs a member".into());
        }
        if failure_domains.is_some_and(|d| d.len() != n) {
            return Err(format!("{n} members but {} failure domains", failure_domains.map_or(0, <[&str]>::len)));
        }
        // The daemons start at the same time; the cluster forms one member at a time.
        let spawned: Vec<Result<LxdDaemon, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (1..=n).map(|k| s.spawn(move || LxdDaemon::spawn(&format!("m{k}")))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a daemon's start panicked".into()))).collect()
        });
        let mut cluster = LxdCluster { members: Vec::new() };
        let mut failed = None;
        for d in spawned {
            match d {
                Ok(mut d) => {
                    d.grace = MEMBER_GRACE;
                    cluster.members.push(d);
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let first = &cluster.members[0];
        first.preseed(&serde_json::json!({
            "config": { "core.https_address": first.https_address() },
            "cluster": { "server_name": first.name, "enabled": true },
            "storage_pools": [{ "name": "local", "driver": "dir" }],
            "profiles": [{
                "name": "default",
                "devices": { "root": { "type": "disk", "path": "/", "pool": "local" } }
            }],
        }))?;
        for member in &cluster.members[1..] {
            let token = cluster.members[0].lxc_ok(&["cluster", "add", &member.name, "--quiet"])?;
            member.preseed(&serde_json::json!({
                "cluster": {
                    "enabled": true,
                    "server_name": member.name,
                    "server_address": member.https_address(),
                    "cluster_token": token.trim(),
                    "member_config": [{ "entity": "storage-pool", "name": "local", "key": "source", "value": "" }],
                }
            }))?;
        }
        if let Some(domains) = failure_domains {
            for (member, domain) in cluster.members.iter().zip(domains) {
                cluster.members[0].set_failure_domain(&member.name, domain)?;
            }
        }
        Ok(cluster)
    }

    /// The member named `name`.
    pub fn member(&self, name: &str) -> Option<&LxdDaemon> {
        self.members.iter().find(|m| m.name == name)
    }

    /// The members' `(name, status, failure domain)`, from `GET /1.0/cluster/members`.
    pub fn member_states(&self) -> Result<Vec<(String, String, String)>, String> {
        let list = self.members[0].query("/1.0/cluster/members?recursion=1")?;
        let text = |v: &serde_json::Value, key: &str| v[key].as_str().unwrap_or_default().to_owned();
        Ok(list
            .as_array()
            .map(|all| {
                all.iter().map(|m| (text(m, "server_name"), text(m, "status"), text(m, "failure_domain"))).collect()
            })
            .unwrap_or_default())
    }
}

impl Drop for LxdCluster {
    fn drop(&mut self) {
        // Every member's instances first, while the cluster has its quorum; then every member
        // stops at the same time (one by one takes three times as long).
        std::thread::scope(|s| {
            for m in &mut self.members {
                s.spawn(move || m.delete_own_instances());
            }
        });
        let members = std::mem::take(&mut self.members);
        std::thread::scope(|s| {
            for m in members {
                s.spawn(move || drop(m));
            }
        });
    }
}

/// A self-signed client certificate for LXD's HTTPS API (ECDSA P-256, with the `clientAuth`
/// extended key usage: LXD 5.0 trusts one without it too, later versions may not), written as `client.crt` and `client.key` (PEM) in a directory.
#[derive(Debug, Clone)]
pub struct ClientCert {
    /// The certificate's file (PEM), for [`LxdDaemon::trust`] or `curl --cert`.
    pub cert_path: PathBuf,
    /// The private key's file (PEM).
    pub key_path: PathBuf,
    /// The certificate (PEM).
    pub cert_pem: String,
    /// The private key (PEM).
    pub key_pem: String,
}

impl ClientCert {
    /// A new certificate and key, written into `dir` (created if missing) under names of their
    /// own (`client-PID-N.crt`, `.key`), so that several may share a directory.
    pub fn generate(dir: &Path) -> Result<Self, String> {
        static CERTS: AtomicUsize = AtomicUsize::new(0);
        let mut params = rcgen::CertificateParams::new(vec!["provisioner-test".to_owned()])
            .map_err(|e| format!("client certificate parameters: {e}"))?;
        params.distinguished_name.push(rcgen::DnType::CommonName, "provisioner-test");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().map_err(|e| format!("a client key: {e}"))?;
        let cert = params.self_signed(&key).map_err(|e| format!("a client certificate: {e}"))?;
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let stem = format!("client-{}-{}", std::process::id(), CERTS.fetch_add(1, Ordering::Relaxed));
        let (cert_path, key_path) = (dir.join(format!("{stem}.crt")), dir.join(format!("{stem}.key")));
        std::fs::write(&cert_path, &cert_pem).map_err(|e| format!("cannot write {}: {e}", cert_path.display()))?;
        std::fs::write(&key_path, &key_pem).map_err(|e| format!("cannot write {}: {e}", key_path.display()))?;
        Ok(Self { cert_path, key_path, cert_pem, key_pem })
    }
}
