"""The commands' shared tail (``tracerag.tools._command``) and the numerals the self-test reads."""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
from store_fixtures import make_record

from tracerag.store._base import StoreError
from tracerag.store._sqlite import SQLiteAuditStore
from tracerag.text._quantities import extract_quantities, parse_chinese_number
from tracerag.tools._adversarial_quantities import _CN_NUMERALS, _CN_VALUES, quantity_mutations
from tracerag.tools._command import (
    add_command,
    add_json_argument,
    add_store_argument,
    cli_store,
    emit,
    print_json,
)


@dataclass(frozen=True)
class _Result:
    answer: str

    def to_dict(self) -> dict[str, str]:
        return {"answer": self.answer}

    def render(self) -> str:
        return f"answer: {self.answer}\n"


def _parser() -> tuple[argparse.ArgumentParser, list[argparse.Namespace]]:
    ran: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> int:
        ran.append(args)
        return 7

    top = argparse.ArgumentParser(prog="tracerag")
    sub = top.add_subparsers(dest="command")
    p = add_command(sub, "thing", run, help="do a thing", description="Does the thing.")
    p.add_argument("name")
    add_store_argument(p)
    add_json_argument(p, "print it as JSON")
    return top, ran


def test_add_command_registers_the_function_it_runs_and_the_shared_options():
    top, ran = _parser()
    args = top.parse_args(["thing", "x", "--store", "s.sqlite", "--json"])
    assert args.func(args) == 7 and ran == [args]
    assert (args.name, args.store, args.json) == ("x", "s.sqlite", True)
    plain = top.parse_args(["thing", "y"])
    assert (plain.store, plain.json) == (None, False)


def test_the_shared_options_read_in_the_help_as_the_commands_wrote_them(capsys):
    top, _ran = _parser()
    with pytest.raises(SystemExit):
        top.parse_args(["thing", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Does the thing." in text
    assert "--store URL audit store URL or path (default: $TRACERAG_STORE" in text
    assert "--json print it as JSON" in text


def test_an_unknown_option_of_a_command_is_refused(capsys):
    top, ran = _parser()
    with pytest.raises(SystemExit) as exc:
        top.parse_args(["thing", "x", "--jsn"])
    assert exc.value.code == 2 and not ran
    assert "unrecognized arguments: --jsn" in capsys.readouterr().err


def test_emit_prints_the_json_body_or_the_rendered_text(capsys):
    result = _Result("订单签收后90天内")
    assert emit(result, as_json=True) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == {"answer": "订单签收后90天内"}
    assert "订单" in out  # UTF-8 as is, not \u escapes
    assert emit(result, as_json=False) == 0
    assert capsys.readouterr().out == "answer: 订单签收后90天内\n"


def test_print_json_indents_and_keeps_chinese(capsys):
    print_json([{"路线": "review"}])
    assert capsys.readouterr().out == '[\n  {\n    "路线": "review"\n  }\n]\n'


def _store(tmp_path: Path) -> str:
    path = str(tmp_path / "audit.sqlite")
    store = SQLiteAuditStore(path)
    store.append_record(make_record("req-1"))
    store.close()
    return path


def test_cli_store_opens_the_named_store_for_the_block_and_closes_it(tmp_path):
    args = argparse.Namespace(store=_store(tmp_path))
    with cli_store(args) as store:
        assert store.get("req-1").request_id == "req-1"
    with pytest.raises(StoreError):  # closed: no more reads
        store.get("req-1")


def test_cli_store_closes_the_store_when_the_block_fails(tmp_path):
    args = argparse.Namespace(store=_store(tmp_path))
    with pytest.raises(RuntimeError, match="boom"), cli_store(args) as store:
        raise RuntimeError("boom")
    with pytest.raises(StoreError):
        store.get("req-1")


def test_cli_store_refuses_a_store_that_is_not_there_in_one_line(tmp_path):
    missing = tmp_path / "nowhere" / "audit.sqlite"
    args = argparse.Namespace(store=str(missing))
    with pytest.raises(SystemExit, match="cannot open the audit store"), cli_store(args):
        pytest.fail("the block must not run")
    assert not missing.exists()


def _numbers(text: str) -> list[float | str | None]:
    """The numbers a text states, as the verifier reads them (两年: 2, not 24 months)."""
    return [q.number if q.number is not None else q.value for q in extract_quantities(text)]


@pytest.mark.parametrize(
    ("claim", "stated"),
    [
        ("Refunds take five working days.", 5.0),
        ("Eleven stores offer it.", 11.0),
        ("退款需要三个工作日。", 3.0),
        ("保修期为两年。", 2.0),
    ],
)
def test_a_number_mutation_of_a_numeral_is_read_as_another_value(claim, stated):
    """The self-test rewrites EN/ZH numerals; the text module must read the new ones."""
    assert _numbers(claim)[:1] == [stated]
    mutated = quantity_mutations("number", claim, random.Random(0))
    assert mutated, claim
    for text, change in mutated:
        values = _numbers(text)
        assert values and values[0] != stated, (text, change)


def test_the_chinese_numerals_the_self_test_rewrites_have_the_text_modules_values():
    for char, value in _CN_VALUES.items():
        assert parse_chinese_number(char) == value
    assert _CN_NUMERALS[2] == "两" and set(_CN_NUMERALS) == set(range(1, 11))
