"""The events-URL tokens: itsdangerous signatures bound to one request, with a life."""

from __future__ import annotations

import time

import pytest

from tracerag.server._signed_urls import StreamTokens

KEY = "an-api-key-of-enough-characters-0123"


def test_a_token_opens_its_request_until_it_expires():
    tokens = StreamTokens(KEY, seconds=60)
    now = time.time()
    token, expires = tokens.make("req-1", now=now)
    assert expires == int(now) + 60
    assert "req-1" not in token and token.count(".") == 1
    assert tokens.check("req-1", token, now=now + 59)
    assert not tokens.check("req-1", token, now=now + 61)


def test_a_token_signed_by_a_replica_whose_clock_runs_ahead_is_taken():
    token, _ = StreamTokens(KEY, seconds=60).make("req-1", now=time.time() + 30)
    assert StreamTokens(KEY, seconds=60).check("req-1", token)


@pytest.mark.parametrize(
    "request_id, token_for",
    [
        ("req-2", "req-1"),  # another request's token
        ("req", "req.x"),  # a token of "req.x" spliced onto "req"
    ],
)
def test_a_token_opens_no_other_request(request_id, token_for):
    tokens = StreamTokens(KEY)
    token, _ = tokens.make(token_for)
    if "." in token_for:
        token = token_for.split(".", 1)[1] + "." + token
    assert not tokens.check(request_id, token)


@pytest.mark.parametrize(
    "token",
    ["", "1", "1.我", "a.b", "..", "x" * 500, "1796166390.deadbeef"],
)
def test_garbage_and_the_old_format_are_refused(token):
    assert not StreamTokens(KEY).check("req-1", token)


def test_another_key_and_a_changed_signature_are_refused():
    token, _ = StreamTokens(KEY).make("req-1")
    assert not StreamTokens(KEY + "-rotated").check("req-1", token)
    stamp, signature = token.split(".")
    flipped = ("A" if signature[0] != "A" else "B") + signature[1:]  # the first: all data bits
    assert not StreamTokens(KEY).check("req-1", f"{stamp}.{flipped}")
