"""Schemathesis hooks for `.ci/schemathesis`: the check that a refused request changes nothing.

schemathesis has no such check built in. Before every request that may change state (POST, PUT,
DELETE) this takes a snapshot of what such a request could change: the machines (ids and life),
the applications, the settings and the model's life. After a 4xx answer the custom check
`no_state_change_on_4xx` takes it again and fails if anything a request could have done shows:
a new machine, an alive machine gone or no longer alive, an application added or changed, a
setting changed, the model no longer alive. (Provisioning itself goes on meanwhile: statuses,
instances and the removal of machines already dead are not compared.)

The service's address and token come from PROVISIONER_URL and PROVISIONER_TOKEN.
"""

import atexit
import json
import os
import sys
import urllib.request

import schemathesis

URL = os.environ.get("PROVISIONER_URL", "").rstrip("/")
TOKEN = os.environ.get("PROVISIONER_TOKEN", "")
MUTATING = {"POST", "PUT", "DELETE", "PATCH"}
# Snapshots taken before a mutating request, by the case's id.
BEFORE = {}
# How many refused mutating requests were compared (printed at the end by the script).
COUNTS = {"compared": 0, "changed": 0}


@atexit.register
def report():
    if URL:
        print(
            f"no_state_change_on_4xx: {COUNTS['compared']} refused changes compared, {COUNTS['changed']} changed the model",
            file=sys.stderr,
        )


def get(path):
    req = urllib.request.Request(URL + path, headers={"Authorization": "Bearer " + TOKEN})
    with urllib.request.urlopen(req, timeout=30) as res:
        return json.loads(res.read())


def snapshot():
    machines = {m["id"]: m["life"] for m in get("/v1/machines")}
    apps = {a["name"]: (a["units"], json.dumps(a["constraints"], sort_keys=True)) for a in get("/v1/applications")}
    config = {c["key"]: c["value"] for c in get("/v1/config")}
    life = get("/v1/status")["model_life"]
    return {"machines": machines, "applications": apps, "config": config, "model_life": life}


def differences(before, after):
    found = []
    new = sorted(set(after["machines"]) - set(before["machines"]))
    if new:
        found.append(f"machines added: {new}")
    for mid, life in before["machines"].items():
        if life == "alive" and after["machines"].get(mid) != "alive":
            found.append(f"machine {mid} was alive, now {after['machines'].get(mid, 'gone')}")
    if before["applications"] != after["applications"]:
        found.append(f"applications {before['applications']} became {after['applications']}")
    if before["config"] != after["config"]:
        found.append(f"settings {before['config']} became {after['config']}")
    if before["model_life"] != after["model_life"]:
        found.append(f"model {before['model_life']} became {after['model_life']}")
    return found


# The most machines one fuzzed request adds (`count`, `units`): the service takes 10,000, but a
# run whose requests each add thousands spends its time provisioning them and listing them for
# the snapshots. Larger valid values are lowered to this (the bound itself is the document's
# `maximum`, and invalid values such as 10,001 are sent as generated).
MAX_ADDED = 20


def cap_adds(case):
    if case.method.upper() != "POST" or case.path not in ("/v1/machines", "/v1/applications"):
        return
    if not isinstance(case.body, dict):
        return
    for key in ("count", "units"):
        value = case.body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and MAX_ADDED < value <= 10000:
            case.body[key] = MAX_ADDED


@schemathesis.hook
def before_call(context, case, kwargs):
    cap_adds(case)
    if case.method.upper() in MUTATING:
        BEFORE[id(case)] = snapshot()


@schemathesis.check
def no_state_change_on_4xx(ctx, response, case):
    """A request answered 4xx changed nothing a request could change."""
    before = BEFORE.pop(id(case), None)
    if before is None or not 400 <= response.status_code < 500:
        return None
    COUNTS["compared"] += 1
    found = differences(before, snapshot())
    if found:
        COUNTS["changed"] += 1
        raise AssertionError(
            f"{case.method} {case.path} answered {response.status_code} but changed the model: " + "; ".join(found)
        )
    return None


def self_test():
    """The comparison finds every change a request could make, and ignores provisioning."""
    base = {"machines": {"0": "alive", "1": "dead"}, "applications": {}, "config": {"workers": "16"}, "model_life": "alive"}

    def changed(**parts):
        return differences(base, {**base, **parts})

    assert changed() == []
    assert changed(machines={"0": "alive"}) == [], "a dead machine's removal completing is provisioning"
    assert changed(machines={"0": "alive", "1": "dead", "2": "alive"}), "a machine added"
    assert changed(machines={"0": "dying", "1": "dead"}), "a machine removed"
    assert changed(machines={"1": "dead"}), "an alive machine gone"
    assert changed(applications={"web": (1, "{}")}), "an application added"
    assert changed(config={"workers": "4"}), "a setting changed"
    assert changed(model_life="dying"), "the model destroyed"
    print("schemathesis_hooks self-test: ok")


if __name__ == "__main__":
    self_test()
