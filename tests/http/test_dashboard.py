"""The dashboard in a real headless Chromium (Debian's ``chromium``): its DOM and a screenshot."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from http_support import Service
from PIL import Image

USED_BAR = (59, 125, 216)  # the colour of the "used" part of a bar (#3b7dd8)
CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: dev
            resources: {max: {vcore: 8, memory: 16Gi}}
            limits:
              - {users: ["*"], maxresources: {vcore: 6}}
"""


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "Debian's chromium is needed for this test (scripts/test installs it as root)"
    return subprocess.run(
        [
            binary,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _populate(service: Service) -> None:
    with service.client("admin") as admin:
        admin.put("/v1/config", content=CONFIG, headers={"Content-Type": "application/yaml"})
        for user, vcore in (("sue", "4"), ("bob", "1")):
            made = admin.post(
                "/v1/reservations",
                json={
                    "queue": "root.dev.web",
                    "resources": {"vcore": vcore, "memory": "2Gi"},
                    "user": user,
                    "application": f"{user}-app",
                },
            ).json()
            admin.post(f"/v1/reservations/{made['id']}/commit")
        admin.post(
            "/v1/reservations", json={"queue": "root.dev.batch", "resources": {"vcore": "1"}, "ttl": 600}
        )
        admin.put(
            "/v1/resourcequotas/team/pods",
            json={
                "kind": "ResourceQuota",
                "metadata": {"name": "pods", "namespace": "team"},
                "spec": {"hard": {"pods": "10"}},
            },
        )


def test_dashboard_renders_in_chromium(service: Service, tmp_path: Path) -> None:
    _populate(service)
    url = f"{service.base}/ui?token={service.tokens['reader']}"
    dom = chromium("--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for element in ('id="queue-tree"', 'id="users"', 'id="groups"', 'id="pending"', 'id="resource-quotas"'):
        assert element in html, element
    assert 'data-queue="root.dev"' in html
    assert ">sue<" in html
    assert ">team/pods<" in html
    shot = tmp_path / "dashboard.png"  # kept next to the test run
    taken = chromium(f"--screenshot={shot}", "--window-size=1280,1400", url)
    assert taken.returncode == 0, taken.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 1400)
    pixels = image.getdata()
    bars = sum(1 for p in pixels if all(abs(a - b) <= 6 for a, b in zip(p, USED_BAR, strict=True)))
    assert bars > 200, "no usage bars drawn"
    assert len(set(pixels)) > 20, "the page is blank"


def test_dashboard_refuses_without_a_reader_token(service: Service) -> None:
    with service.client(None) as anonymous:
        assert anonymous.get("/ui").status_code == 401
        assert anonymous.get("/ui", params={"token": "qlt_nope"}).status_code == 401
        page = anonymous.get("/ui", params={"token": service.tokens["reader"]})
        assert page.status_code == 200
        assert "quota_ledger_token" in page.headers["set-cookie"]
        assert "HttpOnly" in page.headers["set-cookie"]
