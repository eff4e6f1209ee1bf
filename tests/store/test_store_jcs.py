"""RFC 8785 text of audit payloads: the fast way (Python's JSON with its numbers rewritten) writes
exactly what the ``rfc8785`` package writes, including for text that looks like numbers."""

from __future__ import annotations

import json

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from tracerag.store._chain import canonical_json, jcs_json, jcs_parsed

# floats of every kind JCS writes differently from Python: integral, tiny, with exponents
# (integral floats beyond 2^53 have no exact JCS text: version 1 text, as for integers)
FLOATS = st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda f: not (f.is_integer() and abs(f) > 2**53)
) | st.sampled_from([0.0, -0.0, 1.0, 2.0**53, 1e-5, 3.2e-07, 5e-324, 123456.0, 0.1, 2.5e-05])
# text that a careless rewrite of number tokens would change
TRICKY_TEXT = st.sampled_from(
    ["1.0", ":1.0,", "[2.5e-05]", "a,1e+16}", ",1.0]", '"x":3.0,', "\\", '\\"', "1234567890123456"]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | FLOATS
    | st.text(max_size=8)
    | TRICKY_TEXT
    | st.builds(lambda a, b: a + b, TRICKY_TEXT, TRICKY_TEXT)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=6) | TRICKY_TEXT, inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=examples(400), deadline=None)
@given(VALUES)
def test_jcs_text_is_what_rfc8785_writes(value) -> None:
    text, parsed = jcs_parsed(value)
    assert text == rfc8785.dumps(value).decode("utf-8")
    assert parsed == json.loads(text) == json.loads(json.dumps(value))


def test_number_like_text_inside_strings_is_kept() -> None:
    value = {"a": ":1.0,", "b": [1.0, "[2.0]", 1e-05], "c": ",3.0}"}
    text = jcs_json(value)
    assert text == '{"a":":1.0,","b":[1,"[2.0]",0.00001],"c":",3.0}"}'
    assert json.loads(text)["a"] == ":1.0,"


def test_integers_beyond_2_53_fall_back_to_version_1_text() -> None:
    value = {"big": 2**60, "f": 1.0}
    assert jcs_json(value) == canonical_json(value)
    assert jcs_json({"n": 2**53 - 1, "f": 2.5}) == '{"f":2.5,"n":9007199254740991}'
