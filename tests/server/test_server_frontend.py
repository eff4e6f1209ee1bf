"""A frontend on another origin, typed from the served OpenAPI document.

The app runs under uvicorn with a CORS allow-list naming a second 127.0.0.1 port; types are
generated from its own ``/v1/openapi.json`` with openapi-typescript, a small client is compiled
with ``tsc`` and run by node against the server, and a page served from the second port calls
the API and its stream in Chromium. Needs ``bash .ci/frontend.sh`` and ``bash .ci/browser.sh``;
without them these tests are skipped locally and fail under CI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
import httpx
from server_fixtures import (
    CHROMIUM,
    CHROMIUM_ARGS,
    FRONTEND,
    GOOD_ANSWER,
    GOOD_QUESTION,
    browser_missing,
    frontend_missing,
    make_app,
    make_pipeline,
    make_store,
    running,
    skip_or_fail,
    static_site,
)

pytestmark = pytest.mark.integration

STAGES = ["register", "retrieve", "plan", "sample", "verify", "assemble"]


def tool(name: str) -> str:
    return os.path.join(FRONTEND, "node_modules", ".bin", name)


def run(*args: str) -> str:
    done = subprocess.run(
        list(args), cwd=FRONTEND, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{args[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def toolchain() -> None:
    problem = frontend_missing()
    if problem:
        skip_or_fail(problem)
    if shutil.which("node") is None:
        skip_or_fail("node is not installed (bash .ci/frontend.sh)")


@pytest.fixture
def site() -> Iterator[str]:
    with static_site(FRONTEND) as url:
        yield url


@pytest.fixture
def served(tmp_path, site, toolchain) -> Iterator[tuple[str, Any]]:
    store = make_store(tmp_path)
    pipeline = make_pipeline([GOOD_ANSWER])
    try:
        with running(make_app(store, pipeline, cors_origins=[site])) as base:
            yield base, store
    finally:
        store.close()


def build_client(base: str) -> None:
    """Types from the served OpenAPI document, then the client compiled with strict tsc."""
    generated = os.path.join(FRONTEND, "generated")
    os.makedirs(generated, exist_ok=True)
    doc = httpx.get(f"{base}/v1/openapi.json", timeout=10).json()
    with open(os.path.join(generated, "openapi.json"), "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    run(
        tool("openapi-typescript"),
        "generated/openapi.json",
        "--default-non-nullable=false",  # a field with a default may be left out of a request
        "-o",
        "generated/api.d.ts",
    )
    run(tool("tsc"), "-p", "tsconfig.json")


def test_the_generated_client_sends_a_question_from_node(served):
    base, store = served
    build_client(base)
    out = json.loads(run("node", "build/check.js", base, GOOD_QUESTION))
    assert out["decision"] == "pass" and "30 days" in out["answer"]
    assert out["stages"] == STAGES and out["streamed_decision"] == "pass"
    assert out["state"] == "answered"
    assert store.get(out["request_id"]).record["channel"] == "node-check"


def test_generated_types_fail_compilation_on_a_wrong_field(served):
    base, _ = served
    build_client(base)
    wrong = os.path.join(FRONTEND, "generated", "wrong.ts")
    with open(wrong, "w", encoding="utf-8") as fh:
        fh.write(
            'import type { AnswerRequest } from "../client.js";\n'
            'export const body: AnswerRequest = { question: "q", questoin: "typo" };\n'
        )
    done = subprocess.run(
        [
            tool("tsc"),
            "--noEmit",
            "--strict",
            "--module",
            "ES2022",
            "--moduleResolution",
            "bundler",
            "--target",
            "ES2022",
            "--lib",
            "ES2022,DOM",
            wrong,
        ],
        cwd=FRONTEND,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0 and "questoin" in done.stdout


def compile_alone(*paths: str) -> subprocess.CompletedProcess[str]:
    """``tsc --strict`` on files that import the client."""
    return subprocess.run(
        [
            tool("tsc"),
            "--noEmit",
            "--strict",
            "--module",
            "ES2022",
            "--moduleResolution",
            "bundler",
            "--target",
            "ES2022",
            "--lib",
            "ES2022,DOM",
            *paths,
        ],
        cwd=FRONTEND,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_stream_events_are_a_union_the_compiler_narrows(served):
    """Each event's data has its own type: a stage's fields on a response do not compile,
    every error code is known, and a switch over the events is exhaustive."""
    base, _ = served
    build_client(base)
    good = os.path.join(FRONTEND, "generated", "union_ok.ts")
    with open(good, "w", encoding="utf-8") as fh:
        fh.write(
            'import type { ErrorCode, StreamEvent } from "../client.js";\n'
            "export function label(e: StreamEvent): string {\n"
            "  switch (e.event) {\n"
            '    case "stage": return e.data.stage;\n'
            '    case "response": return e.data.answer ?? e.data.status;\n'
            '    case "error": return e.data.error;\n'
            '    case "decision": return e.data.state;\n'
            "  }\n"
            "}\n"
            'export const codes: ErrorCode[] = ["duplicate", "idempotency_key_reused"];\n'
        )
    wrong = os.path.join(FRONTEND, "generated", "union_wrong.ts")
    with open(wrong, "w", encoding="utf-8") as fh:
        fh.write(
            'import type { ErrorCode, StreamEvent } from "../client.js";\n'
            "export function f(e: StreamEvent): string {\n"
            '  if (e.event === "response") return e.data.stage;\n'
            '  return "";\n'
            "}\n"
            'export const code: ErrorCode = "duplicated";\n'
        )
    done = compile_alone(good, wrong)
    assert done.returncode != 0
    assert "union_ok.ts" not in done.stdout, done.stdout  # the right use compiles
    assert "Property 'stage' does not exist" in done.stdout, done.stdout
    assert '"duplicated"' in done.stdout, done.stdout


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    problem = browser_missing()
    if problem:
        skip_or_fail(problem)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def open_page(browser, site: str, base: str, question: str) -> tuple[dict, list[str]]:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        query = httpx.QueryParams({"api": base, "q": question})
        page.goto(f"{site}/index.html?{query}")
        page.wait_for_selector("body[data-done='1']", timeout=30_000)
        return json.loads(page.inner_text("#out")), errors
    finally:
        context.close()


def test_a_page_on_another_origin_calls_the_api_and_its_stream(served, site, browser):
    base, store = served
    build_client(base)
    assert site != base  # two origins: another port on 127.0.0.1
    result, errors = open_page(browser, site, base, GOOD_QUESTION)
    assert "failure" not in result, result
    assert result["answer"]["decision"] == "pass" and "30 days" in result["answer"]["answer"]
    assert result["stages"] == STAGES
    assert result["streamed"]["decision"] == "pass"
    assert result["polled"]["state"] == "answered"
    assert result["refused"] == "422 invalid_input"
    assert not [e for e in errors if "CORS" in e or "Access-Control" in e], errors
    assert len(store.list_requests()) == 2


def test_a_page_on_an_origin_not_listed_is_blocked_by_the_browser(tmp_path, browser, toolchain):
    store = make_store(tmp_path)
    try:
        with (
            static_site(FRONTEND) as site,
            running(make_app(store, make_pipeline([GOOD_ANSWER]))) as base,
        ):
            build_client(base)
            result, errors = open_page(browser, site, base, GOOD_QUESTION)
        assert "failure" in result and "Failed to fetch" in result["failure"]
        assert any("CORS" in e for e in errors)
        assert store.list_requests() == []  # the preflight failed: nothing ran
    finally:
        store.close()


def test_a_foreign_page_cannot_run_the_pipeline_without_preflight(tmp_path, browser, site):
    """A no-cors fetch and a plain form post need no preflight: both must be refused (415)."""
    store = make_store(tmp_path)
    try:
        with running(make_app(store, make_pipeline([GOOD_ANSWER]))) as base:
            context = browser.new_context()
            page = context.new_page()
            try:
                page.goto(f"{site}/index.html")
                statuses = []
                page.on(
                    "response",
                    lambda r: statuses.append(r.status) if r.url == f"{base}/v1/answer" else None,
                )
                page.evaluate(
                    """async (url) => {
                        await fetch(url, {method: "POST", mode: "no-cors",
                                          body: JSON.stringify({question: "q?"})});
                        const form = document.createElement("form");
                        form.method = "POST"; form.action = url; form.enctype = "text/plain";
                        const field = document.createElement("input");
                        field.name = '{"question": "q?", "x": "'; field.value = '"}';
                        form.appendChild(field); document.body.appendChild(form);
                        form.submit();
                    }""",
                    f"{base}/v1/answer",
                )
                page.wait_for_url(f"{base}/v1/answer")
                assert "unsupported_media_type" in page.content()
            finally:
                context.close()
        assert statuses == [415, 415]
        assert store.list_requests() == []
    finally:
        store.close()
