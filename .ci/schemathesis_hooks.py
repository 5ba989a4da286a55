"""Schemathesis hooks for `.ci/schemathesis`: the check that a refused request changes nothing.

schemathesis has no such check built in. Before every request that may change state (POST, PUT,
DELETE) this takes a snapshot of what such a request could change: the machines (ids and life),
the applications, the settings, the model's life, the API tokens (ids and revocations) and the
models (names and lives). After a 4xx answer the custom check
`no_state_change_on_4xx` takes it again and fails if anything a request could have done shows:
a new machine, an alive machine gone or no longer alive, an application added or changed, a
setting changed, the model no longer alive, a token created or revoked. (Provisioning itself goes on meanwhile: statuses,
instances and the removal of machines already dead are not compared.)

The service's address and token come from PROVISIONER_URL and PROVISIONER_TOKEN.
"""

import atexit
import json
import os
import sys
import urllib.error
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


def get_or(path, gone):
    """`get`, or `gone` when the route's model is no longer there (404) or not running (503):
    a destruction of the model `default` (`DELETE /v1/models/default?force=true`) removes what
    the plain routes mean."""
    try:
        return get(path)
    except urllib.error.HTTPError as e:
        if e.code in (404, 503):
            return gone
        raise


def snapshot():
    machines = {m["id"]: m["life"] for m in get_or("/v1/machines", [])}
    apps = {
        a["name"]: (a["units"], json.dumps(a["constraints"], sort_keys=True))
        for a in get_or("/v1/applications", [])
    }
    config = {c["key"]: c["value"] for c in get_or("/v1/config", [])}
    life = get_or("/v1/status", {"model_life": "gone"})["model_life"]
    tokens = {t["id"]: t["revoked"] for t in get_or("/v1/tokens", [])}
    models = {m["name"]: m["life"] for m in get("/v1/models")}
    return {
        "machines": machines,
        "applications": apps,
        "config": config,
        "model_life": life,
        "tokens": tokens,
        "models": models,
    }


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
    if before["tokens"] != after["tokens"]:
        found.append(f"API tokens {before['tokens']} became {after['tokens']}")
    # A dying model that is gone was removed by its reaper (its destruction completing, as a
    # dead machine's removal is provisioning), not by the request.
    after_models = dict(after["models"])
    for name, life in before["models"].items():
        if life == "dying" and name not in after_models:
            after_models[name] = life
    if before["models"] != after_models:
        found.append(f"models {before['models']} became {after['models']}")
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


# Every machine id an add answered (machines and applications' units).
CREATED = set()


@schemathesis.hook
def after_call(context, case, response):
    if case.method.upper() != "POST" or response.status_code != 201:
        return
    try:
        body = response.json()
    except Exception:
        return
    if case.path == "/v1/machines":
        CREATED.update(body.get("ids", []))
    elif case.path == "/v1/applications":
        CREATED.update(body.get("machines", []))


def missing_machine(response):
    """The machine a 404 says is not found (`machine ID not found`), if it says so."""
    try:
        error = response.json().get("error", "")
    except Exception:
        return None
    if error.startswith("machine ") and error.endswith(" not found"):
        return error[len("machine ") : -len(" not found")]
    return None


@schemathesis.hook
def filter_failure(context, failure, case, response):
    """Drops ST302 ("created resource not found") where the machine not found is none an add made.

    The check takes any 404 that follows a create, on an operation whose parameters all came
    from a link, for the new resource gone missing. Removal and retry have no parameters (their
    ids are in the body), so it holds vacuously for them; the stateful phase sends the new ids
    with fuzzed ones added (or fuzzed ones alone), and the service's all-or-nothing 404 names
    the fuzzed id it does not know. Such a 404 is right; one naming a machine an add answered
    is still a failure.
    """
    if getattr(failure, "code", None) != "ST302":
        return True
    if case.path not in ("/v1/machines/remove", "/v1/machines/retry"):
        return True
    missing = missing_machine(response)
    return missing is None or missing in CREATED


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
    base = {
        "machines": {"0": "alive", "1": "dead"},
        "applications": {},
        "config": {"workers": "16"},
        "model_life": "alive",
        "tokens": {"tok-1": None},
        "models": {"default": "alive"},
    }

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
    assert changed(tokens={"tok-1": None, "tok-2": None}), "a token created"
    assert changed(tokens={"tok-1": "2026-01-01T00:00:00.000Z"}), "a token revoked"
    assert changed(models={"default": "alive", "team-a": "alive"}), "a model added"
    assert changed(models={"default": "dying"}), "a model destroyed"
    assert changed(models={}), "a model removed"
    dying = {**base, "models": {"default": "alive", "team-a": "dying"}}
    assert differences(dying, base) == [], "a dying model's removal completing is not the request's"
    assert differences(dying, {**base, "models": {"team-a": "dying"}}), "an alive model removed"
    class Answer:
        def __init__(self, body):
            self.body = body

        def json(self):
            return self.body

    assert missing_machine(Answer({"error": "machine 3/lxd/0 not found"})) == "3/lxd/0"
    assert missing_machine(Answer({"error": "the model is dying"})) is None
    print("schemathesis_hooks self-test: ok")


if __name__ == "__main__":
    self_test()
