//! The settings' layers (flags, environment, file, defaults) and their errors.

use super::*;
use clap::{CommandFactory, Parser};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::config::RetryStrategy;
use crate::model::HarvestMode;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeSettings,
}

fn file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("provisioner-settings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Loads the settings as `serve ARGS` would (no environment variable is set in tests).
fn load(args: &[&str]) -> Result<ServeSettings, SettingsError> {
    let matches = Cli::command().get_matches_from(std::iter::once("serve").chain(args.iter().copied()));
    ServeSettings::load(&matches)
}

fn with_file(name: &str, text: &str, args: &[&str]) -> Result<ServeSettings, SettingsError> {
    let p = file(name, text);
    let mut all = vec!["--config", p.to_str().unwrap()];
    all.extend_from_slice(args);
    load(&all)
}

#[test]
fn defaults_are_the_contracts() {
    let o = load(&[]).unwrap();
    assert_eq!(o.data_dir(), Path::new("./provisioner-data"));
    assert_eq!(o.listen(), "127.0.0.1:7878");
    assert_eq!(o.broker(), BrokerKind::Sim);
    assert_eq!(o.sim.zones(), ["az1", "az2", "az3"]);
    assert_eq!(o.sim.start_latency(), Duration::from_secs(2));
    assert_eq!((o.workers, o.harvest_mode, o.resync), (16, HarvestMode::Destroyed, Duration::from_secs(60)));
    assert_eq!(o.retry.strategy(), RetryStrategy::default());
    assert_eq!(o, ServeSettings::default(), "clap's skipped fields hold the same defaults");
    let parsed = Cli::try_parse_from(["serve"]).unwrap().serve;
    assert_eq!(parsed, ServeSettings::default(), "a parse without the file layer holds the defaults too");
}

#[test]
fn event_stream_limits_come_from_the_file_and_are_checked() {
    let d = load(&[]).unwrap().events;
    assert_eq!((d.max_streams_per_token, d.max_streams, d.idle_timeout), (8, 256, Duration::from_secs(60)));
    let text = "[events]\nmax_streams_per_token = 2\nmax_streams = 3\nidle_timeout = \"5s\"\n";
    let e = with_file("events.toml", text, &[]).unwrap().events;
    assert_eq!((e.max_streams_per_token, e.max_streams, e.idle_timeout), (2, 3, Duration::from_secs(5)));
    let e = with_file("events0.toml", "[events]\nmax_streams = 0\n", &[]).unwrap_err();
    assert_eq!(e.to_string(), "config: events.max_streams must be positive");
    let e = with_file("events1.toml", "[events]\nidle_timeout = \"0s\"\n", &[]).unwrap_err();
    assert_eq!(e.to_string(), "config: events.idle_timeout must be positive");
    let e = with_file("events2.toml", "[events]\nstreams = 3\n", &[]).unwrap_err();
    assert!(e.to_string().contains("streams"), "{e}");
}

#[test]
fn the_audit_log_is_in_the_data_dir_unless_moved() {
    assert_eq!(load(&["--data-dir", "/d"]).unwrap().audit_log(), Path::new("/d/audit.log"));
    let o = with_file("audit.toml", "[audit]\nfile = \"/var/log/p.log\"\n", &[]).unwrap();
    assert_eq!(o.audit_log(), Path::new("/var/log/p.log"));
    let o = with_file("audit2.toml", "[audit]\nfile = \"/var/log/p.log\"\n", &["--audit-log", "/x.log"]).unwrap();
    assert_eq!(o.audit_log(), Path::new("/x.log"), "the flag wins");
    let e = with_file("audit3.toml", "[audit]\npath = \"/x\"\n", &[]).unwrap_err();
    assert!(e.to_string().contains("path"), "{e}");
}

#[test]
fn sim_subnets_default_to_one_per_zone_and_are_checked() {
    let o = load(&["--sim-zones", "a,b"]).unwrap();
    let want: std::collections::BTreeMap<String, Vec<String>> =
        [("subnet-a".to_owned(), vec!["a".to_owned()]), ("subnet-b".to_owned(), vec!["b".to_owned()])].into();
    assert_eq!(o.sim.subnets(), want);
    let o =
        with_file("subnets.toml", "[sim]\nzones = [\"a\", \"b\"]\nsubnets = { wide = [\"a\", \"b\"] }\n", &[]).unwrap();
    assert_eq!(o.sim.subnets().get("wide").map(Vec::len), Some(2));
    let e = with_file("badsubnets.toml", "[sim]\nzones = [\"a\"]\nsubnets = { s = [\"zz\"] }\n", &[]).unwrap_err();
    assert!(matches!(e, SettingsError::SimSubnet { .. }) && e.to_string().contains("\"zz\""), "{e}");
}

#[test]
fn ec2_settings_come_from_the_file_and_the_flags() {
    let o = with_file(
        "ec2.toml",
        "broker = \"ec2\"\n[ec2]\nregion = \"eu-west-1\"\nimage = \"ami-1\"\ninstance_type = \"t3.micro\"\nsubnet = \"subnet-9\"\nsecurity_groups = [\"sg-1\"]\n",
        &["--ec2-image", "ami-2", "--ec2-endpoint", "http://127.0.0.1:5000"],
    )
    .unwrap();
    assert_eq!(o.broker(), BrokerKind::Ec2);
    assert_eq!(o.ec2.region.as_deref(), Some("eu-west-1"));
    assert_eq!(o.ec2.image.as_deref(), Some("ami-2"), "the flag wins");
    assert_eq!(o.ec2.instance_type.as_deref(), Some("t3.micro"));
    assert_eq!(o.ec2.subnet.as_deref(), Some("subnet-9"));
    assert_eq!(o.ec2.security_groups, ["sg-1"]);
    assert_eq!(o.ec2.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
}

#[test]
fn the_ec2_interruption_queue_comes_from_the_file_or_the_flag() {
    let url = "https://sqs.us-east-1.amazonaws.com/123456789012/interruptions";
    let o = with_file("ec2-queue.toml", &format!("broker = \"ec2\"\n[ec2]\ninterruption_queue = \"{url}\"\n"), &[])
        .unwrap();
    assert_eq!(o.ec2.interruption_queue.as_deref(), Some(url));
    let o = with_file(
        "ec2-queue-flag.toml",
        &format!("[ec2]\ninterruption_queue = \"{url}\"\n"),
        &["--ec2-interruption-queue", "http://127.0.0.1:5000/123456789012/q"],
    )
    .unwrap();
    assert_eq!(o.ec2.interruption_queue.as_deref(), Some("http://127.0.0.1:5000/123456789012/q"), "the flag wins");
    assert_eq!(load(&[]).unwrap().ec2.interruption_queue, None, "not read by default");
    let e = with_file("ec2-queue-typo.toml", "[ec2]\ninterruption_queues = \"x\"\n", &[]).unwrap_err().to_string();
    assert!(e.contains("interruption_queues"), "{e}");
}

#[test]
fn lxd_settings_come_from_the_file_and_the_flags() {
    let file = "broker = \"lxd\"\nharvest_grace = \"30s\"\n[lxd]\nendpoint = \"https://10.0.0.2:8443\"\nimage = \"jammy\"\nclient_cert = \"/etc/c.pem\"\n";
    let o = with_file("lxd.toml", file, &["--lxd-image", "noble", "--lxd-project", "p1"]).unwrap();
    assert_eq!((o.broker(), o.harvest_grace), (BrokerKind::Lxd, Duration::from_secs(30)));
    let from_both = LxdSettings {
        endpoint: Some("https://10.0.0.2:8443".into()),
        image: Some("noble".into()), // the flag wins
        project: Some("p1".into()),
        client_cert: Some("/etc/c.pem".into()),
        ..LxdSettings::default()
    };
    assert_eq!(o.lxd, from_both);
    let e = with_file("bad-lxd.toml", "[lxd]\nendpont = \"x\"\n", &[]).unwrap_err().to_string();
    assert!(e.contains("endpont"), "{e}");
}

#[test]
fn sim_instance_types_come_from_the_file() {
    let o = with_file("types.toml", "[sim]\ninstance_type = \"m5.large\"\nout_of_capacity = [\"m5.large:az1\"]\n", &[])
        .unwrap();
    assert_eq!(o.sim.instance_type.as_deref(), Some("m5.large"));
    assert_eq!(o.sim.out_of_capacity, ["m5.large:az1"]);
    let none = ServeSettings::default();
    assert_eq!((none.sim.instance_type, none.sim.out_of_capacity.len()), (None, 0));
}

#[test]
fn flags_win_over_the_file_which_wins_over_defaults() {
    let o = with_file(
        "ok.toml",
        "listen = \"127.0.0.1:9999\"\nworkers = 4\nharvest_mode = \"ALL\"\nresync = \"5s\"\nbroker = \"ec2\"\n[retry]\ncount = 2\ndelay = \"1s\"\n[sim]\nzones = [\"a\"]\nstart_latency = \"100ms\"\n",
        &["--listen", "127.0.0.1:1", "--broker", "sim", "--sim-zones", " b, ,c "],
    )
    .unwrap();
    assert_eq!(o.listen(), "127.0.0.1:1");
    assert_eq!(o.broker(), BrokerKind::Sim);
    assert_eq!(o.workers, 4);
    assert_eq!(o.harvest_mode, HarvestMode::All, "harvest modes are case-insensitive");
    assert_eq!(o.resync, Duration::from_secs(5));
    assert_eq!((o.retry.count, o.retry.delay), (2, Duration::from_secs(1)));
    assert_eq!(o.sim.zones(), ["b", "c"]);
    assert_eq!(o.sim.start_latency(), Duration::from_millis(100));
    assert_eq!(o.data_dir(), Path::new(DEFAULT_DATA_DIR));
    let o = with_file("zoneless.toml", "[sim]\nzones = [\"a\"]\n", &["--sim-zones", ""]).unwrap();
    assert_eq!(o.sim.zones(), ZoneList::new(), "an empty flag is a zoneless cloud");
}

#[test]
fn injected_start_failures_come_from_the_file_and_the_flag() {
    assert_eq!(load(&[]).unwrap().sim.start_failures(), 0);
    let o = with_file("faults.toml", "[sim]\nstart_failures = 3\n", &[]).unwrap();
    assert_eq!(o.sim.start_failures(), 3);
    let o = with_file("faults-flag.toml", "[sim]\nstart_failures = 3\n", &["--sim-start-failures", "1"]).unwrap();
    assert_eq!(o.sim.start_failures(), 1, "the flag wins");
    assert!(Cli::command().try_get_matches_from(["serve", "--sim-start-failures", "-1"]).is_err());
}

#[test]
fn container_initialiser_settings_come_from_the_file_and_the_flags() {
    let o = load(&[]).unwrap();
    assert_eq!((o.sim.container_init_delay(), o.sim.container_init_failures()), (Duration::from_secs(1), 0));
    let o = with_file(
        "containers.toml",
        "[sim]\ncontainer_init_delay = \"3s\"\ncontainer_init_failures = 2\n",
        &["--sim-container-init-delay", "250ms"],
    )
    .unwrap();
    assert_eq!(o.sim.container_init_delay(), Duration::from_millis(250), "the flag wins");
    assert_eq!(o.sim.container_init_failures(), 2);
    let o = load(&["--sim-container-init-failures", "4"]).unwrap();
    assert_eq!(o.sim.container_init_failures(), 4);
    assert!(Cli::command().try_get_matches_from(["serve", "--sim-container-init-failures", "-1"]).is_err());
}

#[test]
fn lease_settings_come_from_the_file_and_the_flags_and_are_checked() {
    let o = load(&[]).unwrap();
    assert_eq!(o.lease.timings(), Ok(LeaseTimings::default()));
    assert_eq!(o.lease.replica_id, None);
    let o = with_file(
        "lease.toml",
        "[lease]\nduration = \"20s\"\nrenew_deadline = \"15s\"\nretry = \"3s\"\nreplica_id = \"r1\"\n",
        &["--lease-retry", "1s", "--replica-id", "r2"],
    )
    .unwrap();
    let t = o.lease.timings().unwrap();
    assert_eq!((t.lease(), t.renew_deadline(), t.retry()), (secs(20), secs(15), secs(1)), "the flag wins");
    assert_eq!(o.lease.replica_id.as_deref(), Some("r2"));
    let o = load(&["--lease", "4s", "--lease-renew-deadline", "3s", "--lease-retry", "500ms"]).unwrap();
    assert_eq!(o.lease.timings().map(|t| t.lease()), Ok(secs(4)));
    let e = load(&["--lease", "8s"]).unwrap_err();
    assert!(matches!(e, SettingsError::Lease(LeaseTimingsError::LeaseNotAboveDeadline { .. })), "{e:?}");
    assert_eq!(e.to_string(), "config: lease.duration (8s) must be longer than lease.renew_deadline (8s)");
    assert!(std::error::Error::source(&e).is_some(), "the timings' error is kept as the source");
    let e = with_file("badlease.toml", "[lease]\nretry = \"7s\"\n", &[]).unwrap_err();
    assert!(e.to_string().contains("lease.renew_deadline (8s) must be longer than 1.2 × lease.retry (7s)"), "{e}");
    let e = with_file("zerolease.toml", "[lease]\nretry = \"0s\"\n", &[]).unwrap_err();
    assert_eq!(e.to_string(), "config: lease.retry must be positive");
    let e = with_file("unknownlease.toml", "[lease]\nttl = \"1s\"\n", &[]).unwrap_err();
    assert!(e.to_string().contains("unknown field `ttl`"), "{e}");
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// An environment variable sits between the flag and the file. (The test renames the
/// variable of `--listen`, so that no other test sees it.)
#[test]
fn a_variable_wins_over_the_file_and_loses_to_the_flag() {
    let var: &'static str = format!("PROVISIONER_TEST_LISTEN_{}", std::process::id()).leak();
    std::env::set_var(var, "127.0.0.1:2");
    let p = file("env.toml", "listen = \"127.0.0.1:9999\"\nworkers = 3\n");
    let command = || Cli::command().mut_arg("listen", |a| a.env(var));
    let load = |args: &[&str]| {
        let matches = command().get_matches_from(["serve", "--config", p.to_str().unwrap()].iter().chain(args));
        ServeSettings::load(&matches).unwrap()
    };
    let from_var = load(&[]);
    let from_flag = load(&["--listen", "127.0.0.1:3"]);
    std::env::remove_var(var);
    assert_eq!((from_var.listen(), from_var.workers), ("127.0.0.1:2", 3), "the variable over the file");
    assert_eq!(from_flag.listen(), "127.0.0.1:3", "the flag over the variable");
}

#[test]
fn the_store_is_sqlite_unless_a_postgres_url_is_given() {
    assert_eq!(load(&[]).unwrap().store.url(), StoreUrl::Sqlite);
    assert_eq!(load(&["--store", "sqlite"]).unwrap().store.url(), StoreUrl::Sqlite);
    for bad in ["mysql://h/db", "postgres://", "postgres:///db", "postgres://h:99999/db", "postgres://h:x/db", "pg"] {
        let e = Cli::command().try_get_matches_from(["serve", "--store", bad]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad}: {e}");
        assert!(e.to_string().contains("--store"), "the message names the flag: {e}");
    }
    let e = with_file("store.toml", "[store]\nurl = \"postgres://:5432/x\"\n", &[]).unwrap_err();
    assert!(e.to_string().contains("store.toml:2: store.url: "), "{e}");
    // The password is never shown.
    let e = StoreUrl::from_str("postgres://u:hunter2@/db").unwrap_err();
    assert!(e.contains("u:***@") && !e.contains("hunter2"), "{e}");
    #[cfg(feature = "postgres")]
    {
        let url = "postgres://u:hunter2@127.0.0.1:5432/prov";
        let o = with_file("pg.toml", "[store]\nurl = \"postgres://h/file\"\n", &["--store", url]).unwrap();
        assert_eq!(o.store.url(), StoreUrl::Postgres(url.into()), "the flag wins");
        assert_eq!(format!("{:?}", o.store.url()), "postgres://u:***@127.0.0.1:5432/prov");
        let o = with_file("pg2.toml", "[store]\nurl = \"postgresql://h/file\"\n", &[]).unwrap();
        assert_eq!(o.store.url(), StoreUrl::Postgres("postgresql://h/file".into()));
    }
    #[cfg(not(feature = "postgres"))]
    {
        let e = Cli::command().try_get_matches_from(["serve", "--store", "postgres://h/db"]).unwrap_err();
        assert!(e.to_string().contains("--features postgres"), "{e}");
    }
}

// A build without PostgreSQL refuses the URL itself (another test says so).
#[cfg(feature = "postgres")]
#[test]
fn init_is_for_sqlite_and_refused_with_postgres() {
    assert!(load(&["--init"]).unwrap().init);
    let e = load(&["--init", "--store", "postgres://p@127.0.0.1:5432/db"]).unwrap_err();
    assert!(matches!(e, SettingsError::InitWithPostgres), "{e:?}");
    assert!(e.to_string().contains("--init") && e.to_string().contains("first replica"), "{e}");
}

#[test]
fn plain_http_off_loopback_needs_insecure_http_and_tls_needs_both_files() {
    for ok in ["127.0.0.1:1", "[::1]:1", "localhost:1", "127.0.0.2:1"] {
        assert!(is_loopback(ok), "{ok}");
    }
    for not in ["0.0.0.0:1", "[::]:1", "10.0.0.1:1", "example.com:1"] {
        assert!(!is_loopback(not), "{not}");
    }
    let e = load(&["--listen", "0.0.0.0:7878"]).unwrap_err();
    assert!(matches!(e, SettingsError::InsecureListen { .. }) && e.to_string().contains("--insecure-http"), "{e}");
    assert!(load(&["--listen", "0.0.0.0:7878", "--insecure-http"]).unwrap().insecure_http == Some(true));
    let o = load(&["--listen", "0.0.0.0:7878", "--tls-cert", "c.pem", "--tls-key", "k.pem"]).unwrap();
    assert_eq!(o.tls_files(), Some((Path::new("c.pem"), Path::new("k.pem"))));
    assert!(matches!(load(&["--tls-cert", "c.pem"]).unwrap_err(), SettingsError::TlsPair));
    let o = with_file("tls.toml", "listen = \"0.0.0.0:1\"\ntls_cert = \"a.pem\"\ntls_key = \"b.pem\"\n", &[]).unwrap();
    assert_eq!(o.tls_files(), Some((Path::new("a.pem"), Path::new("b.pem"))), "the file's keys");
    let e = with_file("insecure.toml", "listen = \"0.0.0.0:1\"\n", &[]).unwrap_err();
    assert!(matches!(e, SettingsError::InsecureListen { .. }), "{e}");
    assert!(with_file("insecure2.toml", "listen = \"0.0.0.0:1\"\ninsecure_http = true\n", &[]).is_ok());
    let e = with_file("insecure3.toml", "listen = \"0.0.0.0:1\"\ninsecure_http = true\n", &["--insecure-http=false"]);
    assert!(matches!(e, Err(SettingsError::InsecureListen { .. })), "the flag wins over the file: {e:?}");
}

#[test]
fn bad_files_name_the_file_line_and_key() {
    let e = with_file("bad.toml", "workers = 4\nwrokers = 5\n", &[]).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("bad.toml:2: unknown field `wrokers`"), "{msg}");
    assert!(matches!(&e, SettingsError::File { source, .. } if source.span().is_some()), "{e:?}");
    let e = with_file("w.toml", "workers = 0\n", &[]).unwrap_err();
    assert_eq!(e.to_string(), "config: workers must be between 1 and 100, got 0");
    assert!(std::error::Error::source(&e).is_some(), "the config error is kept as the source");
    let e = with_file("d.toml", "[sim]\nstart_latency = \"soon\"\n", &[]).unwrap_err();
    assert!(
        e.to_string().ends_with("d.toml:2: sim.start_latency: invalid duration \"soon\": expected number at 0"),
        "{e}"
    );
    let e = with_file("r.toml", "[retry]\ndelay = 5\n", &[]).unwrap_err();
    assert!(e.to_string().ends_with("r.toml:2: retry.delay: invalid type: integer `5`, expected a string"), "{e}");
    let e = with_file("b.toml", "broker = \"gce\"\n", &[]).unwrap_err();
    assert!(e.to_string().contains("b.toml:1: broker: unknown variant `gce`"), "{e}");
    let e = with_file("h.toml", "harvest_mode = \"sometimes\"\n", &[]).unwrap_err();
    assert!(e.to_string().contains("h.toml:1: harvest_mode: invalid harvest mode \"sometimes\""), "{e}");
    let e = with_file("s.toml", "workers = \n", &[]).unwrap_err();
    assert!(e.to_string().contains("s.toml:1: "), "{e}");
    let e = with_file("z.toml", "resync = \"0s\"\n", &[]).unwrap_err();
    assert_eq!(e.to_string(), "config: resync must be positive");
    let e = load(&["--config", "/nonexistent/p.toml"]).unwrap_err();
    assert!(matches!(e, SettingsError::Read { .. }) && e.to_string().contains("cannot read config file"), "{e}");
}

#[test]
fn the_spot_price_cap_comes_from_the_file() {
    let o = with_file("spot.toml", "spot_max_price = 0.05\n", &[]).unwrap();
    assert_eq!(o.spot_max_price, crate::model::UsdPerHour::new(0.05));
    assert_eq!(with_file("none.toml", "", &[]).unwrap().spot_max_price, None);
    let e = with_file("bad-spot.toml", "spot_max_price = -2.0\n", &[]).unwrap_err().to_string();
    assert!(e.contains("spot_max_price") || e.contains("invalid price"), "{e}");
}

/// `--store-threads` / `[store] threads`: 8 unless set, 1 to 256, a bad value named.
#[test]
fn the_store_threads_are_eight_unless_set_within_range() {
    assert_eq!(load(&[]).unwrap().store.threads(), 8);
    assert_eq!(load(&["--store-threads", "2"]).unwrap().store.threads(), 2);
    assert_eq!(with_file("threads.toml", "[store]\nthreads = 32\n", &[]).unwrap().store.threads(), 32);
    for bad in ["0", "257", "many"] {
        let e = Cli::command().try_get_matches_from(["serve", "--store-threads", bad]).unwrap_err();
        assert!(e.to_string().contains("--store-threads"), "{bad}: {e}");
    }
    let e = with_file("threads0.toml", "[store]\nthreads = 0\n", &[]).unwrap_err();
    assert!(e.to_string().contains("store.threads must be between 1 and 256, got 0"), "{e}");
}
