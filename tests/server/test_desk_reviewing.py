"""Working the desk: counts that agree with the rows, the confirmation and the next item, a
rubric per queue, several reviewers per item with agreement, comments, assignment, skipping,
and the decisions exported as a labelled dataset."""

from __future__ import annotations

import csv
import html
import io
import json
import re

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient
from server_fixtures import TOKEN, csrf_of, make_app, make_store, sign_in, signin_form
from store_fixtures import make_record

from tracerag.server._auth import hash_token

BEARER = {"Authorization": f"Bearer {TOKEN}"}
LI = "li-weis-personal-token-7x3q0"
BO = "bos-personal-token-8y4r1zz"
RUBRIC = {
    "queues": {
        "escalate": {
            "reviews": 2,
            "rubric": [
                {
                    "name": "grounded",
                    "label": "Every claim is backed by its source",
                    "scale": [1, 5],
                    "required": True,
                },
                {"name": "tone", "label": "Polite", "scale": [1, 3]},
            ],
        }
    }
}


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path)
    yield s
    s.close()


def fill(store, n: int = 3, decision: str = "escalate") -> list[str]:
    ids = [f"{decision[:3]}-{i}" for i in range(n)]
    store.append_records(
        [make_record(rid, decision=decision, confidence=0.3, question=f"问题 {rid}") for rid in ids]
    )
    return ids


def text(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def item_ids(html: str) -> list[str]:
    return re.findall(r'class="item-link" href="/review/items/([^"]+)"', html)


def judge(client, rid: str, action: str, follow: bool = True, **fields):
    page = client.get(f"/review/items/{rid}").text
    data = {"csrf": csrf_of(page), "action": action, **fields}
    return client.post(f"/review/items/{rid}/decision", data=data, follow_redirects=follow)


def test_the_claimed_count_filter_and_rows_agree(store) -> None:
    ids = fill(store, 3)
    app = make_app(store)
    with TestClient(app) as alice, TestClient(app) as bob:
        sign_in(alice, "alice")
        sign_in(bob, "bob")
        alice.get(f"/review/items/{ids[1]}")  # opening claims it
        queue = bob.get("/review").text
        assert text(re.search(r'id="counts".*?</p>', queue, re.S).group(0)).endswith(
            "2 pending · 1 claimed · 0 decided"
        )
        claimed = bob.get("/review?status=claimed").text
        assert item_ids(claimed) == [ids[1]] and "claimed by" in text(claimed)
        assert "alice" in text(claimed)
        assert "1 item matches" in text(claimed)
        pending = bob.get("/review?status=pending").text
        assert item_ids(pending) == [ids[0], ids[2]]
        # the store's own queue claims count the same way
        store.claim_next("carol")  # takes ids[0], the oldest pending
        queue = text(bob.get("/review").text)
        assert "1 pending · 2 claimed · 0 decided" in queue
        assert item_ids(bob.get("/review?status=claimed").text) == [ids[0], ids[1]]


def test_a_decision_confirms_at_the_top_and_offers_the_next_item(store) -> None:
    ids = fill(store, 2)
    with TestClient(make_app(store)) as client:
        sign_in(client, "alice")
        reply = judge(client, ids[0], "reject", follow=False, reason="cites a retired policy")
        assert reply.headers["location"] == f"/review/items/{ids[0]}?done=1"
        page = client.get(reply.headers["location"]).text
        banner = re.search(r'id="confirmation".*?</div>', page, re.S).group(0)
        assert "Saved: You rejected this answer" in text(banner)
        assert "stays withheld" in text(banner)
        assert page.index('id="confirmation"') < page.index("<h1>")  # at the very top
        nxt = client.get(f"/review/next?after={ids[0]}", follow_redirects=False)
        assert nxt.headers["location"] == f"/review/items/{ids[1]}"
        # the banner reports what the store holds: nothing is claimed for an undecided item
        assert 'id="confirmation"' not in client.get(f"/review/items/{ids[1]}?done=1").text


def test_the_decision_form_and_its_errors_come_first(store) -> None:
    (rid,) = fill(store, 1)
    with TestClient(make_app(store)) as client:
        sign_in(client, "alice")
        reply = judge(client, rid, "edit", final_answer="新的回答 [M01]", reason="")
        assert reply.status_code == 422
        page = reply.text
        error = page.index('id="decision-error"')
        assert error < page.index('id="decide"') + 200  # the error opens the form
        for later in ('id="why"', "<h2>Candidate answer</h2>", "<h2>Claims and their sources"):
            assert page.index('id="decide"') < page.index(later)


def test_a_required_rubric_score_is_asked_for_and_stored(store) -> None:
    ids = fill(store, 1) + fill(store, 1, "review")
    with TestClient(make_app(store, desk_config=RUBRIC)) as client:
        sign_in(client, "alice")
        form = client.get(f"/review/items/{ids[0]}").text
        assert "Every claim is backed by its source" in form and 'name="score.tone"' in form
        missing = judge(client, ids[0], "approve")
        assert missing.status_code == 422
        assert "Give: score “Every claim is backed by its source” (1–5)" in missing.text
        assert 'aria-invalid="true"' in missing.text
        bad = judge(client, ids[0], "approve", **{"score.grounded": "9"})
        assert bad.status_code == 422 and "is scored 1–5" in bad.text
        ok = judge(client, ids[0], "approve", **{"score.grounded": "4", "score.tone": "3"})
        assert ok.status_code == 200 and "1 of 2" in ok.text
        # the review queue keeps the default rubric (optional scores) and one reviewer
        done = judge(client, ids[1], "approve", **{"score.grounded": "5"})
        assert "Saved: You approved" in done.text
    vote = store.get(ids[0]).of_kind("review_vote")[0]
    assert vote.payload["scores"] == {"grounded": 4, "tone": 3}
    assert store.get(ids[1]).review_decision.payload["scores"] == {"grounded": 5}


def test_two_reviewers_judge_blind_then_a_dispute_is_settled(store) -> None:
    rid, other = fill(store, 2)
    app = make_app(store, desk_config=RUBRIC)
    with TestClient(app) as alice, TestClient(app) as bob, TestClient(app) as carol:
        for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol")):
            sign_in(client, name)
        first = judge(alice, rid, "approve", **{"score.grounded": "5"})
        assert "Your review is recorded (1 of 2)" in text(first.text)
        assert 'id="decide"' not in first.text  # alice has judged: no second form for her
        # alice's next item is the other one: she cannot judge this one twice
        assert alice.get("/review/next", follow_redirects=False).headers["location"].endswith(other)
        page = bob.get(f"/review/items/{rid}").text
        assert "1 of 2 reviews in" in text(page)
        assert "alice" not in text(page.split('id="decision"')[1].split("</aside>")[0])  # blind
        assert "1 of 2 reviews" in text(bob.get("/review").text)
        second = judge(
            bob, rid, "reject", reason="M99 was never retrieved", **{"score.grounded": "1"}
        )
        assert "disagree" in text(second.text)
        assert store.get_decision(rid) is None
        seen = text(carol.get(f"/review/items/{rid}").text)
        assert "they disagree" in seen and "alice" in seen and "bob" in seen
        assert "disputed" in text(carol.get("/review").text)
        settled = judge(carol, rid, "reject", reason="agree with bob", **{"score.grounded": "2"})
        assert "settled the reviewers' disagreement" in text(settled.text)
    decision = store.get(rid).review_decision
    assert decision.actor == "carol" and decision.payload["agreement"] == "adjudicated"
    assert store.verify_chain().ok


def test_comments_are_kept_in_the_trail(store) -> None:
    (rid,) = fill(store, 1)
    with TestClient(make_app(store)) as client:
        sign_in(client, "alice")
        page = client.get(f"/review/items/{rid}").text
        empty = client.post(
            f"/review/items/{rid}/comments", data={"csrf": csrf_of(page), "comment": "  "}
        )
        assert empty.status_code == 422 and 'id="comment-error"' in empty.text
        note = "M99 不存在 <script>alert(1)</script>"
        added = client.post(
            f"/review/items/{rid}/comments",
            data={"csrf": csrf_of(page), "comment": note},
            follow_redirects=False,
        )
        assert added.status_code == 303 and added.headers["location"].endswith("#comments")
        shown = client.get(f"/review/items/{rid}").text
        assert "M99 不存在 &lt;script&gt;" in shown and "Comments (1)" in shown
        forged = client.post(f"/review/items/{rid}/comments", data={"comment": "x"})
        assert forged.status_code == 403
        assert "1 comment" in text(client.get("/review").text)
    (entry,) = store.get(rid).of_kind("review_comment")
    assert entry.actor == "alice" and entry.payload["text"] == note


def test_assignment_filters_the_queue_and_orders_the_next_item(store) -> None:
    ids = fill(store, 3)
    app = make_app(
        store, reviewer_token="", reviewers={"李伟": hash_token(LI), "bo": hash_token(BO)}
    )
    with TestClient(app) as li, TestClient(app) as bo:
        li.post("/review/signin", data=signin_form(li, token=LI))
        bo.post("/review/signin", data=signin_form(bo, token=BO))
        page = bo.get(f"/review/items/{ids[2]}").text
        assert '<option value="李伟"' in page  # named reviewers to choose from
        unknown = bo.post(
            f"/review/items/{ids[2]}/assign", data={"csrf": csrf_of(page), "assignee": "mallory"}
        )
        assert unknown.status_code == 422 and 'id="assign-error"' in unknown.text
        bo.post(f"/review/items/{ids[2]}/assign", data={"csrf": csrf_of(page), "assignee": "李伟"})
        assert bo.app.state.services.claims.get(ids[2]) is None  # handed over
        mine = li.get("/review?assignee=me").text
        assert item_ids(mine) == [ids[2]] and "1 assigned to you" in text(mine)
        assert item_ids(bo.get("/review?assignee=none").text) == ids[:2]
        # 李伟's next item is the one assigned to them; bo's skips it
        assert li.get("/review/next", follow_redirects=False).headers["location"].endswith(ids[2])
        assert bo.get("/review/next", follow_redirects=False).headers["location"].endswith(ids[0])
        # opening an item assigned to someone else does not claim it
        bo.get(f"/review/items/{ids[2]}")
        assert bo.app.state.services.claims.get(ids[2]) is None
    (entry,) = store.get(ids[2]).of_kind("review_assigned")
    assert entry.actor == "bo" and entry.payload["assignee"] == "李伟"


def test_skip_moves_on_and_puts_the_item_last_for_that_reviewer(store) -> None:
    ids = fill(store, 2)
    app = make_app(store)
    with TestClient(app) as client:
        sign_in(client, "alice")
        page = client.get(f"/review/items/{ids[0]}").text
        skipped = client.post(
            f"/review/items/{ids[0]}/skip", data={"csrf": csrf_of(page)}, follow_redirects=False
        )
        assert skipped.headers["location"] == f"/review/next?after={ids[0]}"
        assert (
            client.get(skipped.headers["location"], follow_redirects=False)
            .headers["location"]
            .endswith(ids[1])
        )
        assert app.state.services.claims.get(ids[0]) is None  # others may take it now
        assert "you skipped it" in text(client.get("/review").text)
        # after the other one is decided, the skipped one is next again
        judge(client, ids[1], "reject", reason="no")
        assert (
            client.get("/review/next", follow_redirects=False).headers["location"].endswith(ids[0])
        )
        judge(client, ids[0], "reject", reason="no")
        empty = client.get("/review/next")
        assert empty.url.path == "/review" and "Nothing is left for you" in empty.text


def test_decisions_export_as_a_labelled_dataset(store) -> None:
    ids = fill(store, 3)
    store.append_record(
        make_record("formula", decision="escalate", question='=HYPERLINK("http://x")')
    )
    app = make_app(store, desk_config={"default": {"reviews": 2}})
    with TestClient(app) as alice, TestClient(app) as bob:
        sign_in(alice, "alice")
        sign_in(bob, "bob")
        for rid, (a, b) in zip(
            [*ids, "formula"],
            [("approve", "approve"), ("reject", "reject"), ("approve", "reject"), ("edit", "edit")],
            strict=True,
        ):
            fields = {"reason": "because", "final_answer": "改好的回答 [M01]"}
            judge(alice, rid, a, **fields, **{"score.grounded": "4"})
            judge(bob, rid, b, **fields, **{"score.grounded": "2"})
        lines = alice.get("/review/export.jsonl")
        assert lines.headers["content-type"].startswith("application/x-ndjson")
        rows = [json.loads(line) for line in lines.text.splitlines()]
        table = list(csv.reader(io.StringIO(alice.get("/review/export.csv").text)))
        summary = text(alice.get("/review/export").text)
        api = alice.get("/review/api/export?format=jsonl", headers=BEARER)
    assert {r["request_id"] for r in rows} == {ids[0], ids[1], "formula"}  # ids[2] disputed
    by_id = {r["request_id"]: r for r in rows}
    first = by_id[ids[0]]
    assert first["label"] == "correct" and by_id[ids[1]]["label"] == "incorrect"
    assert first["question"] == f"问题 {ids[0]}" and first["answer"]
    assert first["claims"][0]["evidence"].startswith("Items that arrive damaged")
    # the cited materials that were retrieved (M99 was cited but never retrieved)
    assert [e["id"] for e in first["evidence"]] == ["M01", "M03"]
    assert [(r["reviewer"], r["scores"]) for r in first["reviews"]] == [
        ("alice", {"grounded": 4}),
        ("bob", {"grounded": 2}),
    ]
    assert first["scores"] == {"grounded": 3.0} and first["agreement"]["unanimous"] is True
    assert first["decision"]["agreement"] == "unanimous"
    header = table[0]
    assert header[:4] == ["request_id", "queue", "question", "answer"]
    assert "score_grounded" in header and "score_complete" in header
    cells = {row[0]: dict(zip(header, row, strict=True)) for row in table[1:]}
    assert cells["formula"]["question"].startswith("'=")  # a spreadsheet will not run it
    assert cells[ids[0]]["label"] == "correct" and cells[ids[0]]["score_grounded"] == "3.0"
    assert "3 decided items: 1 approved (labelled correct), 2 edited or rejected" in summary
    assert "3 items judged by two or more reviewers: 100% unanimous" in summary
    assert api.status_code == 200 and len(api.text.splitlines()) == 3


def test_the_review_api_records_a_vote_with_202(store) -> None:
    (rid,) = fill(store, 1)
    with TestClient(make_app(store, desk_config=RUBRIC)) as client:
        missing = client.post(
            f"/review/api/items/{rid}/decision",
            json={"action": "approve", "reviewer": "王芳"},
            headers=BEARER,
        )
        assert missing.status_code == 422 and "grounded" in json.dumps(missing.json())
        vote = client.post(
            f"/review/api/items/{rid}/decision",
            json={"action": "approve", "reviewer": "王芳", "scores": {"grounded": 5}},
            headers=BEARER,
        )
        assert vote.status_code == 202
        assert vote.json() == {
            "request_id": rid,
            "reviewer": "王芳",
            "action": "approve",
            "reviews": 1,
            "required": 2,
            "disputed": False,
        }
        again = client.post(
            f"/review/api/items/{rid}/decision",
            json={"action": "approve", "reviewer": "王芳", "scores": {"grounded": 5}},
            headers=BEARER,
        )
        assert again.status_code == 409 and "already reviewed" in again.json()["detail"]
        settled = client.post(
            f"/review/api/items/{rid}/decision",
            json={"action": "approve", "reviewer": "李伟", "scores": {"grounded": 4}},
            headers=BEARER,
        )
        assert settled.status_code == 200 and settled.json()["reviewer"] == "李伟"
