"""scripts/bench's ``admission`` case: chosen by ``--admission`` or ``--cases admission``, in every
``--cases all`` run; its reviews are ones the webhook reads as pod CREATEs; its report names the
checks. The timing itself is the benchmark's, not a test's."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

# scripts/ is not on the path of the tests: the benchmark package is imported from there
from benchmarks.cases import admission
from benchmarks.settings import CASES, select_cases

from quota_ledger.kube import admission_review


def test_the_admission_case_is_chosen_by_its_flag_and_by_all() -> None:
    assert "admission" not in select_cases("default", "", http=False)
    assert "admission" in select_cases("default", "", http=False, admission=True)
    assert select_cases("admission", "", http=False) == ["admission"]
    assert select_cases("all", "", http=False) == list(CASES)
    assert "admission" not in select_cases("all", "admission", http=False, admission=True)


def test_its_reviews_are_pod_creates_the_webhook_reads() -> None:
    uid = str(uuid.uuid4())
    text = admission.review_template("team03", "1m").replace("@UID@", uid).replace("@NAME@", "p-1")
    review = admission_review.parse(json.loads(text))
    assert review.pod_create
    assert not review.dry_run
    pod = admission_review.pod_of(review)
    assert (pod["metadata"]["uid"], pod["metadata"]["namespace"]) == (uid, "team03")


def test_the_report_names_reviews_latency_and_the_checks() -> None:
    found = {"reviews_per_s": 200.0, "p50_ms": 150.0, "p99_ms": 900.0, "allowed": 9, "refused": 1}
    one = {"reviews_per_s": 150.0, "p50_ms": 6.0, "p99_ms": 12.0, "allowed": 3, "refused": 0}
    result = {
        **found,
        "by_clients": {"1": {**one, "rounds": [one, one]}, "50": {**found, "rounds": [found, found]}},
        "rounds": [found, found],
        "clients": 50,
        "workers": 2,
        "seconds": 10.0,
        "load_average": 1.5,
        "audit": [],
        "pending": 15,
        "allowed": 15,
        "refused": 2,
        "problems": [],
    }
    text = "\n".join(admission.section(result))
    assert "| 1 | 150 | 6.0 | 12.0 | 150, 150 |" in text
    assert "| 50 | 200 | 150.0 | 900.0 | 200, 200 |" in text
    assert "median of 2 rounds of 10 s (load average 1.5 at the start)" in text
    assert "audit() clean; 15 allowed = 15 pending reservations, 2 refused" in text
    result["problems"] = ["15 pods allowed, 14 pending reservations"]
    assert "15 pods allowed, 14 pending reservations" in "\n".join(admission.section(result))
