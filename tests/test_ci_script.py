"""`.ci/test.sh` runs the tests that need the Go-built Jaeger and Collector after the builds, and
every other test before: every test using those binaries must be in its list."""

from __future__ import annotations

import re

from pipeline_fixtures import REPO

SCRIPT = (REPO / ".ci" / "test.sh").read_text("utf-8")
USES_GO_BINARIES = re.compile(r"jaeger_backend|TRACERAG_JAEGER_|TRACERAG_OTELCOL_BIN")


def listed() -> set[str]:
    block = re.search(r"^GO_BACKEND_TESTS=\((.*?)^\)", SCRIPT, re.S | re.M)
    assert block, "GO_BACKEND_TESTS=( ... ) not found in .ci/test.sh"
    return set(block.group(1).split())


def test_every_test_of_the_go_built_backends_runs_after_the_builds():
    using = {
        str(path.relative_to(REPO))
        for path in (REPO / "tests").rglob("test_*.py")
        if path.name != "test_ci_script.py"
        if USES_GO_BINARIES.search(path.read_text("utf-8"))
    }
    assert using  # the Jaeger and Collector tests exist
    assert using == listed()
    for path in listed():
        assert (REPO / path).is_file(), path
