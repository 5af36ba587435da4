"""The README stays a short first hour and the documentation speaks of the project only.

The site itself is checked by `mkdocs build --strict` (broken links, missing pages); these tests
pin what that build cannot see: the README's length and links, and words that have no place in
user documentation.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_LINES = 260

# Development history does not belong in the documentation: work sessions, issue numbers.
FORBIDDEN = [
    re.compile(r"\bsessions?\s+#?\d+", re.IGNORECASE),
    re.compile(r"\b(this|last|next|previous|earlier|later)\s+session\b", re.IGNORECASE),
    re.compile(r"\bbefore\s+session\b", re.IGNORECASE),
    re.compile(r"\bissues?\s*#\s*\d+", re.IGNORECASE),
    re.compile(r"\bissues?[ -]\d+", re.IGNORECASE),
    re.compile(r"\bwhere the issue\b", re.IGNORECASE),
]
CODE_FOLDERS = ["quota_ledger", "scripts", "tests", "examples", "migrations"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def documentation_files() -> list[Path]:
    return [README, ROOT / "scripts" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    links = [target for target in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:|#", target)]
    return [target.split("#", 1)[0] for target in links]


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_readme_gives_the_two_commands_as_written() -> None:
    text = README.read_text(encoding="utf-8")
    assert re.search(r"^scripts/serve\b", text, re.MULTILINE)
    assert re.search(r"^scripts/test\b", text, re.MULTILINE)


def test_every_relative_link_in_the_readme_exists() -> None:
    targets = relative_links(README.read_text(encoding="utf-8"))
    assert targets, "the README links into the documentation"
    missing = [target for target in targets if not (ROOT / target).exists()]
    assert missing == []


def test_every_page_the_readme_links_in_docs_is_in_the_site_navigation() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(node: object) -> set[str]:
        if isinstance(node, str):
            return {node}
        if isinstance(node, dict):
            return set().union(*(pages(value) for value in node.values()))
        if isinstance(node, list):
            return set().union(*(pages(item) for item in node))
        return set()

    in_nav = pages(config["nav"])
    linked = {
        target.removeprefix("docs/")
        for target in relative_links(README.read_text(encoding="utf-8"))
        if target.startswith("docs/") and target.endswith(".md")
    }
    assert linked
    assert linked <= in_nav


@pytest.mark.parametrize("path", documentation_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_documentation_speaks_of_the_project_only(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = [match.group(0) for pattern in FORBIDDEN for match in pattern.finditer(text)]
    assert found == []


def source_files() -> list[Path]:
    files = [path for folder in CODE_FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))]
    files += [path for path in sorted((ROOT / "scripts").iterdir()) if path.is_file() and not path.suffix]
    return [path for path in files if path != Path(__file__).resolve()]


def test_code_and_comments_speak_of_the_project_only() -> None:
    found = {
        str(path.relative_to(ROOT)): match.group(0)
        for path in source_files()
        for pattern in FORBIDDEN
        for match in pattern.finditer(path.read_text(encoding="utf-8"))
    }
    assert found == {}


# The dashboard only shows the ledger (its routes are all GET): no page may offer it as a way to
# change anything.
DASHBOARD_WRITES = re.compile(
    r"\b(chang|edit|set|updat|apply|remov)\w*\b[^.;:]{0,80}\b(with|from|in|on|through)\b[^.;:]{0,40}"
    r"\bdashboard\b(?![^.;:]{0,20}only shows)",
    re.IGNORECASE,
)


def test_the_dashboard_is_read_only_and_no_page_says_otherwise() -> None:
    from quota_ledger.http import ui

    router = ui.build(engine=None, auth=None)  # type: ignore[arg-type]
    assert {method for route in router.routes for method in route.methods} == {"GET"}  # type: ignore[attr-defined]
    found = {
        str(path.relative_to(ROOT)): match.group(0)
        for path in documentation_files()
        for match in DASHBOARD_WRITES.finditer(" ".join(path.read_text(encoding="utf-8").split()))
    }
    assert found == {}
    assert DASHBOARD_WRITES.search("Limits changed since (with the CLI, the API or the dashboard) survive")


def test_the_performance_page_says_how_and_when_its_figures_were_measured() -> None:
    text = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert re.search(r"^scripts/bench\b.*--repeat", text, re.MULTILINE)
    assert re.search(r"\b20\d\d-\d\d-\d\d\b", text)


def test_the_forbidden_words_are_recognised() -> None:
    # Assembled from parts, so that this file does not itself hold the phrasings it forbids.
    word, ticket = "sess" + "ion", "iss" + "ue"
    samples = [
        f"Before {word} 4 the sweep took",
        f"{ticket} 3's case",
        f"({ticket} #12)",
        f"{ticket}-2 targets",
    ]
    for sample in samples:
        assert any(pattern.search(sample) for pattern in FORBIDDEN), sample
    for sample in ["each request runs in a database session of its own", "tokens are issued once"]:
        assert not any(pattern.search(sample) for pattern in FORBIDDEN), sample
