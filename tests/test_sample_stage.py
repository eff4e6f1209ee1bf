"""The sample stage's model description: made once per model and temperature, per model object."""

from __future__ import annotations

import gc

from tracerag import _semconv as semconv
from tracerag.stages._sample import _DESCRIBED, llm_span_attributes, model_attributes_of
from tracerag.testing import ScriptedChatModel


def test_the_model_is_described_as_llm_span_attributes_says_and_each_caller_gets_its_own_copy():
    llm = ScriptedChatModel(responses=["x"], model_name="m-1")
    first = model_attributes_of(llm, llm, 0.7)
    assert first == llm_span_attributes(llm, 0.7)
    first[semconv.OI_PROMPT_TEMPLATE_VERSION] = "v1"  # a caller adds to its copy
    second = model_attributes_of(llm, llm, 0.7)
    assert semconv.OI_PROMPT_TEMPLATE_VERSION not in second
    assert second == llm_span_attributes(llm, 0.7)
    assert model_attributes_of(llm, llm, None) == llm_span_attributes(llm, None)
    assert model_attributes_of(llm, llm, None) != second  # another temperature, another entry


def test_a_description_goes_with_its_model():
    llm = ScriptedChatModel(responses=["x"], model_name="gone-soon")
    model_attributes_of(llm, llm, 0.3)
    key = (id(llm), 0.3)
    assert key in _DESCRIBED
    del llm
    gc.collect()
    assert key not in _DESCRIBED
