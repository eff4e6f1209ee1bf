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
    assert results
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


# What the demo answered before the typed stage table, at its default seed (7): the same seed
# must give the same samples, so the same answers, confidences and routes.
SEED_7 = [
    ("warranty-laptop", "pass", 1.0,
     "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty. "
     "[warranty]"),
    ("gift-card-validity", "pass", 1.0,
     "A Northwind gift card is valid for 3 years from the date of purchase and cannot be "
     "exchanged for cash. [gift-cards]"),
    ("invoice-deadline", "pass", 1.0,
     "订单签收后90天内，可在“我的订单”页面申请开具发票。[invoices]"),
    ("password-lockout", "pass", 1.0,
     "登录密码连续输错5次后，账户将被锁定30分钟。[account-security]"),
    ("installation-cost", "escalate", 0.4472, None),
    ("opened-return-30-days", "escalate", 0.0, None),
    ("price-protection-window", "review", 0.7071,
     "根据2024年版第5.1条，商品签收后15天内降价的，可申请价格保护并退还差价。[price-protection-2024]"
     "根据第5.1条，商品签收后7天内降价的，可申请价格保护并退还差价。[price-protection]"),
    ("out-of-scope-hiring", "escalate", 0.0, None),
]


def test_demo_answers_by_default_are_unchanged(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--store", str(tmp_path / "a.sqlite"), "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    got = [
        (
            r["question"]["id"],
            r["response"]["decision"],
            r["response"]["confidence"],
            r["response"]["answer"],
        )
        for r in results
    ]
    assert got == SEED_7


def test_at_seed_1_every_bundled_question_takes_the_route_it_was_built_to_show(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--seed", "1", "--store", str(tmp_path / "a.sqlite"), "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    routes = [(r["question"]["id"], r["response"]["decision"]) for r in results]
    assert len(routes) == 8
    assert routes == [(r["question"]["id"], r["question"]["expect"]) for r in results]
