"""Shared pytest configuration: markers for the slow layers of the suite, and the CPU backend.

The suite checks the book's CPU figures, so "auto" means gloo here even on a machine with GPUs
(`make selfcheck` is what runs the lessons on NCCL). The notebooks run by nbval inherit this.
"""

import os

os.environ.setdefault("LESSON_CODE_BACKEND", "gloo")


def pytest_configure(config):
    config.addinivalue_line("markers", "dist: runs real torch.distributed ranks (gloo)")
