"""``tracerag demo --scenario bad-material``: the bad material is found and quarantined."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracerag.cli import main


def test_bad_material_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "scenario.sqlite")
    assert main(["demo", "--scenario", "bad-material", "--samples", "3", "--store", store]) == 0
    out = capsys.readouterr().out
    assert "the write gate holds it (pending_review): conflict: 60 days vs 7 days" in out
    assert "← QUARANTINED" in out
    assert (
        "most likely cause: returns-partner-feed v1, written by feed-bot with "
        "partner-feed-sync@3" in out
    )
    assert "returns-partner-feed retrieved: False" in out
    assert "audit chain consistent as far as checked" in out and "materials OK" in out
    # and the trace-back command says the same
    rid = next(
        line.split()[-1]
        for line in out.splitlines()
        if "investigation: tracerag trace-back" in line
    )
    assert main(["trace-back", rid, "--store", store]) == 0
    assert "with partner-feed-sync@3" in capsys.readouterr().out
