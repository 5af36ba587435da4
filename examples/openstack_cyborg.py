"""OpenStack Cyborg's quota story ("Quota Usage for Cyborg Resources") on the ledger's
oslo.limit-compatible enforcer, then 16 concurrent requests against one limit: oslo.limit's own
enforcer with a usage callback, and the ledger's claims.

The limits come from oslo.limit's own LimitFixture (no Keystone): an fpga limit of 5 for every
project. Runs offline on a fresh SQLite ledger in a temporary directory, or on the database URL
given as the first argument:

    pip install ".[openstack]"
    python examples/openstack_cyborg.py

The last line is JSON: {"oslo_limit_over_admitted": N, "ledger_over_admitted": M}.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from oslo_config import cfg
from oslo_limit import exception, fixture, limit

from quota_ledger.openstack import Enforcer

LIMIT = 5
REQUESTS = 16
#: the time between a request's check and its resource's creation (binding an accelerator)
CREATE_SECONDS = 0.05

# oslo.limit finds its endpoint (the service whose limits apply) from [oslo_limit]; the fixture
# answers for any endpoint id.
cfg.CONF.set_override("endpoint_id", "cyborg-endpoint", group="oslo_limit")


def show(enforcer: Enforcer, project: str, what: str) -> None:
    assert enforcer.engine is not None
    fpga = enforcer.engine.usage(f"root.{project}")["fpga"]
    print(f"{what}: fpga limit {fpga.limit}, used {fpga.in_use}, reserved {fpga.reserved}")


def cyborg_story(enforcer: Enforcer) -> None:
    """The specification's example: a limit of 5 with 3 used, two requests reserved until their
    attachment succeeds, then committed; one more request is refused."""
    project = "cyborg-demo"
    with enforcer.claim(project, {"fpga": 3}, key="attached-earlier"):
        pass
    show(enforcer, project, "3 fpgas attached")
    with (
        enforcer.claim(project, {"fpga": 1}, key="arq-1"),
        enforcer.claim(project, {"fpga": 1}, key="arq-2"),
    ):
        show(enforcer, project, "two requests reserved")
        time.sleep(CREATE_SECONDS)  # the attachments
    show(enforcer, project, "attachments done")
    try:
        with enforcer.claim(project, {"fpga": 1}, key="arq-3"):
            print("admitted: not expected")
    except exception.ProjectOverLimit as refused:
        print(f"one more request refused: {refused.over_limit_info_list[0]}")


def oslo_limit_race() -> tuple[int, int]:
    """16 requests at once through oslo.limit's enforcer, which counts with the service's
    callback: check, create, check again (delta 0) and delete what the recheck finds over.
    Returns (how many were created, how many the recheck left)."""
    created: list[int] = []
    lock = threading.Lock()

    def usage(project_id: str | None, names: object) -> dict[str, int]:
        with lock:
            return {"fpga": len(created)}

    enforcer = limit.Enforcer(usage)
    start = threading.Barrier(REQUESTS)
    passed = []

    def request(number: int) -> None:
        start.wait()
        try:
            enforcer.enforce("race-oslo", {"fpga": 1})
        except exception.ProjectOverLimit:
            return
        time.sleep(CREATE_SECONDS)
        with lock:
            created.append(number)
            passed.append(number)
        try:
            enforcer.enforce("race-oslo", {"fpga": 0})
        except exception.ProjectOverLimit:
            with lock:
                created.remove(number)

    run(request)
    return len(passed), len(created)


def ledger_race(enforcer: Enforcer) -> int:
    """16 requests at once through the ledger's claims; returns how many were created."""
    created: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(REQUESTS)

    def request(number: int) -> None:
        start.wait()
        try:
            with enforcer.claim("race-ledger", {"fpga": 1}, key=f"race-{number}"):
                time.sleep(CREATE_SECONDS)
                with lock:
                    created.append(number)
        except exception.ProjectOverLimit:
            return

    run(request)
    return len(created)


def run(request: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=request, args=(n,)) for n in range(REQUESTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main(url: str) -> None:
    with fixture.LimitFixture({"fpga": LIMIT}, {}), Enforcer(None, ledger=url) as enforcer:
        cyborg_story(enforcer)
        passed, kept = oslo_limit_race()
        print(
            f"oslo.limit, {REQUESTS} requests at once: {passed} passed the check and were created, "
            f"{passed - LIMIT} over the limit of {LIMIT}; the recheck deleted {passed - kept} again"
        )
        admitted = ledger_race(enforcer)
        print(
            f"ledger claims, {REQUESTS} requests at once: {admitted} admitted and created, "
            f"{REQUESTS - admitted} refused before creating anything"
        )
        print(
            json.dumps(
                {
                    "oslo_limit_over_admitted": max(0, passed - LIMIT),
                    "ledger_over_admitted": max(0, admitted - LIMIT),
                }
            )
        )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as directory:
            main(f"sqlite:///{directory}/cyborg.db")
