"""moto's EC2 server for the EC2 integration tests, with these additions.

- Capacity failures, which moto lacks: MOTO_FAIL_ZONES="MODEL:ZONE,..." makes RunInstances
  for an instance tagged provisioner-model=MODEL into ZONE fail with
  InsufficientInstanceCapacity, as EC2 does when a zone is out of capacity. Keyed by model, so
  tests sharing one server do not see each other's faults.
- Capacity failures of one instance type: MOTO_FAIL_TYPES="MODEL:TYPE:ZONE,..." makes
  RunInstances of TYPE into ZONE for model MODEL fail with InsufficientInstanceCapacity (other
  types in that zone, and that type in other zones, still start).
- Spot capacity failures, which moto lacks: MOTO_FAIL_SPOT="MODEL:TYPE:ZONE,..." (TYPE or ZONE
  may be `*`) makes a spot RunInstances (InstanceMarketOptions.MarketType spot) of TYPE into ZONE
  for model MODEL fail with InsufficientInstanceCapacity, as EC2 answers when it has no spot
  capacity there; on-demand calls go through.
- Idempotent RunInstances, as EC2 is and moto is not (moto records ClientToken but a repeated
  token makes another instance): a call with a ClientToken seen before answers what the first
  call answered and makes nothing.
- Lost answers: MOTO_LOSE_RESPONSES="MODEL:N,..." makes the first N RunInstances calls for each
  machine (tag provisioner-machine) of model MODEL fail with InternalError after the call took
  effect (the first of them makes the instance; repeats of its token are answered from the
  record above, and also fail while the count lasts), as a call whose answer was lost would.
- RunInstances launches MaxCount instances, as EC2 does when it has the capacity (moto
  launches MinCount): a batched start asks MinCount 1, MaxCount N.
- Partial launches: MOTO_PARTIAL="MODEL:K,..." makes RunInstances for model MODEL launch at
  most K instances (at least one), as EC2 does under capacity pressure.
- Tagging that lags: MOTO_FAIL_TAGS="MARKER:N,..." makes the first N CreateTags calls whose
  provisioner-start tag contains MARKER fail with InvalidInstanceID.NotFound, as EC2 (eventually
  consistent) answers a CreateTags right after RunInstances now and then.
- Spot interruptions, which moto lacks: at start, the SQS queues MOTO_INTERRUPTION_QUEUE
  ("NAME[:VISIBILITY_SECONDS],...", in us-east-1, account 123456789012; the visibility timeout
  30 s unless given) and an EventBridge rule delivering EC2's interruption warnings, rebalance
  recommendations and state changes to every one of them are made (so that tests reading
  queues of their own do not take each other's notices); a CreateTags of the key
  provisioner-test-interrupt with the value SECONDS on an instance puts an "EC2 Spot Instance
  Interruption Warning" for it on the default bus (so onto the queue, by the rule), then, SECONDS
  later, terminates the instance with the state reason Server.SpotInstanceTermination, as EC2
  does two minutes after its warning.
- Replacements slow to answer: with MOTO_SLOW_REPLACEMENTS=SECONDS, a RunInstances for a machine
  (its provisioner-machine tag, or a batch's member tags) one of whose instances was interrupted
  as above makes its instance at once (running) and answers SECONDS later, as an EC2 call slow to
  answer: the replacement runs for that long before its provisioner can know of it, so a test
  sampling the cloud sees whether the interrupted instance outlives that (it must), and a test
  killing the provisioner then kills it mid hand-over.
- Failing status checks, which moto lacks (it reports every running instance `ok`): a
  CreateTags of the key provisioner-test-impair with the value `true` on an instance makes
  DescribeInstanceStatus report its instance status `impaired` (reachability failed) while it
  runs; the value `false` makes it `ok` again.
- The server exits when the process that started it is gone (no stray servers after a test
  run, even one that was killed).

Usage: python moto_server.py -H 127.0.0.1 -p PORT
"""

import json
import os
import sys
import threading
import time

from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models.instances import Instance, StateReason
from moto.ec2.responses.instances import InstanceResponse
from moto.ec2.responses.tags import TagResponse
from moto.server import main

FAIL = {
    tuple(item.split(":", 1))
    for item in os.environ.get("MOTO_FAIL_ZONES", "").split(",")
    if ":" in item
}
LOSE = {
    model: int(n)
    for model, n in (
        item.split(":", 1) for item in os.environ.get("MOTO_LOSE_RESPONSES", "").split(",") if ":" in item
    )
}
FAIL_TYPES = {
    tuple(item.split(":", 2))
    for item in os.environ.get("MOTO_FAIL_TYPES", "").split(",")
    if item.count(":") == 2
}
FAIL_SPOT = {
    tuple(item.split(":", 2))
    for item in os.environ.get("MOTO_FAIL_SPOT", "").split(",")
    if item.count(":") == 2
}
PARTIAL = {
    model: int(k)
    for model, k in (item.split(":", 1) for item in os.environ.get("MOTO_PARTIAL", "").split(",") if ":" in item)
}
FAIL_TAGS = {
    marker: int(n)
    for marker, n in (
        item.split(":", 1) for item in os.environ.get("MOTO_FAIL_TAGS", "").split(",") if ":" in item
    )
}
SLOW_REPLACEMENTS = float(os.environ.get("MOTO_SLOW_REPLACEMENTS", "0") or "0")
# (model, machine) of every interrupted instance.
INTERRUPTED = set()
_run_instances = InstanceResponse.run_instances
_create_tags = TagResponse.create_tags
# ClientToken -> the first call's answer; (model, machine) -> answers lost so far.
ANSWERS = {}
LOST = {}
LOCK = threading.Lock()


def run_instances(self):
    answer = _run_instances_once(self)
    tags = self._parse_tag_specification().get("instance", {})
    model = tags.get("provisioner-model")
    machines = {tags.get("provisioner-machine")}
    for key, value in tags.items():
        if key.startswith("provisioner-batch-members-"):
            machines.update(value.split(","))
    with LOCK:
        replacement = any((model, m) in INTERRUPTED for m in machines)
    if replacement and SLOW_REPLACEMENTS > 0:
        time.sleep(SLOW_REPLACEMENTS)
    return answer


def _run_instances_once(self):
    zone = self._get_param("Placement.AvailabilityZone")
    tags = self._parse_tag_specification().get("instance", {})
    model = tags.get("provisioner-model")
    machine = tags.get("provisioner-machine")
    token = self._get_param("ClientToken")
    with LOCK:
        if token and token in ANSWERS:
            answer = ANSWERS[token]
        else:
            instance_type = self._get_param("InstanceType")
            if (model, instance_type, zone) in FAIL_TYPES:
                raise EC2ClientError(
                    "InsufficientInstanceCapacity",
                    f"We currently do not have sufficient {instance_type} capacity in the Availability Zone you requested ({zone}).",
                )
            spot = self._get_param("InstanceMarketOptions.MarketType") == "spot"
            if spot and any(
                (model, t, z) in FAIL_SPOT for t in (instance_type, "*") for z in (zone, "*")
            ):
                raise EC2ClientError(
                    "InsufficientInstanceCapacity",
                    f"There is no Spot capacity available that matches your request ({instance_type} in {zone}).",
                )
            if (model, zone) in FAIL:
                raise EC2ClientError(
                    "InsufficientInstanceCapacity",
                    f"We currently do not have sufficient capacity in the Availability Zone you requested ({zone}).",
                )
            count = int(self._get_param("MaxCount", if_none="1"))
            if model in PARTIAL:
                count = max(1, min(count, PARTIAL[model]))
            self.params["MinCount"] = count
            answer = _run_instances(self)
            if token:
                ANSWERS[token] = answer
        lost = LOST.get((model, machine), 0)
        if lost < LOSE.get(model, 0):
            LOST[(model, machine)] = lost + 1
            raise EC2ClientError("InternalError", "An internal error has occurred (the answer was lost).")
    return answer


ACCOUNT = "123456789012"
REGION = "us-east-1"
INTERRUPT = "provisioner-test-interrupt"


def make_interruption_queues(specs):
    """The queues interruption notices arrive on, and the rule that delivers them to each."""
    from moto.events.models import events_backends
    from moto.sqs.models import sqs_backends

    targets = []
    for i, spec in enumerate(s for s in specs.split(",") if s):
        name, _, visibility = spec.partition(":")
        attributes = {"VisibilityTimeout": int(visibility)} if visibility else {}
        queue = sqs_backends[ACCOUNT][REGION].create_queue(name, **attributes)
        targets.append({"Id": f"queue-{i}", "Arn": queue.queue_arn})
    pattern = {
        "source": ["aws.ec2"],
        "detail-type": [
            "EC2 Spot Instance Interruption Warning",
            "EC2 Instance Rebalance Recommendation",
            "EC2 Instance State-change Notification",
        ],
    }
    events = events_backends[ACCOUNT][REGION]
    events.put_rule("provisioner-interruptions", event_pattern=json.dumps(pattern))
    events.put_targets("provisioner-interruptions", None, targets)


def interrupt(instance_id, seconds):
    """EC2's interruption of a spot instance: the warning now, the termination `seconds` later."""
    from moto.ec2.models import ec2_backends
    from moto.events.models import events_backends

    tags = ec2_backends[ACCOUNT][REGION].tags.get(instance_id, {})
    with LOCK:
        INTERRUPTED.add((tags.get("provisioner-model"), tags.get("provisioner-machine")))
    detail = {"instance-id": instance_id, "instance-action": "terminate"}
    events_backends[ACCOUNT][REGION].put_events(
        [
            {
                "Source": "aws.ec2",
                "DetailType": "EC2 Spot Instance Interruption Warning",
                "Detail": json.dumps(detail),
                "Resources": [f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{instance_id}"],
            }
        ]
    )

    def terminate():
        time.sleep(seconds)
        ec2 = ec2_backends[ACCOUNT][REGION]
        with LOCK:
            for instance, _ in ec2.terminate_instances([instance_id]):
                instance._reason = "Server.SpotInstanceTermination"
                instance.state_reason = StateReason(
                    "Server.SpotInstanceTermination: Spot instance termination", "Server.SpotInstanceTermination"
                )

    threading.Thread(target=terminate, daemon=True).start()


IMPAIR = "provisioner-test-impair"
# Instances whose status checks fail (CreateTags of IMPAIR).
IMPAIRED = set()
_instance_status = Instance.instance_status


def instance_status(self):
    if self.id in IMPAIRED and self.state_code == 16:
        return {"Details": [{"Name": "reachability", "Status": "failed"}], "Status": "impaired"}
    return _instance_status.fget(self)


Instance.instance_status = property(instance_status)


def create_tags(self):
    tags = self._get_param("Tags", [])
    impair = next((t.get("Value", "") for t in tags if t.get("Key") == IMPAIR), None)
    if impair is not None:
        with LOCK:
            for instance_id in self._get_param("Resources", []):
                if impair == "true":
                    IMPAIRED.add(instance_id)
                else:
                    IMPAIRED.discard(instance_id)
    trigger = next((t.get("Value", "") for t in tags if t.get("Key") == INTERRUPT), None)
    if trigger is not None:
        for instance_id in self._get_param("Resources", []):
            interrupt(instance_id, float(trigger))
    start = next((t.get("Value", "") for t in tags if t.get("Key") == "provisioner-start"), "")
    with LOCK:
        for marker in FAIL_TAGS:
            if marker in start and FAIL_TAGS[marker] > 0:
                FAIL_TAGS[marker] -= 1
                raise EC2ClientError("InvalidInstanceID.NotFound", "The instance ID does not exist (not yet visible).")
    return _create_tags(self)


InstanceResponse.run_instances = run_instances
TagResponse.create_tags = create_tags


def exit_with_parent():
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


if __name__ == "__main__":
    threading.Thread(target=exit_with_parent, daemon=True).start()
    if os.environ.get("MOTO_INTERRUPTION_QUEUE"):
        make_interruption_queues(os.environ["MOTO_INTERRUPTION_QUEUE"])
    main(sys.argv[1:])
