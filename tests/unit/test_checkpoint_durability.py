"""Lesson 80's disk flushes through the drive's cache: fcntl's F_FULLFSYNC where fcntl has it
(macOS, whose fsync stops at the drive), fsync where that call fails or does not exist (Linux)."""

import errno
import fcntl
import os

import pytest

from lesson_code.checkpoint.files import DISK

F_FULLFSYNC = 51  # its value on macOS


class Flushes(list):
    """The flushes asked of the system, as ("fsync" or "F_FULLFSYNC", handle), in order."""

    refuse = False  # whether F_FULLFSYNC fails, as on a filesystem that does not support it


@pytest.fixture
def flushes(monkeypatch):
    """Records the flushes instead of making them; each test says whether fcntl has F_FULLFSYNC."""
    asked = Flushes()

    def fcntl_call(handle, command, *args):
        assert command == F_FULLFSYNC, command
        asked.append(("F_FULLFSYNC", handle))
        if asked.refuse:
            raise OSError(errno.ENOTSUP, os.strerror(errno.ENOTSUP))
        return 0

    monkeypatch.setattr(fcntl, "fcntl", fcntl_call)
    monkeypatch.setattr(os, "fsync", lambda handle: asked.append(("fsync", handle)))
    return asked


def test_a_write_asks_for_a_full_fsync_of_the_file_and_its_folder(flushes, monkeypatch, tmp_path):
    monkeypatch.setattr(fcntl, "F_FULLFSYNC", F_FULLFSYNC, raising=False)
    DISK.write_atomically(tmp_path / "shard.pt", b"bytes")
    assert [kind for kind, _ in flushes] == ["F_FULLFSYNC", "F_FULLFSYNC"]  # file, then folder
    assert (tmp_path / "shard.pt").read_bytes() == b"bytes"


def test_fsync_where_the_filesystem_refuses_a_full_fsync(flushes, monkeypatch, tmp_path):
    monkeypatch.setattr(fcntl, "F_FULLFSYNC", F_FULLFSYNC, raising=False)
    flushes.refuse = True
    with open(tmp_path / "file", "wb") as handle:
        DISK.fsync(handle.fileno())
        assert flushes == [("F_FULLFSYNC", handle.fileno()), ("fsync", handle.fileno())]


def test_fsync_where_fcntl_has_no_full_fsync(flushes, monkeypatch, tmp_path):
    monkeypatch.delattr(fcntl, "F_FULLFSYNC", raising=False)
    with open(tmp_path / "file", "wb") as handle:
        DISK.fsync(handle.fileno())
        assert flushes == [("fsync", handle.fileno())]
