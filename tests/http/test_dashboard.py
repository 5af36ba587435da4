"""The dashboard in a real headless Chromium (Debian's ``chromium``) at 1400x900, signed in on its
form: its DOM after the script ran, and screenshots of an idle ledger, a busy one and one with a
queue over its limit; no Content-Security-Policy violation and no horizontal scrolling."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from browser_support import Browser
from http_support import Service
from PIL import Image
from sqlalchemy import update

from quota_ledger import QuotaEngine
from quota_ledger.driver.schema import quota_journal, reservations
from quota_ledger.http import ui_tables
from quota_ledger.http.browser import source_hash as browser_hash

SIZE = (1400, 900)
IN_USE = (47, 111, 208)  # --used, #2f6fd0
AMBER = (217, 142, 4)  # --warn, #d98e04
RED = (208, 57, 46)  # --over, #d0392e
LEGEND = 300  # pixels of one colour in the legend's swatches (and a percentage's text)
CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: dev
            resources: {max: {vcore: 16, memory: 64Gi}}
            limits:
              - {users: ["sue"], maxresources: {vcore: 4}}
              - {users: ["*"], maxresources: {vcore: 6}}
              - {groups: ["ml"], maxresources: {memory: 32Gi}, maxapplications: 4}
            queues:
              - name: web
                resources: {max: {vcore: 8, memory: 16Gi}}
              - name: batch
                resources: {max: {vcore: 8, memory: 32Gi}}
          - name: prod
            resources: {max: {vcore: 32, memory: 128Gi}}
  - name: gpu
    queues:
      - name: root
        queues:
          - name: train
            resources: {max: {nvidia.com/gpu: 8}}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    running = Browser(*SIZE)
    yield running
    running.close()


def _open(
    browser: Browser, service: Service, tmp_path: Path, name: str, query: str
) -> tuple[str, Image.Image]:
    """The page's DOM after its script ran, and a screenshot (kept next to the test run)."""
    browser.sign_in(service.base, service.tokens["reader"])
    browser.open(f"{service.base}/ui?{query}")
    image = Image.open(browser.screenshot(tmp_path / f"dashboard-{name}.png")).convert("RGB")
    assert image.size == SIZE
    return browser.dom(), image


def _count(image: Image.Image, colour: tuple[int, int, int]) -> int:
    """Pixels of about this colour (antialiased edges differ a little)."""
    counted = image.getcolors(maxcolors=SIZE[0] * SIZE[1]) or []
    return sum(n for n, c in counted if all(abs(a - b) <= 6 for a, b in zip(c, colour, strict=True)))


def _history(dom: str) -> dict[str, object]:
    found = re.search(r'<script type="application/json" id="history-data">(.*?)</script>', dom, re.S)
    assert found, "no history data in the page"
    data: dict[str, object] = json.loads(found.group(1))
    return data


#: what is wider than the room it has: the page, or a panel (its table scrolls inside it)
OVERFLOW = """
[document.documentElement, ...document.querySelectorAll("section.panel")]
  .filter(function (el) { return el.scrollWidth > el.clientWidth; })
  .map(function (el) {
    const table = el.querySelector("table");
    return (el.id || (table && table.id) || el.tagName) + " " + el.scrollWidth + ">" + el.clientWidth;
  })
"""


def _overflowing(browser: Browser) -> list[str]:
    return list(browser.evaluate(OVERFLOW))


def _check_common(browser: Browser, dom: str, image: Image.Image, queue: str) -> None:
    # The legend, the docs link, the partition and window switches, the refresh state.
    legend = re.search(r'<div class="legend" id="legend">(.*?)</div>', dom, re.S)
    assert legend, "no legend"
    for words in ("in use", "reserved", "available", "at 80% of the limit", "at or over the limit"):
        assert words in legend.group(1), words
    assert '<a id="docs-link" href="/docs">' in dom
    assert re.search(r'id="partition-switch">.*<option selected="">default</option>', dom)
    assert "<option>gpu</option>" in dom
    assert '<select name="window" id="window-switch">' in dom
    assert re.search(r'id="refresh-text">refreshed \d\d:\d\d:\d\d \(\d+ s ago\)<', dom), "no refresh time"
    assert 'id="auto-refresh"' in dom
    # Every bar has its percentage; available is shown; quantities are in human units.
    assert re.search(r'class="pct (ok|warn|over)">\d+%</span>', dom)
    assert re.search(r'"num available"><span class="q[^"]*" data-r="memory" [^>]*>\d+(\.\d+)?[KMGT]i<', dom)
    # Users and groups with their limits (sue's at root.dev, the ml group's).
    users = dom[dom.index('id="users"') :]
    sue = r'data-name="sue">.*?"num limit"><span class="q" data-r="vcore" data-v="4000"[^>]*>4<'
    assert re.search(sue, users)
    groups = dom[dom.index('id="groups"') :]
    assert re.search(r'class="num limit"><span class="q" data-r="memory" [^>]*>32Gi<', groups)
    assert re.search(r'class="num limit"><span class="q" data-r="applications" [^>]*>4<', groups)
    # The chart: one SVG per resource, in use and reserved areas and the limit line.
    chart = dom[dom.index('id="history-chart"') :]
    for resource in ("memory", "vcore"):
        assert f'<svg class="chart" data-resource="{resource}"' in chart, resource
    assert 'class="area in-use"' in chart
    assert 'class="area reserved"' in chart
    assert 'class="limit"' in chart
    assert _history(dom)["queue"] == queue
    # The page fills the window: panels reach its right edge.
    right = [image.getpixel((SIZE[0] - 40, y)) for y in range(SIZE[1])]
    assert sum(1 for p in right if p == (255, 255, 255)) > 300, "the page does not fill the window"
    assert _overflowing(browser) == [], "something scrolls sideways"
    assert browser.violations() == []


def _age(engine: QuotaEngine, rid: str, made: float, resolved: float | None = None) -> None:
    """Stamp a reservation (and its commit) as made and resolved so many minutes ago."""
    now = engine.driver.run(lambda tx: tx.db_now())
    with engine.driver.engine.begin() as conn:
        values = {"created_at": now - timedelta(minutes=made)}
        if resolved is not None:
            values["resolved_at"] = now - timedelta(minutes=resolved)
            conn.execute(
                update(quota_journal)
                .where(quota_journal.c.reservation_id == rid)
                .values(created_at=values["resolved_at"])
            )
        conn.execute(update(reservations).where(reservations.c.id == rid).values(**values))


def _configure(service: Service) -> None:
    with service.client("admin") as admin:
        done = admin.put("/v1/config", content=CONFIG, headers={"Content-Type": "application/yaml"})
        assert done.status_code == 200, done.text


def test_an_idle_ledger(browser: Browser, service: Service, tmp_path: Path) -> None:
    _configure(service)
    dom, image = _open(browser, service, tmp_path, "idle", "queue=root.dev")
    _check_common(browser, dom, image, "root.dev")
    assert set(re.findall(r'class="pct (\w+)">(\d+)%', dom)) == {("ok", "0")}
    assert 'class="bar warn"' not in dom
    assert 'class="bar over"' not in dom
    assert 'id="pending" class="muted">No pending reservations.' in dom
    assert re.search(r'"num available"><span class="q" data-r="memory" data-v="68719476736"[^>]*>64Gi<', dom)
    assert _count(image, AMBER) < LEGEND  # the legend's swatches only
    assert _count(image, RED) < LEGEND


def _busy(engine: QuotaEngine) -> None:
    """An hour of work in root.dev and root.prod, ending with root.dev.web at 88%."""
    story = [  # queue, user, group, vcore, memory, made, committed (minutes ago; None: pending)
        ("root.dev.batch", "ann", "ml", "2", "8Gi", 58, 55),
        ("root.dev.web", "sue", "web", "2", "2Gi", 50, 46),
        ("root.prod", "ops", "ops", "6", "24Gi", 47, 44),
        ("root.dev.batch", "ann", "ml", "1", "12Gi", 40, 31),
        ("root.dev.web", "bob", "web", "3", "4Gi", 27, 22),
        ("root.dev.web", "sue", "web", "1", "1Gi", 18, None),
        ("root.dev.batch", "kim", "ml", "2", "4Gi", 9, None),
        ("root.dev.web", "bob", "web", "1", "1Gi", 4, None),
    ]
    for index, (queue, user, group, vcore, memory, made, committed) in enumerate(story):
        r = engine.reserve(
            queue,
            {"vcore": vcore, "memory": memory},
            user=user,
            groups=[group],
            application=f"{user}-{index}",
            ttl=3600,
        )
        if committed is not None:
            engine.commit(r.id)
        _age(engine, r.id, made, committed)
    hard = {"pods": "10", "requests.cpu": "4"}
    quota = {"metadata": {"name": "pods", "namespace": "team"}, "spec": {"hard": hard}}
    engine.apply_resource_quota({"apiVersion": "v1", "kind": "ResourceQuota", **quota})


def test_a_busy_ledger(browser: Browser, service: Service, tmp_path: Path) -> None:
    _configure(service)
    _busy(service.engine)
    dom, image = _open(browser, service, tmp_path, "busy", "queue=root.dev&window=1h")
    _check_common(browser, dom, image, "root.dev")
    web = re.search(r'data-queue="root.dev.web" data-resource="vcore">(.*?)</tr>', dom, re.S)
    assert web, "no root.dev.web row"
    assert 'class="bar warn"' in web.group(1)
    assert 'class="pct warn">88%<' in web.group(1)
    assert re.search(r'"num available"><span class="q" data-r="vcore" data-v="1000"[^>]*>1<', web.group(1))
    assert 'class="queue warn first selected"' not in dom  # root.dev itself is at 75%
    data = _history(dom)
    points = data["points"]
    assert isinstance(points, list)
    used = [p["in_use"]["vcore"] for p in points]
    assert used[0] == 0
    assert used[-1] == 8000  # 2 + 2 + 1 + 3 cores committed in root.dev
    assert len(set(used)) >= 5, "the chart should show the hour's steps"
    assert points[-1]["reserved"]["vcore"] == 4000
    assert dom.count("<tr><td title=") == 3  # three pending reservations
    assert re.search(r'id="resource-quotas">.*<td>team/pods</td><td>pods</td>', dom)
    users = dom[dom.index('id="users"') :]
    assert re.search(r'data-name="bob">.*?"num limit"><span class="q" data-r="vcore" data-v="6000"', users)
    assert _count(image, AMBER) > 4 * LEGEND
    assert _count(image, IN_USE) > 1000


def test_a_queue_over_its_limit(browser: Browser, service: Service, tmp_path: Path) -> None:
    _configure(service)
    _busy(service.engine)
    service.engine.set_limits("root.dev.web", {"vcore": 4})  # lowered below what it holds: 7
    dom, image = _open(browser, service, tmp_path, "over", "queue=root.dev.web&window=15m")
    _check_common(browser, dom, image, "root.dev.web")
    rest = dom[dom.index('data-queue="root.dev.web" data-resource="vcore"') :]
    row = rest[: rest.index("</tr>")]
    assert 'class="bar over"' in row
    assert 'class="pct over">175%<' in row
    assert re.search(r'data-v="-3000"[^>]*>\u22123<', row), "available should be -3 cores"
    assert re.search(r'<tr class="queue over selected" data-queue="root.dev.web" data-resource="vcore">', dom)
    assert re.search(r'<div class="card over" id="over-count"><b>1</b>', dom)
    assert _history(dom)["limits"] == {"memory": 16 * 2**30, "vcore": 4000}
    assert '<svg class="chart" data-resource="vcore"' in dom
    assert _count(image, RED) > 4 * LEGEND


def test_the_page_refreshes_itself(browser: Browser, service: Service) -> None:
    _configure(service)
    browser.sign_in(service.base, service.tokens["reader"], "/ui?refresh=1")
    assert browser.evaluate("location.pathname + location.search") == "/ui?refresh=1"
    assert 'data-queue="root.prod.new"' not in browser.dom()
    service.engine.set_limits("root.prod.new", {"vcore": 2})
    assert browser.wait_for("Number(document.body.dataset.refreshes) >= 1", 10), "no refresh"
    assert browser.wait_for("!!document.querySelector('[data-queue=\"root.prod.new\"]')", 5)
    dom = browser.dom()
    assert re.search(r'id="refresh-text">refreshed \d\d:\d\d:\d\d \(\d+ s ago\)<', dom)
    assert 'id="refresh-state" class="failed"' not in dom
    assert browser.violations() == []


WIDE = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: research-and-development
            resources: {max: {nvidia.com/gpu: 64, vcore: 512, memory: 4Ti, ephemeral-storage: 20Ti}}
            queues:
              - name: computer-vision
                queues:
                  - name: training-pipelines
                    resources: {max: {nvidia.com/gpu: 32, hugepages-2Mi: 64Gi, memory: 2Ti}}
"""


def test_the_queues_fit_their_card_at_1400x900(browser: Browser, service: Service, tmp_path: Path) -> None:
    with service.client("admin") as admin:
        done = admin.put("/v1/config", content=WIDE, headers={"Content-Type": "application/yaml"})
        assert done.status_code == 200, done.text
    queue = "root.research-and-development.computer-vision.training-pipelines"
    for _ in range(3):
        held = service.engine.reserve(queue, {"nvidia.com/gpu": "9", "memory": "600Gi"}, ttl=3600)
        service.engine.commit(held.id)
    service.engine.reserve(
        queue, {"nvidia.com/gpu": "4", "ephemeral-storage": "3Ti"}, user="a-long-user-name"
    )
    dom, _image = _open(browser, service, tmp_path, "wide", f"queue={queue}")
    assert "<td>nvidia.com/gpu</td>" in dom
    assert re.search(r'class="pct warn">\d+%</span>', dom)
    assert _overflowing(browser) == []
    # The percentage column is inside the card: its right edge is left of the card's.
    edges = browser.evaluate(
        "(function () { const panel = document.getElementById('queues-panel').getBoundingClientRect();"
        " return [...document.querySelectorAll('#queue-tree .pct')].map(function (el) {"
        " return panel.right - el.getBoundingClientRect().right; }); })()"
    )
    assert edges
    assert min(edges) >= 0, edges
    assert browser.violations() == []


def test_time_left_reads_as_a_person_says_it() -> None:
    cases = {0: "0 s", 45: "45 s", 59.9: "59 s", 60: "1 min", 3580: "59 min", 3600: "1 h", 7500: "2 h 5 min"}
    cases |= {86_400: "1 d", 97_200: "1 d 3 h"}
    assert {seconds: ui_tables.remaining(seconds) for seconds in cases} == cases


def test_the_page_has_no_style_attribute_and_its_inline_code_is_allowed_by_hash(service: Service) -> None:
    _configure(service)
    _busy(service.engine)
    with service.client("reader") as reader:
        page = reader.get("/ui", params={"queue": "root.dev"})
    assert page.status_code == 200
    assert "style=" not in page.text
    policy = page.headers["content-security-policy"]
    assert "'unsafe-inline'" not in policy
    assert "frame-ancestors 'none'" in policy
    assert policy.startswith("default-src 'self';")
    scripts = re.findall(r"<script>(.*?)</script>", page.text, re.S)
    styles = re.findall(r"<style>(.*?)</style>", page.text, re.S)
    assert len(scripts) == len(styles) == 1
    for code in (*scripts, *styles):
        assert browser_hash(code) in policy
    for name, value in {
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "cache-control": "no-store",
    }.items():
        assert page.headers[name] == value, name
    assert "strict-transport-security" not in page.headers  # plain HTTP
    # Pending reservations expire in minutes, not thousands of seconds.
    left = re.findall(
        r"<td class=num>([^<]*)</td></tr>", page.text.split("id=pending>", 1)[1].split("</table>")[0]
    )
    assert len(left) == 3
    assert all(re.fullmatch(r"\d+ min", each) for each in left), left


def test_dashboard_without_a_session_is_the_sign_in_form(service: Service) -> None:
    with service.client(None) as anonymous:
        for params in ({}, {"token": "qlt_nope"}, {"token": service.tokens["reader"]}):
            page = anonymous.get("/ui", params=params)
            assert page.status_code == 401
            assert "<form id=login method=post action='/ui/login'>" in page.text
            assert "set-cookie" not in page.headers or "quota_ledger_token" not in page.headers["set-cookie"]
            assert page.headers["content-security-policy"].startswith("default-src 'self';")
        assert anonymous.get("/ui", params={"window": "2h"}).status_code == 401
    with service.client("reader") as reader:
        assert reader.get("/ui", params={"window": "2h"}).status_code == 422
