"""constraints.txt, which every install of CI goes through, pins each dependency pyproject.toml
names at a version its floor allows (h11>=0.16, starlette>=0.40: past published advisories)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
#: the extras CI installs with -c constraints.txt
CI_EXTRAS = ("test", "docs", "release", "openstack", "kubernetes")


def _pins() -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        name, equals, version = text.partition("==")
        assert equals, f"not a pin: {line!r}"
        key = canonicalize_name(name)
        assert key not in found, f"{name} is pinned twice"
        found[key] = Version(version)
    return found


def _named(group: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = project["dependencies"] if group == "runtime" else project["optional-dependencies"][group]
    return [Requirement(text) for text in texts]


@pytest.mark.parametrize("group", ["runtime", *CI_EXTRAS])
def test_constraints_pin_every_dependency_at_a_version_its_floor_allows(group: str) -> None:
    pins = _pins()
    for requirement in _named(group):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"constraints.txt does not pin {requirement.name} ({group})"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {requirement.name}=={pins[name]}, outside {requirement} ({group})"
        )


def test_constraints_pin_the_extras_packages_of_dependencies() -> None:
    pins = _pins()
    # psycopg[binary] and uvicorn[standard] pull in packages of their own: pinned too
    assert {"psycopg-binary", "uvloop", "httptools"} <= pins.keys()


def test_the_advisory_floors_hold() -> None:
    pins = _pins()
    assert pins["h11"] >= Version("0.16")
    assert pins["starlette"] >= Version("0.40")


def test_every_install_of_ci_uses_the_constraints() -> None:
    for path in ("scripts/serve", "scripts/test", "scripts/demo", "scripts/build", ".ci/run"):
        if path == ".ci/run" and not (ROOT / path).exists():
            continue  # a source archive carries no CI
        installs = [line for line in (ROOT / path).read_text().splitlines() if "pip install" in line]
        assert installs, path
        for line in installs:
            assert "-c constraints.txt" in line, f"{path}: {line.strip()}"
