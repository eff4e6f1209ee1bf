"""A refused request is still one traceable request: its root span carries its request_id."""

from __future__ import annotations

import pytest
from pipeline_fixtures import GOOD, QUESTION

from tracerag import MissingVersionError
from tracerag import _semconv as sc
from tracerag.testing import ScriptedChatModel


def test_pipeline_refusal_root_has_the_request_id(make_pipeline, spans):
    llm = ScriptedChatModel(responses=[GOOD])
    for kwargs in ({"model_version": None}, {"prompt_version": None}):
        with pytest.raises(MissingVersionError):
            make_pipeline(llm, **kwargs).invoke(QUESTION)
    assert llm.call_count == 0
    register = spans.named(sc.SPAN_REGISTER)
    roots = spans.named(sc.SPAN_REQUEST)
    assert len(roots) == len(register) == 2
    assert [r.attributes[sc.REQUEST_ID] for r in roots] == [
        s.attributes[sc.REQUEST_ID] for s in register
    ]
