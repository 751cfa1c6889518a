"""Distributed tests start real gloo ranks through lesson_code.launch, like the notebooks do."""

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/dist/" in str(item.fspath):
            item.add_marker(pytest.mark.dist)
