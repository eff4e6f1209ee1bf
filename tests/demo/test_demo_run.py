"""`tracerag demo`: the main job runs offline and shows every route, with its audit trail."""

from __future__ import annotations

import json

from tracerag.cli import main


def test_demo_routes_pass_review_and_escalate(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "audit.sqlite"
    assert main(["demo", "--store", str(store), "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    decisions = {r["response"]["decision"] for r in results}
    assert decisions == {"pass", "review", "escalate"}
    # each bundled question takes the route it was built to show
    routes = [(r["question"]["id"], r["response"]["decision"]) for r in results]
    assert routes == [(r["question"]["id"], r["question"]["expect"]) for r in results]
    for r in results:
        if r["response"]["decision"] == "escalate":
            assert r["response"]["answer"] is None and r["response"]["ticket_id"]
    assert (tmp_path / ".tracerag" / "traces.jsonl").stat().st_size > 0
    escalated = next(r for r in results if r["response"]["decision"] == "escalate")
    assert main(["show", escalated["response"]["request_id"], "--store", str(store)]) == 0
    assert "ESCALATE" in capsys.readouterr().out


def test_demo_prints_where_traces_went(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--store", str(tmp_path / "a.sqlite"), "--question",
                 "How long is the warranty on a laptop?"]) == 0
    out = capsys.readouterr().out
    assert "decision: PASS" in out
    assert "traces: .tracerag/traces.jsonl" in out
    assert "tracerag show" in out
