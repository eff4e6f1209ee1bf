"""Fixtures every test gets (the audit store in a temporary directory, the ``tracerag`` logger and
configuration restored), and the fixture plugins the tests share."""

from __future__ import annotations

import gc
import re

import hypothesis_budget
import pytest

from tracerag.config import reset_config

# Collection imports LangChain, pydantic, FastAPI and every test module: objects that live for
# the whole run. Rescanning them over and over while they are made (and while assertion rewriting
# builds each test module's syntax tree, when no bytecode cache holds it) cost about 1.5 s of
# CPU, so the collector waits until collection is done (``pytest_collection_finish``).
gc.disable()

pytest_plugins = [
    "pipeline_fixtures",
    "store_fixtures",
    "materials_fixtures",
    "adversarial_fixtures",
]


#: a module-level ``pytestmark`` naming the integration marker: every test of the module has it
_INTEGRATION_MODULE = re.compile(r"^pytestmark = pytest\.mark\.integration$", re.MULTILINE)


def _fast_suite(config) -> bool:
    """Whether this run is the fast suite (``-m "not integration"``)."""
    return " ".join(config.option.markexpr.split()) == "not integration"


def pytest_configure(config):
    """The fast suite loads the ``fast`` Hypothesis profile, every other run the ``full`` one
    (see ``hypothesis_budget``), unless a profile is named with ``--hypothesis-profile``."""
    if config.getoption("--hypothesis-profile") is None:
        hypothesis_budget.load("fast" if _fast_suite(config) else "full")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say when property tests drew fewer examples than their full count."""
    share = hypothesis_budget.share()
    if share < 1:
        terminalreporter.write_line(
            f"hypothesis profile {hypothesis_budget.profile()!r}: property tests drew "
            f"{share:.0%} of their examples (--hypothesis-profile=full draws them all)"
        )


def pytest_ignore_collect(collection_path, config):
    """Under ``-m "not integration"``, a module of integration tests only is not imported.

    Every one of its tests would be deselected; importing (and assert-rewriting) it and the
    clients it needs costs the fast suite time for nothing.
    """
    if not _fast_suite(config):
        return None
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if _INTEGRATION_MODULE.search(collection_path.read_text("utf-8")):
        return True
    return None


def pytest_collection_finish(session):
    """What collection imported lives for the whole run: the garbage collector stops rescanning it.

    Every full collection would otherwise walk LangChain's, pydantic's and FastAPI's module
    objects again; objects the tests make are collected as usual. The youngest generation is
    collected every 7,000 allocations instead of 700: the tests allocate in bursts (pipelines,
    apps, records): ten times fewer passes, about 0.7 s less collector CPU over the run.

    Nothing is collected before the freeze: with the collector off since this module was
    imported, that one pass would scan everything collection made (about 0.2 s of CPU) to free
    about 23,000 unreachable objects, a few MB that the run keeps instead.
    """
    gc.freeze()
    gc.set_threshold(7000, 10, 10)
    gc.enable()


@pytest.fixture(scope="session", autouse=True)
def _audit_store_in_temp_dir(tmp_path_factory):
    """Pipelines built with the default audit="auto" write to a temporary SQLite store."""
    import os

    path = tmp_path_factory.mktemp("audit") / "audit.sqlite"
    previous = os.environ.get("TRACERAG_STORE")
    os.environ["TRACERAG_STORE"] = str(path)
    reset_config()
    yield path
    if previous is None:
        os.environ.pop("TRACERAG_STORE", None)
    else:
        os.environ["TRACERAG_STORE"] = previous
    reset_config()


@pytest.fixture(autouse=True)
def _tracerag_logger_restored():
    """A test that sets the ``tracerag`` logger's level or propagation leaves it as it was."""
    import logging

    logger = logging.getLogger("tracerag")
    level, propagate, handlers = logger.level, logger.propagate, list(logger.handlers)
    yield
    logger.setLevel(level)
    logger.propagate = propagate
    for handler in [h for h in logger.handlers if h not in handlers]:
        logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def _fresh_config(monkeypatch):
    """Each test reads the environment it set up: tracerag reads ``TRACERAG_*`` once per process
    (``tracerag.config``), so a test that changes one through ``monkeypatch`` has it read anew."""
    setenv, delenv = monkeypatch.setenv, monkeypatch.delenv

    def set_and_reset(name, value, prepend=None):
        setenv(name, value, prepend)
        if str(name).startswith("TRACERAG_"):
            reset_config()

    def del_and_reset(name, raising=True):
        delenv(name, raising)
        if str(name).startswith("TRACERAG_"):
            reset_config()

    monkeypatch.setenv = set_and_reset
    monkeypatch.delenv = del_and_reset
    reset_config()
    yield
    reset_config()
