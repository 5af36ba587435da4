"""Names no configuration knows, over HTTP: a limit on a likely typo is set with ``warnings``
and ``Warning`` headers; a partition with ``unknownnames: refuse`` answers 422
``unknown_resource`` / ``unknown_queue`` and changes nothing."""

from __future__ import annotations

from http_support import Service

YAML = {"Content-Type": "application/yaml"}
CONFIG = """
partitions:
  - name: default
    unknownnames: {setting}
    queues:
      - name: root
        queues:
          - name: dev
            resources: {{max: {{nvidia.com/gpu: 4, vcore: 8}}}}
"""
VCORES = "`vcores` is not limited anywhere in partition default; did you mean `vcore`?"


def test_a_limit_on_a_likely_typo_is_set_with_a_warning(service: Service) -> None:
    with service.client("admin") as api:
        assert api.put("/v1/config", content=CONFIG.format(setting="warn"), headers=YAML).is_success
        typo = api.put("/v1/queues/root.dev/limits", json={"resources": {"vcores": 10}})
        assert typo.status_code == 200, typo.text
        assert typo.json() == {"version": 2, "warnings": [VCORES]}
        assert typo.headers["Warning"] == f'299 - "{VCORES}"'
        fine = api.put("/v1/queues/root.dev/limits", json={"resources": {"vcore": 6}})
        assert fine.json() == {"version": 3, "warnings": []}
        assert "Warning" not in fine.headers


def test_a_refusing_partition_answers_422_with_stable_codes(service: Service) -> None:
    with service.client("admin") as api:
        assert api.put("/v1/config", content=CONFIG.format(setting="refuse"), headers=YAML).is_success
        gpus = api.post("/v1/reservations", json={"queue": "root.dev", "resources": {"gpus": 1}})
        assert gpus.status_code == 422
        error = gpus.json()["error"]
        assert error["code"] == "unknown_resource"
        assert error["details"]["resources"] == ["gpus"]
        assert error["details"]["suggestions"] == {"gpus": "nvidia.com/gpu"}
        nope = api.post("/v1/reservations", json={"queue": "root.nope", "resources": {"vcore": 1}})
        assert nope.json()["error"]["code"] == "unknown_queue"
        assert nope.json()["error"]["details"]["suggestion"] == "root.dev"
        limit = api.put("/v1/queues/root.dev/limits", json={"resources": {"vcores": 10}})
        assert limit.json()["error"]["code"] == "unknown_resource"
        assert api.get("/v1/config").json()["version"] == 1
        assert api.get("/v1/queues/root/usage").json() == {}
