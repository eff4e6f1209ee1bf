"""``tracerag show``, ``tracerag audit verify`` and adding commands to the ``audit`` group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from store_fixtures import SQLiteBackend, make_record

from tracerag import cli
from tracerag.store._sqlite import SQLiteAuditStore
from tracerag.tools import _audit as cli_store


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
    store = SQLiteAuditStore(store_path)
    head = store.head()
    store.close()
    anchor = f"{head['seq']}:{head['hash']}"
    assert cli.main(["audit", "verify", "--store", store_path, "--expect-head", anchor]) == 0
    out = capsys.readouterr().out
    assert out.startswith("anchored to head") and "audit chain intact" in out


def test_audit_verify_without_an_anchor_says_so_and_exits_3(store_path, capsys):
    """Issue 22: plain verify exited 0 although a truncation or an emptied store would pass."""
    assert cli.main(["audit", "verify", "--store", store_path]) == 3
    out = capsys.readouterr().out
    assert out.startswith("no anchor: looked in")
    assert "audit chain consistent as far as checked" in out and "intact" not in out
    assert "NOT CHECKED: no anchor" in out
    assert cli.main(["audit", "verify", "--store", store_path, "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["complete"] is False and report["exit_status"] == 3


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
    assert cli.main(["audit", "verify", "--json", "--store", ":memory:"]) == 3  # no anchor


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


# -- reading commands never create a store; a bad --store is one clear line ------------------

READING = [["audit", "verify"], ["show", "req-0001"], ["metrics"], ["replay", "req-0001"]]


@pytest.mark.parametrize("command", READING, ids=lambda c: c[0])
def test_a_mistyped_store_path_is_an_error_and_is_not_created(tmp_path, command):
    """Issue: `audit verify --store <typo>` said "intact", exit 0, and created the file."""
    missing = tmp_path / "no" / "such" / "audit.sqlite"
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--store", str(missing)])
    message = str(exit_info.value)
    assert "cannot open the audit store" in message and "does not exist" in message
    assert "\n" not in message
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(
    "make_target",
    [
        lambda tmp: str(tmp),  # a directory
        lambda tmp: _write(tmp / "notes.txt", b"these are not the audit records\n" * 40),
        lambda tmp: _write(tmp / "empty.sqlite", b""),  # a database file without audit tables
    ],
    ids=["directory", "not-a-database", "no-audit-tables"],
)
def test_a_bad_store_is_one_clear_line(tmp_path, make_target):
    target = make_target(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["audit", "verify", "--store", target])
    message = str(exit_info.value)
    assert message.startswith("tracerag: cannot open the audit store") and "\n" not in message
    assert "Traceback" not in message


def test_an_unreachable_postgresql_is_one_clear_line():
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["audit", "verify", "--store", "postgresql://nobody:secret@127.0.0.1:1/audit"])
    message = str(exit_info.value)
    assert message.startswith("tracerag: cannot open the audit store") and "\n" not in message
    assert "secret" not in message


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_verify_with_an_expected_head_catches_a_truncated_tail(store_path, capsys):
    store = SQLiteAuditStore(store_path)
    head = store.head()
    store.close()
    anchor = f"{head['seq']}:{head['hash']}"
    assert cli.main(["audit", "verify", "--store", store_path, "--expect-head", anchor]) == 0
    backend = SQLiteBackend(store_path)
    backend.execute("DELETE FROM audit_entries WHERE request_id = 'req-0002'")
    backend.execute("DELETE FROM requests WHERE request_id = 'req-0002'")
    (last,) = backend.execute("SELECT seq, hash FROM audit_entries ORDER BY seq DESC LIMIT 1")
    backend.execute("UPDATE chain_head SET last_seq = ?, last_hash = ?", (last[0], last[1]))
    assert cli.main(["audit", "verify", "--store", store_path]) == 3  # no anchor: not "intact"
    capsys.readouterr()
    assert cli.main(["audit", "verify", "--store", store_path, "--expect-head", anchor]) == 1
    out = capsys.readouterr().out
    assert "BROKEN" in out and "entries were removed" in out


def test_verify_uses_the_head_the_writer_exported(tmp_path, capsys):
    from tracerag.store import AuditWriter, open_store

    path = str(tmp_path / "audit.sqlite")
    writer = AuditWriter(
        lambda create=True: open_store(path, create=create),
        journal=path + ".journal",
        head_export_interval=0.0,
    )
    for i in range(3):
        assert writer.submit_durable(make_record(f"w{i}", decision="pass"))
    assert writer.close()
    for suffix in ("", "-wal", "-shm"):  # the store is deleted and recreated, empty
        Path(path + suffix).unlink(missing_ok=True)
    SQLiteAuditStore(path).close()
    assert cli.main(["audit", "verify", "--store", path]) == 1
    out = capsys.readouterr().out
    assert "anchored to head" in out and "not the anchored store" in out
