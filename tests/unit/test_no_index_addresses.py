"""No tracked file names the address of a package index or registry.

Readers install from whatever index their machine is configured with (a mirror, a proxy, a
company index); the README and the Makefile name PyTorch's CPU-only wheel index in words and send
the reader to PyTorch's installation instructions for its address, which PyTorch keeps current.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Host names as tuples of labels, joined below, so that this file does not contain them itself.
INDEX_HOSTS = [
    ("pypi", "org"), ("pythonhosted", "org"), ("download", "pytorch", "org"),
    ("npmjs", "org"), ("npmjs", "com"), ("registry", "yarnpkg", "com"),
    ("conda", "anaconda", "org"), ("repo", "anaconda", "com"),
    ("deb", "debian", "org"), ("security", "debian", "org"), ("archive", "ubuntu", "com"),
]
PATTERN = re.compile("|".join(r"\.".join(labels) for labels in INDEX_HOSTS).encode(), re.IGNORECASE)


def tracked_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    return [ROOT / name for name in listed.stdout.decode().split("\0") if name]


def test_the_pattern_finds_what_it_should():
    assert PATTERN.search(b"--index-url https://" + b".".join((b"download", b"pytorch", b"org")))
    assert not PATTERN.search(b"https://pytorch.org/get-started/locally/")


def test_no_tracked_file_contains_a_package_index_address():
    found = []
    for path in tracked_files():
        if not path.is_file():  # deleted in the working tree, not yet committed
            continue
        for number, line in enumerate(path.read_bytes().splitlines(), start=1):
            match = PATTERN.search(line)
            if match:
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group().decode()}")
    assert not found, ("package index addresses (name the index in words and point to its "
                       "project's installation instructions instead):\n" + "\n".join(found))
