"""The ``tracerag`` command answers ``--help``, ``--version`` and nothing at once: it imports no
command module (and so no LangChain) until a command is chosen, and then only that command's."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from tracerag import __version__, cli


@pytest.fixture
def imported(monkeypatch):
    """The command modules main() imports, in order."""
    names: list[str] = []
    real = cli.import_module

    def record(name):
        names.append(name)
        return real(name)

    monkeypatch.setattr(cli, "import_module", record)
    monkeypatch.setattr(cli, "_built", None)
    return names


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--version"], ["-v", "--help"]])
def test_help_and_version_import_no_command_module(argv, imported, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    assert imported == []
    out = capsys.readouterr().out
    if "--version" in argv:
        assert out.strip() == f"tracerag {__version__}"
    else:
        for command, (help_text, _modules) in cli.COMMAND_TABLE.items():
            assert command in out and help_text[:30] in out


def test_bare_tracerag_prints_the_commands_and_imports_none(imported, capsys):
    assert cli.main([]) == 2
    assert imported == []
    assert "demo" in capsys.readouterr().out


def test_a_chosen_command_imports_its_own_module_only(imported, capsys):
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert imported == ["tracerag.demo._run"]
    assert "--seed" in capsys.readouterr().out
    imported.clear()
    with pytest.raises(SystemExit):
        cli.main(["audit", "verify", "--help"])
    assert imported == ["tracerag.tools._audit"]
    assert "--expect-head" in capsys.readouterr().out


def test_an_unknown_command_is_a_usage_error(imported, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["dmeo"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'dmeo'" in capsys.readouterr().err
    assert imported == []


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {choice.dest: choice.help for choice in action._choices_actions}


def test_the_command_table_says_what_the_modules_register():
    parser = cli.build_parser()
    registered = _subcommands(parser)
    assert registered == {name: help for name, (help, _m) in cli.COMMAND_TABLE.items()}
    for name, (_help, modules) in cli.COMMAND_TABLE.items():
        alone = cli._build([m for m in cli.COMMANDS if m in modules])
        sub = next(a for a in alone._actions if isinstance(a, argparse._SubParsersAction))
        assert sub.choices[name].add_help, f"{name} is not registered by {modules}"
    from tracerag.tools._audit import audit_group

    assert set(audit_group().choices) == set(cli.AUDIT_TABLE)


@pytest.mark.integration
@pytest.mark.parametrize("argv", [["--help"], ["--version"], [], ["demo", "--help"]])
def test_the_installed_command_imports_no_langchain(argv):
    """In a fresh interpreter, as a user runs it: no LangChain, pydantic or numpy import."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tracerag.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 2), done.stderr[-2000:]
    assert done.stdout.strip()
    imported = {
        line.split("|")[-1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "tracerag" in imported
    assert not imported & {"langchain_core", "langchain", "langgraph", "pydantic", "numpy"}
