"""``tracerag show``, ``tracerag audit verify`` and adding commands to the ``audit`` group."""

from __future__ import annotations

import json

import pytest
from store_fixtures import SQLiteBackend, make_record

from tracerag import cli
from tracerag.store.sqlite import SQLiteAuditStore
from tracerag.tools import cli_store


@pytest.fixture
def store_path(tmp_path):
    path = str(tmp_path / "audit.sqlite")
    store = SQLiteAuditStore(path)
    store.append_record(make_record("req-0001"))
    store.append_record(make_record("req-0002", decision="pass"))
    store.close()
    return path


def test_show_prints_the_timeline(store_path, capsys):
    assert cli.main(["show", "req-0001", "--store", store_path]) == 0
    out = capsys.readouterr().out
    assert out.startswith("REQUEST req-0001")
    for heading in ("QUESTION", "RETRIEVED MATERIALS", "PLAN", "SAMPLES", "OUTCOME"):
        assert heading in out
    assert "cited but NOT retrieved: M99" in out
    assert "review_enqueued" in out


def test_show_json_has_record_entries_and_review(store_path, capsys):
    assert cli.main(["show", "req-0001", "--store", store_path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["request_id"] == "req-0001"
    assert data["record"]["question"].startswith("I received a damaged kettle")
    assert [e["kind"] for e in data["entries"]][:3] == ["register", "retrieve", "plan"]
    assert all(len(e["hash"]) == 64 for e in data["entries"])
    assert data["review"]["status"] == "pending"


def test_show_an_unknown_request_exits_1(store_path, capsys):
    assert cli.main(["show", "no-such-request", "--store", store_path]) == 1
    assert "no-such-request" in capsys.readouterr().err


def test_show_reads_the_store_from_the_environment(store_path, monkeypatch, capsys):
    monkeypatch.setenv("TRACERAG_STORE", store_path)
    assert cli.main(["show", "req-0002"]) == 0
    assert "REQUEST req-0002" in capsys.readouterr().out


def test_a_bad_store_url_is_a_clear_error(capsys):
    with pytest.raises(SystemExit, match="cannot open the audit store"):
        cli.main(["show", "x", "--store", "mongodb://nowhere"])


def test_audit_verify_passes_on_an_intact_chain(store_path, capsys):
    assert cli.main(["audit", "verify", "--store", store_path]) == 0
    assert capsys.readouterr().out.startswith("audit chain intact")


def test_audit_verify_fails_on_a_changed_entry(store_path, capsys):
    SQLiteBackend(store_path).execute(
        "UPDATE audit_entries SET payload = ? WHERE seq = 2", ('{"materials": []}',)
    )
    assert cli.main(["audit", "verify", "--store", store_path]) == 1
    out = capsys.readouterr().out
    assert "BROKEN" in out and "changed" in out


def test_audit_verify_fails_on_a_removed_entry_and_reports_json(store_path, capsys):
    SQLiteBackend(store_path).execute("DELETE FROM audit_entries WHERE seq = 3")
    assert cli.main(["audit", "verify", "--store", store_path, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert "removed" in {issue["kind"] for issue in report["issues"]}


def test_audit_alone_prints_its_commands(capsys):
    assert cli.main(["audit"]) == 2
    assert "verify" in capsys.readouterr().out


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(cli_store, "_AUDIT_COMMANDS", dict(cli_store._AUDIT_COMMANDS))
    monkeypatch.setattr(cli_store, "_audit_added", set())
    monkeypatch.setattr(cli_store, "_audit_group", None)


def _configure(parser):
    parser.add_argument("--rounds", type=int, default=1)
    parser.set_defaults(func=lambda args: 40 + args.rounds)


def test_an_audit_subcommand_added_before_the_parser_is_built(registry):
    cli_store.add_audit_command("tamper-drill", "a test drill", _configure)
    assert cli.main(["audit", "tamper-drill", "--rounds", "2"]) == 42
    assert cli.main(["audit", "verify", "--json", "--store", ":memory:"]) == 0


def test_another_module_adds_an_audit_subcommand_from_its_own_add_parser(registry, monkeypatch):
    import sys
    import types

    module = types.ModuleType("tracerag_test_drill")

    def add_parser(subparsers):
        cli_store.add_audit_command("tamper-drill", "a test drill", _configure)

    module.add_parser = add_parser
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, module.__name__])
    assert cli.main(["audit", "tamper-drill"]) == 41
    parser = cli.build_parser()  # building twice does not add it twice
    assert parser.parse_args(["audit", "tamper-drill", "--rounds", "5"]).rounds == 5
