"""The Response a caller receives, and the JSON Schema frontends code against.

``RESPONSE_SCHEMA`` (draft 2020-12) is shipped as ``tracerag/schemas/response.schema.json``;
every Response is validated against it before it is returned. ``SCHEMA_VERSION`` is the
schema's version, also its ``version`` annotation: 1.1 added the optional ``materials``
summary; 1.2 the optional ``interrupts`` (a pause the wrapped app itself raised) and
``structured`` (a structured answer, verified). A Response carrying a newer field is
rejected by an older validator (the Response admits no unknown property), so frontends that
validate must update their copy of the schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import cache, lru_cache
from importlib import resources
from typing import Any, Literal

import fastjsonschema
import jsonschema
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from tracerag.errors import ContractError, InputError

__all__ = ["AppInterrupt", "Evidence", "Response", "response_schema", "validate_response"]

Decision = Literal["pass", "review", "escalate"]
Status = Literal["answered", "flagged_for_review", "pending_human_review", "unverified"]
Verdict = Literal["supported", "unsupported", "fabricated_citation", "stale", "uncited"]
MaterialReason = Literal[
    "cited_supported",
    "cited_unsupported",
    "not_cited",
    "stale_or_superseded",
    "outside_validity_window",
    "below_relevance_floor",
]
MaterialRole = Literal["key", "supporting", "irrelevant"]

SCHEMA_VERSION = "1.2"


class Evidence(BaseModel):
    """A retrieved material and the exact sentence of it that supports the answer."""

    model_config = ConfigDict(extra="forbid")

    material_id: str
    title: str
    quote: str = Field(description="The sentence of the material, verbatim, that supports a claim.")
    score: float = Field(ge=0.0, le=1.0, description="Support score of the quote for its claim.")
    start: int | None = Field(default=None, description="Offset of the quote in the material text.")
    end: int | None = None
    source: str | None = None


class ClaimCheck(BaseModel):
    """One sentence of the answer, what it cites, and whether the cited material backs it."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="The sentence of the answer.")
    cited_ids: list[str]
    verdict: Verdict
    score: float = Field(ge=0.0, le=1.0)
    material_id: str | None = None
    quote: str | None = Field(
        default=None, description="The material's sentence the claim was checked against."
    )
    reason: str = Field(default="", description="Why the verdict.")


class MaterialUse(BaseModel):
    """One retrieved material: used or not and why, and its share of the answer (no text)."""

    model_config = ConfigDict(extra="forbid")

    material_id: str
    used: bool = Field(description="True when it supports at least one claim of the answer.")
    reason: MaterialReason = Field(description="Why it was used, or the first reason it was not.")
    detail: str = ""
    role: MaterialRole = Field(
        description="Its weight in this answer, compared within this request only."
    )
    share: float = Field(ge=0.0, le=1.0, description="Share of the claims it supports.")
    position: int | None = Field(default=None, description="1-based position in the prompt.")
    score: float | None = Field(default=None, description="The retriever's relevance score.")


class SignalDetail(BaseModel):
    """The signals behind the confidence. Null means the signal was not measured (e.g. tier).

    In the caller view of a withheld answer only the retrieval margin, the plan's outcome, the
    sample counts and the verdicts (citation_valid, answers_question, rule_check, the rules'
    names and outcomes, the confidence caps) are kept; the rest is at its "not measured"
    default.
    """

    model_config = ConfigDict(extra="allow")

    self_consistency: float | None = Field(default=None, ge=0.0, le=1.0)
    consistency_informative: bool | None = None
    consistency_groups: int | None = None
    semantic_entropy: float | None = None
    citation_valid: bool | None = None
    citation_score: float | None = Field(default=None, ge=0.0, le=1.0)
    citation_coverage: float | None = Field(default=None, ge=0.0, le=1.0)
    citation_accuracy: float | None = Field(default=None, ge=0.0, le=1.0)
    fabricated_citations: list[str] = Field(default_factory=list)
    stale_citations: list[str] = Field(default_factory=list)
    rule_check: bool | None = None
    rules: list[dict[str, Any]] = Field(default_factory=list)
    plan_ok: bool | None = None
    retrieval_margin: float | None = None
    samples_ok: int = 0
    samples_failed: int = 0
    confidence_caps: list[str] = Field(default_factory=list)
    answers_question: bool | None = Field(
        default=None,
        description="False: the answer does not address the question (it cannot pass; "
        "relevance.reason says why). Null: not judged.",
    )
    relevance: dict[str, Any] = Field(
        default_factory=dict,
        description="How answers_question was judged: method, the question's words and those "
        "the answer names, the kind of value asked and whether it is stated, the similarity "
        "(embeddings), and the reason.",
    )


class Versions(BaseModel):
    """Which prompt, model and tracerag produced the answer."""

    model_config = ConfigDict(extra="forbid")

    prompt: str
    model: str
    tracerag: str


class AppInterrupt(BaseModel):
    """A pause the wrapped app raised itself (a LangGraph ``interrupt()``, such as
    ``HumanInTheLoopMiddleware``'s): the turn waits on its thread for
    ``invoke(Command(resume=...), config)``."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, description="The interrupt's id (LangGraph's).")
    value: JsonValue = Field(description="The interrupt's payload, as the app raised it.")


class Response(BaseModel):
    """What tracerag returns for one question: the answer (or why it is withheld) and its proof."""

    model_config = ConfigDict(extra="forbid")

    request_id: str
    trace_id: str | None = Field(description="W3C trace id (32 hex) of the request's trace.")
    answer: str | None = Field(description="Null when the answer is withheld for a human.")
    confidence: float | None = Field(
        ge=0.0, le=1.0, description="Null only for tier 'low', which does not verify."
    )
    decision: Decision
    status: Status
    tier: Literal["high", "medium", "low"] = "high"
    signal_detail: SignalDetail
    evidence: list[Evidence] = Field(
        description="Empty in the caller view of a withheld answer (as claims and materials)."
    )
    claims: list[ClaimCheck] = Field(
        default_factory=list,
        description="Each sentence of the answer and its check. Empty in the caller view of a "
        "withheld answer: their number, ids and verdicts were computed from its text.",
    )
    materials: list[MaterialUse] = Field(
        default_factory=list,
        description="Every retrieved material, used or not, with its reason (schema 1.1). Empty "
        "in the caller view of a withheld answer.",
    )
    versions: Versions
    ticket_id: str | None = None
    calibration: str | None = None
    audit_persisted: bool | None = Field(
        default=None, description="False when the audit record could not yet be written."
    )
    warnings: list[str] = Field(default_factory=list)
    interrupts: list[AppInterrupt] = Field(
        default_factory=list,
        description="The app paused this turn for a person (schema 1.2): nothing was answered "
        "or verified yet; resume the thread with Command(resume=...).",
    )
    structured: dict[str, JsonValue] | None = Field(
        default=None,
        description="The app's structured answer (response_format), verified as the answer "
        "is; null when the app gives none or the answer is withheld (schema 1.2).",
    )


def withheld(response: Response | Mapping[str, Any]) -> bool:
    """True when the answer is held back for a person (an escalated request)."""
    if isinstance(response, Response):
        return response.answer is None and response.decision == "escalate"
    return response.get("answer") is None and response.get("decision") == "escalate"


#: What ``signal_detail`` keeps in the caller view of a withheld answer: none of these is
#: computed from the answer's text (the retrieval, the plan, how many samples the model gave).
WITHHELD_SIGNALS = frozenset({"retrieval_margin", "plan_ok", "samples_ok", "samples_failed"})
#: ... and the verdict on the answer, as the decision is: whether its citations hold, whether it
#: answers the question, whether the rules (named by the application) passed, and which caps
#: forced the confidence down. Yes or no, and names the application chose: no word, count,
#: length, id or score of the answer's text.
WITHHELD_VERDICT = frozenset(
    {"citation_valid", "answers_question", "rule_check", "confidence_caps"}
)
RULE_VERDICT = ("name", "passed", "required")


def caller_view(response: Response | Mapping[str, Any]) -> dict[str, Any]:
    """The Response as JSON for the person who asked: a withheld answer appears nowhere.

    For an escalated request the caller is told the verdict and nothing else computed from the
    withheld answer: ``decision``, ``status``, ``confidence``, and in ``signal_detail`` the
    yes-or-no verdicts (``citation_valid``, ``answers_question``, ``rule_check``, each rule's
    name and outcome) and the names of the caps that forced the confidence down stay, with what
    the answer did not make (the ids, the versions, the ticket, the retrieval margin, the
    plan's outcome and how many samples the model gave). Everything measured on the answer's
    text goes: the claims (their number, text, cited ids, per-claim verdicts, scores and
    reasons), the evidence, the materials' use of it, and every other signal — the citation and
    consistency scores, the cited ids found fabricated or stale, the rules' details, and the
    relevance judgement (which of the question's words the answer names, the similarity, the
    reason). Each signal is reset to its "not measured" default, so the view still matches the
    schema. It is an allow-list: a signal added later stays out of the caller view until it is
    named here. A Response that ``invoke()`` returned is already this view; the full candidate
    stays with the operator (the ticket, the audit record, the review desk). The stream's
    verify event of a withheld answer keeps its verdicts only (``caller_stage``).
    """
    data = (
        response.model_dump(mode="json")
        if isinstance(response, Response)
        else json.loads(json.dumps(dict(response)))
    )
    if not withheld(data):
        return data
    data["claims"] = []
    data["evidence"] = []
    data["materials"] = []
    if data.get("structured") is not None:  # a structured answer is the answer's text too
        data["structured"] = None
    given = data.get("signal_detail")
    detail = given if isinstance(given, Mapping) else {}
    kept = {k: detail[k] for k in WITHHELD_SIGNALS | WITHHELD_VERDICT if k in detail}
    rules = detail.get("rules")
    if isinstance(rules, list):  # each rule's name and outcome; its detail is of the answer
        kept["rules"] = [
            {**{k: rule[k] for k in RULE_VERDICT if k in rule}, "detail": ""}
            for rule in rules
            if isinstance(rule, Mapping)
        ]
    data["signal_detail"] = SignalDetail.model_validate(kept).model_dump(mode="json")
    return data


def caller_stage(event: Mapping[str, Any]) -> dict[str, Any]:
    """A stage event of a withheld answer as the caller may see it (``caller_view``'s rule).

    The verify stage's signals are measured on the answer: of them only the verdicts
    (``citation_valid``, ``answers_question``) stay. The other stages' signals are of the
    request, the retrieval, the plan and the sampling, not of the answer's text: unchanged.
    """
    data: dict[str, Any] = json.loads(json.dumps(dict(event)))
    if data.get("stage") == "verify" and isinstance(data.get("signals"), dict):
        data["signals"] = {k: v for k, v in data["signals"].items() if k in WITHHELD_VERDICT}
    return data


def caller_response(response: Response) -> Response:
    """The Response the person who asked may see (``caller_view`` as a ``Response``).

    A Response whose answer was not withheld is returned as it is.
    """
    if not withheld(response):
        return response
    return Response.model_validate(caller_view(response))


def build_schema() -> dict[str, Any]:
    """The Response JSON Schema (draft 2020-12) generated from the pydantic model."""
    schema = Response.model_json_schema(mode="serialization")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://tracerag.dev/schemas/response.schema.json",
        "version": SCHEMA_VERSION,
        **schema,
    }


@lru_cache(maxsize=1)
def _load_schema() -> dict[str, Any]:
    text = resources.files("tracerag").joinpath("schemas/response.schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def response_schema() -> dict[str, Any]:
    """The shipped Response JSON Schema as a dict (a copy, safe to modify)."""
    copy: dict[str, Any] = json.loads(json.dumps(_load_schema()))
    return copy


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with local ``#/$defs/…`` references replaced by their definitions.

    Validation gives the same verdicts, without a reference lookup per instance (the Response
    schema has no recursive definitions).
    """
    defs = schema.get("$defs", {})

    def resolve(node: Any, depth: int = 0) -> Any:
        if depth > 50:
            raise InputError("schema nesting too deep (recursive $ref?)")
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                target = resolve(defs[ref.split("/")[-1]], depth + 1)
                rest = {k: resolve(v, depth + 1) for k, v in node.items() if k != "$ref"}
                return {**target, **rest}
            return {k: resolve(v, depth + 1) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [resolve(v, depth + 1) for v in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


@cache
def _schemas(name: str) -> tuple[jsonschema.protocols.Validator, Callable[[Any], Any]]:
    text = resources.files("tracerag").joinpath(f"schemas/{name}").read_text("utf-8")
    schema = json.loads(text)
    reference = jsonschema.validators.validator_for(schema)
    reference.check_schema(schema)
    # The shipped schemas use only draft-07 keywords once their $defs are inlined, so the
    # compiled (fast) validator checks them under draft-07; the reference validator explains.
    flat = {**inline_refs(schema), "$schema": "http://json-schema.org/draft-07/schema#"}
    return reference(schema), fastjsonschema.compile(flat)


def validate_with(name: str, instance: Any) -> None:
    """Validate against a schema in ``tracerag/schemas``; raises ``ContractError``.

    The common (valid) case runs a compiled validator; a failure is explained by the reference
    ``jsonschema`` validator, so the error names the offending path.
    """
    reference, fast = _schemas(name)
    try:
        fast(instance)
    except fastjsonschema.JsonSchemaException:
        error = jsonschema.exceptions.best_match(reference.iter_errors(instance))
        if error is None:  # the two validators disagree: trust the reference one
            return
        path = "".join(f"/{part}" for part in error.absolute_path)
        raise ContractError(error.message, path) from None


def validate_response(payload: dict[str, Any] | Response) -> None:
    """Raise ``ContractError`` if the payload does not match the Response schema."""
    if isinstance(payload, Response):
        payload = payload.model_dump(mode="json")
    validate_with("response.schema.json", payload)


def __getattr__(name: str) -> Any:
    if name == "RESPONSE_SCHEMA":
        return response_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":  # regenerate the shipped schema: python -m tracerag.contract
    out = resources.files("tracerag").joinpath("schemas/response.schema.json")
    with open(str(out), "w", encoding="utf-8") as fh:
        json.dump(build_schema(), fh, indent=2, ensure_ascii=False)
        fh.write("\n")
