"""Tampering with the material registry's tables, as an intruder with database access: every
column that changes what retrieval or feedback does is re-derived from the hash chain, so
``tracerag audit verify`` catches each edit of a column or a forged row — plainly, with an
anchor, with the chain key. Forging the chain itself is caught with the key (and, for entries
before it, the anchor), the documented limit of a chain without either.

Running every attack of a backend prints the table (case → detected by plain verify / with
anchor / with key) at the end of the module (``pytest -s``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from store_fixtures import Backend, PostgresBackend
from tamper import ALL, ANCHOR, KEY, PLAIN, REGISTRY_ATTACKS, registry_scene

from tracerag.cli import main
from tracerag.materials import MaterialRegistry


def url_of(backend: Backend) -> str:
    if isinstance(backend, PostgresBackend):
        return f"{backend.dsn}?options=-csearch_path%3D{backend.schema}"
    return str(backend.path)  # type: ignore[attr-defined]


def verify(backend: Backend, monkeypatch: pytest.MonkeyPatch, *extra: str, key: str = "") -> int:
    from tracerag.config import reset_config

    with monkeypatch.context() as mp:
        if key:
            mp.setenv("TRACERAG_CHAIN_KEY", key)
        else:
            mp.delenv("TRACERAG_CHAIN_KEY", raising=False)
        reset_config()
        try:
            return main(["audit", "verify", "--store", url_of(backend), *extra])
        finally:
            reset_config()


def scene(backend: Backend, tmp_path: Path, key: str | None) -> str:
    """The registry's history on a fresh store; the anchor file written before any attack."""
    store = backend.open(chain_key=key)
    registry = MaterialRegistry(store, owns_store=True, metrics=False)
    try:
        registry_scene(registry)
        anchor = tmp_path / f"head-{'keyed' if key else 'plain'}.json"
        anchor.write_text(json.dumps(store.head()), "utf-8")
        assert store.verify_chain().ok and registry.verify().ok, registry.verify().issues
    finally:
        registry.close()
    return str(anchor)


def detection(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attack: str
) -> dict[str, bool]:
    """Run one attack on an unkeyed store (plain verify, verify with the anchor) and on a keyed
    one (verify with the key); which of them exit non-zero."""
    from tamper import KEY as CHAIN_KEY

    do, _expected = REGISTRY_ATTACKS[attack]
    anchor = scene(backend, tmp_path, None)
    # exit 1: something was found; 0: intact and fully checked; 3: intact as far as it could
    # check (no anchor: entries past the last export, or the whole chain, are not covered)
    assert verify(backend, monkeypatch) == 3
    assert verify(backend, monkeypatch, "--expect-head", anchor) == 0
    do(backend)
    found = {
        PLAIN: verify(backend, monkeypatch) == 1,
        ANCHOR: verify(backend, monkeypatch, "--expect-head", anchor) == 1,
    }
    backend.cleanup()
    if isinstance(backend, PostgresBackend):
        backend.schema = backend.schema + "k"
    else:
        backend.path = str(tmp_path / "keyed.sqlite")  # type: ignore[attr-defined]
    scene(backend, tmp_path, CHAIN_KEY)
    assert verify(backend, monkeypatch, key=CHAIN_KEY) == 3  # keyed, but no anchor
    do(backend)
    found[KEY] = verify(backend, monkeypatch, key=CHAIN_KEY) == 1
    return found


FOUND: dict[str, dict[str, dict[str, bool]]] = {}  # backend -> attack -> mode -> detected


@pytest.fixture(scope="module", autouse=True)
def table(request: pytest.FixtureRequest) -> Any:
    """After the module: the detection table of each backend whose every attack ran."""
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    for name, rows in FOUND.items():
        if reporter is None or len(rows) < len(REGISTRY_ATTACKS):
            continue
        reporter.write_line(f"\nregistry tampering on {name}: case | {' | '.join(ALL)}")
        for attack in REGISTRY_ATTACKS:
            marks = " | ".join("detected" if rows[attack][m] else "-" for m in ALL)
            reporter.write_line(f"  {attack} | {marks}")


@pytest.mark.parametrize("attack", list(REGISTRY_ATTACKS))
def test_registry_tampering_is_detected_where_promised(
    backend: Backend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    attack: str,
) -> None:
    name = backend.name
    found = detection(backend, tmp_path, monkeypatch, attack)
    capsys.readouterr()
    FOUND.setdefault(name, {})[attack] = found
    expected = REGISTRY_ATTACKS[attack][1]
    assert found == {mode: mode in expected for mode in ALL}, (attack, found)


def test_a_column_edit_names_the_column_and_what_the_chain_says(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    scene(backend, tmp_path, None)
    capsys.readouterr()
    REGISTRY_ATTACKS["materials.ema raised"][0](backend)
    REGISTRY_ATTACKS["material_versions.operator edited"][0](backend)
    assert verify(backend, monkeypatch) == 1
    out = capsys.readouterr().out
    assert "audit chain consistent as far as checked" in out  # the chain itself was not touched
    assert "gift-cards: materials.ema is 0.99, the chain says" in out
    assert "material_versions.operator is 'mallory', its chained body says 'lead'" in out


def test_a_write_landing_between_verify_reads_is_not_reported_as_tampering(
    store, monkeypatch
) -> None:
    """The registry's tables and the chain are read apart: a material registered between the
    two reads (as the server registers what it answers from, while an operator verifies) must
    not look like an entry without its row. Verify reads again and checks one moment."""
    import tracerag.materials._reconcile as module

    registry = MaterialRegistry(store, metrics=False)
    try:
        registry.register("returns", "Returns within 30 days.", operator="ops", written_by="ops")
        original = module.chained_events
        writes = iter(["privacy"])

        def chain_read_with_a_write_before(*args: Any, **kwargs: Any) -> Any:
            for material in writes:  # once: the write lands after the tables were read
                registry.register(
                    material, "We keep data 90 days.", operator="ops", written_by="ops"
                )
            return original(*args, **kwargs)

        monkeypatch.setattr(module, "chained_events", chain_read_with_a_write_before)
        report = registry.verify()
        assert report.ok and report.complete, report.issues
        assert report.checked == 2  # the second read saw both materials
    finally:
        registry.close()


def test_verify_says_not_checked_when_writes_never_pause(store, monkeypatch) -> None:
    """A registry written to during every read is not called intact, nor tampered: NOT CHECKED,
    and `tracerag audit verify` exits 3."""
    import tracerag.materials._reconcile as module

    monkeypatch.setattr(module, "VERIFY_READS", 3)
    registry = MaterialRegistry(store, metrics=False)
    try:
        registry.register("returns", "Returns within 30 days.", operator="ops", written_by="ops")
        original = module.chained_events
        count = iter(range(100))

        def chain_read_after_a_write(*args: Any, **kwargs: Any) -> Any:
            registry.register(f"m{next(count)}", "Text.", operator="ops", written_by="ops")
            return original(*args, **kwargs)

        monkeypatch.setattr(module, "chained_events", chain_read_after_a_write)
        report = registry.verify()
        assert report.ok and not report.complete
        assert "NOT CHECKED" in report.summary() and "3 reads" in report.summary()
    finally:
        registry.close()
