"""moto's EC2 server for the EC2 integration tests, with two additions.

- Capacity failures, which moto lacks: MOTO_FAIL_ZONES="MODEL:ZONE,..." makes RunInstances
  for an instance tagged provisioner-model=MODEL into ZONE fail with
  InsufficientInstanceCapacity, as EC2 does when a zone is out of capacity. Keyed by model, so
  tests sharing one server do not see each other's faults.
- The server exits when the process that started it is gone (no stray servers after a test
  run, even one that was killed).

Usage: python moto_server.py -H 127.0.0.1 -p PORT
"""

import os
import sys
import threading
import time

from moto.ec2.exceptions import EC2ClientError
from moto.ec2.responses.instances import InstanceResponse
from moto.server import main

FAIL = {
    tuple(item.split(":", 1))
    for item in os.environ.get("MOTO_FAIL_ZONES", "").split(",")
    if ":" in item
}
_run_instances = InstanceResponse.run_instances


def run_instances(self):
    zone = self._get_param("Placement.AvailabilityZone")
    model = self._parse_tag_specification().get("instance", {}).get("provisioner-model")
    if (model, zone) in FAIL:
        raise EC2ClientError(
            "InsufficientInstanceCapacity",
            f"We currently do not have sufficient capacity in the Availability Zone you requested ({zone}).",
        )
    return _run_instances(self)


InstanceResponse.run_instances = run_instances


def exit_with_parent():
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


if __name__ == "__main__":
    threading.Thread(target=exit_with_parent, daemon=True).start()
    main(sys.argv[1:])
