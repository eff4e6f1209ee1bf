"""Fixtures for the adversarial self-test: the demo answers and their lexical report, built once
per session (every demo and probe question through a real pipeline) and shared by the tests of
the self-test and of the default backend's acceptance bar."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def adversarial_demo() -> list[Any]:
    """Real answers: every demo and probe question through RAGPipeline at seeds 1, 2, 3."""
    from tracerag.tools.adversarial import demo_cases

    return demo_cases()


@pytest.fixture(scope="session")
def lexical_report(adversarial_demo: list[Any]) -> Any:
    """The adversarial report of the default (lexical) backend on the demo answers."""
    from tracerag.tools.adversarial import run_adversarial

    return run_adversarial(adversarial_demo, backend="lexical")
