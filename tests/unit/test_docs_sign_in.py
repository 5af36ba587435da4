"""No page or script tells anyone to put a token in an address: the dashboard signs in on a form."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: a token in an address, as an instruction: ``/ui?token=$T``, ``?token=qlt_...``, ``?token=<...>``
IN_AN_ADDRESS = re.compile(r"\?token=(\$|qlt_|<|\{)")


def test_no_page_puts_a_token_in_an_address() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "scripts" / "serve"]
    found = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for page in pages
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if IN_AN_ADDRESS.search(line)
    ]
    assert found == []


def test_the_dashboard_page_shows_its_screenshots() -> None:
    page = (ROOT / "docs" / "dashboard.md").read_text(encoding="utf-8")
    for name in ("login.png", "dashboard.png"):
        assert f"](images/{name})" in page, name
        image = ROOT / "docs" / "images" / name
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        width, height = int.from_bytes(image.read_bytes()[16:20]), int.from_bytes(image.read_bytes()[20:24])
        assert (width, height) == (1400, 900), name
