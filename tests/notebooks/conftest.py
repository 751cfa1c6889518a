"""Markers of the notebook tests."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "persian_outputs: every stored output of the Persian notebooks is Persian "
                   "(tests/notebooks/test_persian_outputs.py)")
