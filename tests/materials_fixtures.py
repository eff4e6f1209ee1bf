"""Fixtures for the material-registry tests: a registry on each store backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from store_fixtures import Backend

from tracerag.materials import CredibilityPolicy, MaterialRegistry


@pytest.fixture
def registry(backend: Backend) -> Iterator[MaterialRegistry]:
    """A registry beside a fresh audit store, on SQLite and (integration) PostgreSQL."""
    store = backend.open()
    reg = MaterialRegistry(store, policy=CredibilityPolicy(quarantine_after=3), owns_store=True)
    try:
        yield reg
    finally:
        reg.close()
