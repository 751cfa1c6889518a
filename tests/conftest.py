"""Shared pytest configuration: markers for the slow layers of the suite."""


def pytest_configure(config):
    config.addinivalue_line("markers", "dist: runs real torch.distributed ranks (gloo)")
