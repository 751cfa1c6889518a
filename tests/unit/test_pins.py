"""Pins live in pyproject.toml; environment.yml and requirements.lock must agree with them."""

import re
import tomllib
from pathlib import Path

import yaml

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


def pyproject_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
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
