"""A configuration change while 16 threads reserve: every reservation sees one version.

Version A allows only ``fpga`` in ``root.q``, version B only ``gpu``. A request for both can
only succeed if it saw A's fpga limit and B's gpu limit at once: a mix. So none may succeed,
while single-resource requests keep succeeding under whichever version is in force, and no
counter ever holds more than either version allows.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from quota_ledger import OverQuota, QuotaEngine, QuotaLedgerError

_DURATION = 6.0
_THREADS = 16


def _config(fpga: int, gpu: int) -> dict[str, object]:
    queue = {
        "name": "q",
        "resources": {"max": {"fpga": fpga, "gpu": gpu}},
        "maxapplications": 50,
        "limits": [{"users": ["*"], "maxapplications": 20}],
    }
    return {"partitions": [{"name": "default", "queues": [{"name": "root", "queues": [queue]}]}]}


A = _config(fpga=4, gpu=0)
B = _config(fpga=0, gpu=4)


def _watch_subtree_counters(
    url: URL, running: Callable[[], bool], observed: Tally[str], errors: list[BaseException]
) -> None:
    """While ``running()``: the most ever held (in use + reserved) on a subtree counter, per
    resource, read straight from the table; an error of its own goes to ``errors``."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            while running():
                rows = conn.execute(
                    text("SELECT resource, in_use + reserved FROM quota_usages WHERE scope_type = 'subtree'")
                ).all()
                conn.rollback()
                for resource, held in rows:
                    observed[resource] = max(observed[resource], held)
    except BaseException as error:  # pragma: no cover - reported by the test
        errors.append(error)
    finally:
        engine.dispose()


def test_config_change_under_load_never_mixes_versions(server_db_url: URL) -> None:
    ledger = QuotaEngine.from_url(server_db_url, pool_size=_THREADS + 4)
    ledger.apply_config(A)
    stop = time.monotonic() + _DURATION
    outcomes: Tally[str] = Tally()
    errors: list[BaseException] = []
    lock = threading.Lock()
    # The load lasts _DURATION and at least 5 configuration versions (a loaded machine may
    # apply fewer in that time), but never past the hard stop, where the assertion below fails.
    hard_stop = stop + 60.0

    def running() -> bool:
        now = time.monotonic()
        return now < hard_stop and (now < stop or outcomes["versions"] < 5)

    def worker(n: int) -> None:
        rng = random.Random(n)
        i = 0
        try:
            while running():
                i += 1
                request = rng.choice([{"fpga": 1}, {"gpu": 1}, {"fpga": 1, "gpu": 1}])
                kind = "+".join(sorted(request))
                app = f"app-{n}-{i}"
                try:
                    r = ledger.reserve("root.q", request, user=f"u{n % 4}", application=app, ttl=30)
                except OverQuota:
                    with lock:
                        outcomes[f"refused {kind}"] += 1
                    continue
                with lock:
                    outcomes[f"reserved {kind}"] += 1
                if rng.random() < 0.5:
                    ledger.rollback(r.id)
                else:
                    ledger.commit(r.id)
                    ledger.release("root.q", request, user=f"u{n % 4}", application=app, finished=True)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    def switcher() -> None:
        flip = False
        try:
            while running():
                ledger.apply_config(B if flip else A)
                with lock:
                    outcomes["versions"] += 1
                flip = not flip
                time.sleep(0.05)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    observed = Tally[str]()

    def observer() -> None:
        _watch_subtree_counters(server_db_url, running, observed, errors)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(_THREADS)]
    threads += [threading.Thread(target=switcher), threading.Thread(target=observer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=_DURATION + 120)
    try:
        assert not errors, [repr(e) for e in errors if isinstance(e, QuotaLedgerError)] or errors
        assert outcomes["reserved fpga+gpu"] == 0, outcomes
        assert outcomes["versions"] >= 5, outcomes
        assert outcomes["reserved fpga"] > 0, outcomes
        assert outcomes["reserved gpu"] > 0, outcomes
        assert observed["fpga"] <= 4, observed
        assert observed["gpu"] <= 4, observed
        print(dict(outcomes), dict(observed))
        assert ledger.audit() == []
    finally:
        ledger.close()


def test_pods_under_a_resource_quota_never_exceed_it_while_it_changes(server_db_url: URL) -> None:
    """16 threads reserve, commit, roll back and release pods under a ResourceQuota whose
    ``hard`` flips between 3 and 5 pods: the counter never passes 5, ends equal to the live
    reservations, and ``audit()`` agrees."""
    ledger = QuotaEngine.from_url(server_db_url, pool_size=_THREADS + 4)

    def quota(pods: int) -> dict[str, object]:
        return {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "q", "namespace": "team"},
            "spec": {"hard": {"pods": str(pods), "requests.cpu": "100"}},
        }

    ledger.apply_resource_quota(quota(5))
    stop = time.monotonic() + _DURATION
    errors: list[BaseException] = []
    admitted = Tally[str]()
    lock = threading.Lock()
    hard_stop = stop + 60.0

    def running() -> bool:  # _DURATION and more than 10 pods admitted, within the hard stop
        now = time.monotonic()
        return now < hard_stop and (now < stop or admitted["pods"] <= 10)

    def worker(n: int) -> None:
        rng = random.Random(n)
        i = 0
        try:
            while running():
                i += 1
                pod = {
                    "kind": "Pod",
                    "metadata": {"name": f"p{n}-{i}", "namespace": "team", "uid": f"u{n}-{i}"},
                    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]},
                }
                try:
                    made = ledger.reserve_pod(pod, ttl=30)
                except OverQuota:
                    continue
                with lock:
                    admitted["pods"] += 1
                if rng.random() < 0.3:
                    ledger.rollback(made.id)
                else:
                    ledger.commit(made.id)
                    if rng.random() < 0.9:
                        ledger.release_pod(pod)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    def switcher() -> None:
        flip = False
        try:
            while running():
                ledger.apply_resource_quota(quota(3 if flip else 5))
                flip = not flip
                time.sleep(0.05)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    peak = Tally[str]()

    def observer() -> None:
        engine = create_engine(server_db_url)
        try:
            with engine.connect() as conn:
                while running():
                    value = conn.execute(
                        text(
                            "SELECT in_use FROM quota_identity_usages"
                            " WHERE kind = 'quota' AND resource = 'pods'"
                        )
                    ).scalar()
                    conn.rollback()
                    peak["pods"] = max(peak["pods"], value or 0)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(_THREADS)]
    threads += [threading.Thread(target=switcher), threading.Thread(target=observer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=_DURATION + 60)
    try:
        assert not errors, errors
        assert admitted["pods"] > 10, admitted
        assert peak["pods"] <= 5, peak
        assert ledger.audit() == []
        print(dict(admitted), dict(peak))
    finally:
        ledger.close()


def test_set_limits_under_load_from_two_engines_never_mixes_limits(server_db_url: URL) -> None:
    """One engine flips ``root.q``'s max between fpga only and gpu only with ``set_limits``
    while 16 threads of two engines reserve: no reservation sees a mix, no counter passes 4,
    and the engine that does not write sees each new limit without compiling the whole
    configuration again."""
    writer = QuotaEngine.from_url(server_db_url, pool_size=_THREADS // 2 + 2)
    other = QuotaEngine.from_url(server_db_url, pool_size=_THREADS // 2 + 2)
    writer.apply_config(A)
    other.rollback(other.reserve("root.q", {"fpga": 1}).id)
    compiled = other.rules.compiles
    stop = time.monotonic() + _DURATION
    hard_stop = stop + 60.0
    outcomes: Tally[str] = Tally()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def running() -> bool:
        now = time.monotonic()
        return now < hard_stop and (now < stop or outcomes["versions"] < 10)

    def worker(n: int) -> None:
        ledger = writer if n % 2 else other
        rng = random.Random(n)
        try:
            while running():
                request = rng.choice([{"fpga": 1}, {"gpu": 1}, {"fpga": 1, "gpu": 1}])
                kind = "+".join(sorted(request)) + (" by the other" if ledger is other else "")
                try:
                    r = ledger.reserve("root.q", request, ttl=30)
                except OverQuota:
                    continue
                with lock:
                    outcomes[f"reserved {kind}"] += 1
                ledger.rollback(r.id)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    def switcher() -> None:
        flip = False
        try:
            while running():
                writer.set_limits("root.q", {"fpga": 0, "gpu": 4} if flip else {"fpga": 4, "gpu": 0})
                with lock:
                    outcomes["versions"] += 1
                flip = not flip
                time.sleep(0.02)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    observed = Tally[str]()

    def observer() -> None:
        _watch_subtree_counters(server_db_url, running, observed, errors)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(_THREADS)]
    threads += [threading.Thread(target=switcher), threading.Thread(target=observer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=_DURATION + 120)
    try:
        assert not errors, [repr(e) for e in errors if isinstance(e, QuotaLedgerError)] or errors
        assert outcomes["versions"] >= 10, outcomes
        assert outcomes["reserved fpga+gpu"] == 0, outcomes
        assert outcomes["reserved fpga+gpu by the other"] == 0, outcomes
        for kind in ("fpga", "gpu", "fpga by the other", "gpu by the other"):
            assert outcomes[f"reserved {kind}"] > 0, outcomes
        assert set(observed) >= {"fpga", "gpu"}, observed  # the observer saw the counters
        assert observed["fpga"] <= 4, observed
        assert observed["gpu"] <= 4, observed
        assert other.rules.compiles == compiled, "the other engine compiled the whole configuration"
        assert writer.audit() == []
    finally:
        writer.close()
        other.close()
