//! The service speaks the model (issue 14): constraints in Juju's syntax and as JSON,
//! placement, `machine show` and `GET /v1/machines/{id}`, list filters and pages, and
//! applications whose machines form a distribution group, driven on the real binary. Every
//! refusal is checked for its exit code or status, the field it names, and that nothing was
//! written.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use crate::support::{config_file, eventually, field, fields, ids_of, raw_http, sample, temp_dir, Server};

/// Runs a client command that must fail with `code`; returns its stderr.
fn refused(s: &Server, args: &[&str], code: i32) -> String {
    let out = s.cli(args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?} printed {:?}", String::from_utf8_lossy(&out.stdout));
    err
}

fn zone_of(s: &Server, id: &str) -> String {
    let m = s.json(&["machine", "show", id, "--json"]);
    field(&m, "zone").to_owned()
}

fn settled(s: &Server, ids: &[String]) -> bool {
    s.machines()
        .iter()
        .filter(|m| ids.contains(&field(m, "id").to_owned()))
        .all(|m| field(m, "status") == "started" || field(m, "instance_status") == "provisioning error")
}

/// `GET /v1/machines/{id}` answers `shown`, the document `machine show ID --json` printed.
fn assert_api_shows(s: &Server, id: &str, shown: &Value) {
    let (code, _, text) = raw_http(s, "GET", &format!("/v1/machines/{id}"), true, None);
    assert_eq!(code, 200, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), *shown);
}

/// `machine add --constraints ... --to zone=...` stores every constraint and the placement,
/// the provisioner honours them, and `machine show --json` (the same as `GET
/// /v1/machines/{id}`) shows everything the store holds: the list's keys and more.
#[test]
fn machines_take_constraints_and_placement_and_show_everything() {
    let dir = temp_dir("model-show");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let added = s.json(&[
        "machine",
        "add",
        "-n",
        "2",
        "--constraints",
        "cores=4 mem=0.5G root-disk=8G arch=arm64 instance-type=m6g.xlarge zones=az1,az2 spaces=db tags=ssd,^gpu",
        "--to",
        "zone=az2",
        "--wait",
        "--json",
    ]);
    assert_eq!(ids_of(&added), ["0", "1"]);
    let m = s.json(&["machine", "show", "1", "--json"]);
    let listed = s.machines().into_iter().find(|l| field(l, "id") == "1").unwrap();
    for key in ["id", "life", "status", "instance", "zone", "instance_status", "message"] {
        assert_eq!(m[key], listed[key], "{key}: show {m} list {listed}");
    }
    assert_eq!(field(&m, "status"), "started", "{m}");
    assert_eq!(field(&m, "zone"), "az2", "placed in az2: {m}");
    let c = &m["constraints"];
    assert_eq!(c["cores"], 4);
    assert_eq!(c["mem_mb"], 512, "0.5G is 512 MiB as Juju reads it");
    assert_eq!(c["root_disk_mb"], 8192);
    assert_eq!((field(c, "arch"), field(c, "instance_type")), ("arm64", "m6g.xlarge"));
    assert_eq!(c["zones"], serde_json::json!(["az1", "az2"]));
    assert_eq!(c["spaces"], serde_json::json!(["db"]));
    assert_eq!(c["tags"], serde_json::json!(["ssd", "^gpu"]));
    assert_eq!(field(&m, "placement"), "zone=az2");
    assert_eq!((&m["application"], &m["container_type"], &m["host"]), (&Value::Null, &Value::Null, &Value::Null));
    assert_eq!(m["manual"], false);
    assert!(field(&m, "changed_at").ends_with('Z'), "{m}");
    // The API answers the same document.
    assert_api_shows(&s, "1", &m);
    // The human form names the constraints in Juju's syntax.
    let out = s.cli(&["machine", "show", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("placement:") && text.contains("zone=az2"), "{text}");
    assert!(text.contains("cores=4 mem=512M root-disk=8192M tags=ssd,^gpu"), "{text}");

    // As a JSON object, with a machine that has none.
    let body = br#"{"count": 1, "constraints": {"cores": 2, "mem_mb": 4096, "tags": ["a"]}, "placement": "subnet=subnet-az3"}"#;
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines", true, Some(body));
    assert_eq!(code, 201, "{text}");
    let plain = s.json(&["machine", "add", "--json"]);
    eventually(Duration::from_secs(10), "the new machines to start", || settled(&s, &["2".into(), "3".into()]));
    let m2 = s.json(&["machine", "show", "2", "--json"]);
    assert_eq!((m2["constraints"]["cores"].clone(), m2["constraints"]["mem_mb"].clone()), (2.into(), 4096.into()));
    assert_eq!(field(&m2, "placement"), "subnet=subnet-az3");
    assert_eq!(field(&m2, "zone"), "az3", "the subnet's zone: {m2}");
    let m3 = s.json(&["machine", "show", &ids_of(&plain)[0], "--json"]);
    assert!(m3["constraints"].as_object().unwrap().values().all(Value::is_null), "{m3}");
    assert_eq!(m3["placement"], Value::Null);
}

/// Bad input is refused (exit 2 / 400, or 404 for an unknown machine), naming the field, and
/// writes nothing.
#[test]
fn bad_model_input_is_refused_naming_the_field_and_writes_nothing() {
    let dir = temp_dir("model-bad");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    for (args, names) in [
        (&["machine", "add", "--constraints", "cores=4 colour=blue"][..], &["constraints", "\"colour\""][..]),
        (&["machine", "add", "--constraints", "mem=lots"][..], &["\"mem\"", "\"lots\""][..]),
        (&["machine", "add", "--constraints", "cores=-1"][..], &["\"cores\""][..]),
        (&["machine", "add", "--constraints", "mem=1G mem=2G"][..], &["\"mem\"", "already set"][..]),
        (&["machine", "add", "--to", "zone=az9"][..], &["placement", "\"az9\""][..]),
        (&["machine", "add", "--to", "subnet=subnet-nowhere"][..], &["placement", "\"subnet-nowhere\""][..]),
        (&["machine", "add", "--to", "rack=4"][..], &["placement"][..]),
        (&["machine", "add", "--constraints", "zones=az9"][..], &["zones", "\"az9\""][..]),
        (&["application", "add", "Web", "--units", "2"][..], &["name", "\"Web\""][..]),
        (&["application", "add", "web", "--units", "2", "--constraints", "mem=lots"][..], &["\"mem\""][..]),
        (&["application", "remove", "nope"][..], &["\"nope\"", "not found"][..]),
        (&["machine", "show", "42"][..], &["machine 42 not found"][..]),
        (&["machine", "show", "3/lxd/0"][..], &["machine 3/lxd/0 not found"][..]),
        (&["machine", "list", "--zone", "az9"][..], &["zone", "\"az9\""][..]),
        (&["machine", "list", "--status", "sleepy"][..], &["status", "\"sleepy\""][..]),
    ] {
        let err = refused(&s, args, 2);
        for name in names {
            assert!(err.contains(name), "{err}");
        }
    }

    // The API: the same refusals, with the field named in the JSON error.
    for (body, names) in [
        (&br#"{"count": 1, "constraints": "colour=blue"}"#[..], "colour"),
        (br#"{"count": 1, "constraints": {"colour": "blue"}}"#, "colour"),
        (br#"{"count": 1, "constraints": {"cores": -1}}"#, "constraints.cores"),
        (br#"{"count": 1, "constraints": {"mem_mb": "lots"}}"#, "constraints.mem_mb"),
        (br#"{"count": 1, "constraints": 7}"#, "constraints"),
        (br#"{"count": 1, "placement": "zone=az9"}"#, "placement"),
        (br#"{"count": 1, "zones": ["az1"], "constraints": "zones=az2"}"#, "zones"),
    ] {
        let (code, _, text) = raw_http(&s, "POST", "/v1/machines", true, Some(body));
        assert_eq!(code, 400, "{}: {text}", String::from_utf8_lossy(body));
        let error = field(&serde_json::from_str::<Value>(&text).unwrap(), "error").to_owned();
        assert!(error.contains(names), "{}: {error}", String::from_utf8_lossy(body));
    }
    for (body, names) in [
        (&br#"{"name": "2web", "units": 1}"#[..], "name"),
        (br#"{"name": "web", "units": 0}"#, "units"),
        (br#"{"name": "web", "units": 1, "colour": 1}"#, "colour"),
        (br#"{"name": "web"}"#, "units"),
    ] {
        let (code, _, text) = raw_http(&s, "POST", "/v1/applications", true, Some(body));
        assert_eq!(code, 400, "{}: {text}", String::from_utf8_lossy(body));
        assert!(text.contains(names), "{text}");
    }
    for (path, status, names) in [
        ("/v1/machines/42", 404, "machine 42 not found"),
        ("/v1/machines/3%2Flxd%2F0", 404, "machine 3/lxd/0 not found"),
        ("/v1/machines?limit=0", 400, "limit"),
        ("/v1/machines?limit=lots", 400, "limit"),
        ("/v1/machines?colour=blue", 400, "colour"),
        ("/v1/machines?application=Web", 400, "application"),
        ("/v1/applications/nope", 405, "DELETE"),
    ] {
        let (code, _, text) = raw_http(&s, "GET", path, true, None);
        assert_eq!(code, status, "{path}: {text}");
        assert!(text.contains(names), "{path}: {text}");
    }
    let (code, _, text) = raw_http(&s, "DELETE", "/v1/applications/nope", true, None);
    assert_eq!(code, 404, "{text}");

    // Nothing was written.
    assert!(s.machines().is_empty(), "a refused request wrote machines");
    assert_eq!(s.json(&["application", "list", "--json"]), serde_json::json!([]));
    assert!(s.instances().is_empty());
    // And a good request after them gets the first id: no id was used up by a refusal.
    assert_eq!(ids_of(&s.json(&["machine", "add", "--json"])), ["0"]);
}

/// The machines of one application form its distribution group, so its units spread over
/// the zones whatever else the zones hold: three units over three zones land one per zone,
/// even with az1 already holding three machines (without the group they would avoid az1).
/// `application remove` takes its machines with it.
#[test]
fn an_applications_units_spread_over_zones_and_go_with_it() {
    let dir = temp_dir("model-apps");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let others = ids_of(&s.json(&["machine", "add", "-n", "3", "--to", "zone=az1", "--wait", "--json"]));
    assert!(others.iter().all(|id| zone_of(&s, id) == "az1"));
    let app = s.json(&["application", "add", "web", "--units", "3", "--constraints", "cores=2 mem=4G", "--json"]);
    let units = ids_of(&app);
    assert_eq!(units, ["3", "4", "5"]);
    eventually(Duration::from_secs(10), "the units to start", || settled(&s, &units));
    let zones: BTreeSet<String> = units.iter().map(|id| zone_of(&s, id)).collect();
    assert_eq!(zones, ["az1", "az2", "az3"].map(String::from).into(), "one unit per zone");
    for id in &units {
        let m = s.json(&["machine", "show", id, "--json"]);
        assert_eq!(field(&m, "application"), "web", "{m}");
        assert_eq!((m["constraints"]["cores"].clone(), m["constraints"]["mem_mb"].clone()), (2.into(), 4096.into()));
    }
    // Listed, and the list filters by application and zone.
    let listed = s.json(&["application", "list", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!((field(&listed[0], "name"), listed[0]["units"].clone()), ("web", 3.into()));
    assert_eq!(listed[0]["constraints"]["cores"], 2);
    let web = fields(&s.json(&["machine", "list", "--application", "web", "--json"]), "id");
    assert_eq!(web, units);
    let in_az1 = fields(&s.json(&["machine", "list", "--zone", "az1", "--json"]), "id");
    assert_eq!(in_az1.len(), 4, "{in_az1:?}");
    let out = s.cli(&["application", "list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("web") && text.contains("cores=2 mem=4096M"), "{text}");
    // A second application of the same name is refused (409: exit 1), and writes nothing.
    let err = refused(&s, &["application", "add", "web", "--units", "1"], 1);
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(s.machines().len(), 6);

    // Removed: its machines die, their instances are stopped, then they go.
    let out = s.cli(&["application", "remove", "web"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("3, 4, 5"));
    assert_eq!(s.json(&["application", "list", "--json"]), serde_json::json!([]));
    eventually(Duration::from_secs(10), "the units' machines to be removed", || s.machines().len() == 3);
    let live: BTreeSet<String> = s.instances().iter().map(|i| field(i, "machine").to_owned()).collect();
    assert_eq!(live, others.iter().cloned().collect(), "only the other machines keep instances");
}

/// A placement no zone satisfies is that machine's provisioning error, as the engine does: a
/// subnet whose only zone is unavailable, or a zone that is; a subnet in an available zone
/// starts there. `machine list --status` finds them.
#[test]
fn a_placement_no_zone_satisfies_is_the_machines_provisioning_error() {
    let dir = temp_dir("model-placement");
    let config = config_file(&dir, "down.toml", "[retry]\ncount = 0\n[sim]\nzones = [\"az1\", \"az2\"]\nunavailable_zones = [\"az3\"]\nsubnets = { subnet-a = [\"az1\"], subnet-down = [\"az3\"] }\n");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms", "--config", &config]);
    for to in ["subnet=subnet-down", "zone=az3"] {
        let out = s.cli(&["machine", "add", "--to", to, "--wait", "--json"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{to}: {err}");
        assert!(err.contains("failed to provision"), "{to}: {err}");
    }
    let ok = s.json(&["machine", "add", "--to", "subnet=subnet-a", "--wait", "--json"]);
    assert_eq!(zone_of(&s, &ids_of(&ok)[0]), "az1");
    // The default `subnet-ZONE` names are replaced by the configured ones.
    let err = refused(&s, &["machine", "add", "--to", "subnet=subnet-az1"], 2);
    assert!(err.contains("subnet-a, subnet-down"), "{err}");
    for id in ["0", "1"] {
        let m = s.json(&["machine", "show", id, "--json"]);
        assert_eq!(field(&m, "instance_status"), "provisioning error", "{m}");
        assert!(field(&m, "instance_status_message").contains("zone"), "{m}");
        assert_eq!(m["instance"], Value::Null);
    }
    let failed = s.json(&["machine", "list", "--status", "provisioning error", "--json"]);
    assert_eq!(failed.as_array().unwrap().iter().map(|m| field(m, "id")).collect::<Vec<_>>(), ["0", "1"]);
    let started = s.json(&["machine", "list", "--status", "started", "--json"]);
    assert_eq!(started.as_array().unwrap().iter().map(|m| field(m, "id")).collect::<Vec<_>>(), ["2"]);
    assert_eq!(s.instances().len(), 1);
}

/// `GET /v1/machines` pages in id order (numbers numerically): `after` the last id of a page
/// gives the next one, a short page is the last.
#[test]
fn machine_lists_page_in_id_order() {
    let dir = temp_dir("model-pages");
    let s = Server::start(&dir, &["--sim-start-latency", "50ms"]);
    let all = ids_of(&s.json(&["machine", "add", "-n", "12", "--json"]));
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/v1/machines?limit=5&after={a}"),
            None => "/v1/machines?limit=5".to_owned(),
        };
        let (code, _, text) = raw_http(&s, "GET", &path, true, None);
        assert_eq!(code, 200, "{text}");
        let page = fields(&serde_json::from_str::<Value>(&text).unwrap(), "id");
        assert!(page.len() <= 5);
        seen.extend(page.iter().cloned());
        if page.len() < 5 {
            break;
        }
        after = page.last().cloned();
    }
    assert_eq!(seen, all, "every machine once, in order: 0..=11 (10 after 9)");
    let (_, _, text) = raw_http(&s, "GET", "/v1/machines?after=9&limit=1", true, None);
    assert_eq!(field(&serde_json::from_str::<Value>(&text).unwrap()[0], "id"), "10");
}

/// `machine list` follows the pages (1,000 machines a request) and prints one list: every
/// machine once, in id order, in JSON and in the table; with a filter, the pages are the
/// filter's (seen failing before the client paged: one request for the whole list).
#[test]
fn machine_list_follows_the_pages() {
    let dir = temp_dir("model-cli-pages");
    let s = Server::start(&dir, &["--sim-start-latency", "10m"]);
    let mut all = ids_of(&s.json(&["machine", "add", "-n", "2100", "--json"]));
    all.extend(ids_of(&s.json(&["machine", "add", "-n", "3", "--to", "zone=az2", "--json"])));
    let lists = |s: &Server| {
        sample(&s.metrics(), "provisioner_http_requests_total{method=\"GET\",route=\"/v1/machines\",code=\"200\"}")
            .unwrap_or(0.0)
    };
    let before = lists(&s);
    let listed = fields(&s.json(&["machine", "list", "--json"]), "id");
    assert_eq!(listed, all, "every machine once, in id order");
    assert_eq!(lists(&s) - before, 3.0, "three pages of at most 1,000 for 2,103 machines");
    let out = s.cli(&["machine", "list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1 + all.len(), "one header, one row a machine");
    let empty = s.json(&["machine", "list", "--status", "error", "--json"]);
    assert_eq!(empty, serde_json::json!([]), "an empty list is still a JSON array");
}

/// `machine show` (and `GET /v1/machines/{id}`) counts the start attempts the provisioner made
/// and keeps the last one's error: a machine that starts at once took one attempt and has no
/// error; one whose type is out of capacity in az1 took two (az1, then az2) and its last
/// attempt succeeded; one asking for a type nobody has took three (`[retry] count = 2`) and
/// shows the last one's error. The human form shows both.
#[test]
fn machine_show_counts_start_attempts_and_the_last_error() {
    let dir = temp_dir("model-attempts");
    let config = config_file(&dir, "attempts.toml", "[retry]\ncount = 2\ndelay = \"50ms\"\n[sim]\nzones = [\"az1\", \"az2\"]\nout_of_capacity = [\"m5.large:az1\"]\n");
    let s = Server::start(&dir, &["--sim-start-latency", "20ms", "--config", &config]);
    // Machine 0 fills az2, so that az1 is the next machine's first choice.
    s.json(&["machine", "add", "--to", "zone=az2", "--wait", "--json"]);
    s.json(&["machine", "add", "--constraints", "instance-type=m5.large", "--wait", "--json"]);
    let out = s.cli(&["machine", "add", "--constraints", "instance-type=x9.nonesuch", "--wait", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    eventually(Duration::from_secs(10), "the machines to settle", || {
        settled(&s, &["0".into(), "1".into(), "2".into()])
    });
    let show = |id: &str| s.json(&["machine", "show", id, "--json"]);
    let m0 = show("0");
    assert_eq!((m0["start_attempts"].clone(), m0["last_error"].clone()), (1.into(), Value::Null), "{m0}");
    let m1 = show("1");
    assert_eq!(field(&m1, "zone"), "az2", "{m1}");
    assert_eq!((m1["start_attempts"].clone(), m1["last_error"].clone()), (2.into(), Value::Null), "{m1}");
    let m2 = show("2");
    assert_eq!(field(&m2, "instance_status"), "provisioning error", "{m2}");
    assert_eq!(m2["start_attempts"], 3, "{m2}");
    assert!(field(&m2, "last_error").contains("x9.nonesuch"), "{m2}");
    assert_api_shows(&s, "2", &m2);
    let out = s.cli(&["machine", "show", "2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("start-attempts:  3"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("last-error:") && l.contains("x9.nonesuch")), "{text}");
}

/// Capacity preferences (issue 33): `machine add --capacity` and `application add --capacity`
/// (its units inherit it) are kept, and `machine show` (and `GET /v1/machines/{id}`, and the
/// list) shows each machine's preference with what it got: the simulated cloud has spot
/// capacity, so `spot` and `prefer-spot` machines run on spot, others on on-demand. A
/// preference that is none of the three is refused naming the field, nothing written.
#[test]
fn capacity_preferences_are_kept_and_machine_show_tells_what_each_got() {
    let dir = temp_dir("model-capacity");
    let s = Server::start(&dir, &["--sim-start-latency", "20ms"]);
    s.json(&["machine", "add", "--wait", "--json"]);
    s.json(&["machine", "add", "--capacity", "spot", "--wait", "--json"]);
    let web = s.json(&["application", "add", "web", "--units", "2", "--capacity", "prefer-spot", "--json"]);
    assert_eq!(ids_of(&web), ["2", "3"]);
    eventually(Duration::from_secs(10), "the machines to start", || {
        settled(&s, &["0".into(), "1".into(), "2".into(), "3".into()])
    });
    let show = |id: &str| s.json(&["machine", "show", id, "--json"]);
    for (id, capacity, got) in [("0", "on-demand", "on-demand"), ("1", "spot", "spot"), ("3", "prefer-spot", "spot")] {
        let m = show(id);
        assert_eq!(
            (field(&m, "status"), field(&m, "capacity"), field(&m, "capacity_type")),
            ("started", capacity, got)
        );
        assert_api_shows(&s, id, &m);
    }
    let listed = s.machines();
    assert_eq!(fields(&Value::Array(listed), "capacity"), ["on-demand", "spot", "prefer-spot", "prefer-spot"]);
    let apps = s.json(&["application", "list", "--json"]);
    assert_eq!(field(&apps[0], "capacity"), "prefer-spot", "{apps}");
    let out = s.cli(&["machine", "show", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with("capacity:") && l.ends_with(" spot")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("capacity-type:") && l.ends_with(" spot")), "{text}");

    // Refused, naming the field: by the client (exit 2) and by the API (400).
    let err = refused(&s, &["machine", "add", "--capacity", "cheap"], 2);
    assert!(err.contains("--capacity") && err.contains("prefer-spot"), "{err}");
    let (code, _, text) = raw_http(&s, "POST", "/v1/machines", true, Some(br#"{"count": 1, "capacity": "cheap"}"#));
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("capacity: invalid capacity \\\"cheap\\\""), "{text}");
    let body = br#"{"name": "db", "units": 1, "capacity": "sometimes"}"#;
    let (code, _, text) = raw_http(&s, "POST", "/v1/applications", true, Some(body));
    assert_eq!(code, 400, "{text}");
    assert_eq!(s.machines().len(), 4, "nothing written");
}
