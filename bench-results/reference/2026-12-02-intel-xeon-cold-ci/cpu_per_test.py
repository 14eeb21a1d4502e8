"""pytest plugin: CPU seconds of each test (its process plus the children it waited for),
one JSON per xdist worker in $CPUACCT_DIR (default ./cpu-per-test)."""

import json
import os
import resource

import pytest

_rows = {}


def _cpu():
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = _cpu()
    yield
    _rows[item.nodeid] = _rows.get(item.nodeid, 0.0) + _cpu() - start


def pytest_sessionfinish(session):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    out = os.environ.get("CPUACCT_DIR", "cpu-per-test")
    os.makedirs(out, exist_ok=True)
    with open(f"{out}/{worker}.json", "w") as fh:
        json.dump(_rows, fh)
