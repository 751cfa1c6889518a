"""Pins live in pyproject.toml; environment.yml, requirements.lock and the Makefile must agree."""

import re
import tomllib
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)$")


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lines):
    found = {}
    for line in lines:
        match = PIN.match(line.strip())
        if match:
            found[canonical(match.group(1))] = match.group(2)
    return found


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pyproject_pins():
    project = pyproject()
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += extra
    unpinned = [line for line in lines if not PIN.match(line)]
    assert not unpinned, f"pyproject.toml has dependencies without an exact pin: {unpinned}"
    return pins(lines)


def test_environment_yml_repeats_the_pyproject_pins():
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    assert pins(pip_section) == pyproject_pins()
    assert "python=3.11" in environment["dependencies"]


def test_the_lock_agrees_with_every_direct_pin():
    locked = pins((ROOT / "requirements.lock").read_text().splitlines())
    for name, version in pyproject_pins().items():
        assert locked.get(name) == version, f"{name}: pyproject {version}, lock {locked.get(name)}"


def test_torch_is_the_cpu_build_the_course_was_measured_with():
    assert pyproject_pins()["torch"] == "2.13.0"


def test_the_makefile_accepts_exactly_the_pythons_of_requires_python():
    accepted = SpecifierSet(pyproject()["requires-python"])
    in_range = [f"3.{minor}" for minor in range(6, 30) if f"3.{minor}" in accepted]
    listed = re.search(r"^PYTHON_VERSIONS := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert listed, "the Makefile no longer defines PYTHON_VERSIONS"
    assert listed.group(1).split() == in_range, f"Makefile {listed.group(1)}, requires-python {accepted}"


def test_the_conda_environment_is_the_tested_python_the_makefile_prefers():
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    python = next(item for item in environment["dependencies"]
                  if isinstance(item, str) and item.startswith("python="))
    version = python.split("=", 1)[1]
    assert version in SpecifierSet(pyproject()["requires-python"])
    listed = re.search(r"^PYTHON_VERSIONS := (\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert listed and listed.group(1) == version, "the Makefile must try the tested Python first"
