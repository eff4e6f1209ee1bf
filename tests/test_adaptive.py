"""Adaptive sampling: the stopping rule, and every front door drawing only what the route needs.

The rule (``tracerag._adaptive``) is pure: its bound is checked against a direct enumeration of
the beta-binomial and against the fitted prior on synthetic data. The pipeline and wrap() draw
``min_samples`` first and stop, or go on in rounds, as the rule says; spans, the record and the
metrics say how many were drawn and why sampling stopped; a model that answers a prompt n times
gets one call for a round; calls to a model beyond its ``max_concurrency`` queue.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading

import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from pipeline_fixtures import (
    FABRICATED,
    FAST_RETRY,
    GOOD,
    GOOD_ALT,
    OFF_TOPIC,
    PLAN,
    QUESTION,
    WRONG_NUMBER,
    scripted,
)
from pydantic import PrivateAttr

from tracerag import _semconv as semconv
from tracerag._adaptive import (
    StoppingRule,
    StopReason,
    Tally,
    change_risk,
    fit_agreement_prior,
    next_round,
    prior_for,
)
from tracerag._choices import Route
from tracerag._llm import ReplyChatModel
from tracerag._routing import Thresholds, decide
from tracerag._settings import Settings
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.errors import ConfigurationError
from tracerag.prompts import TASK_RE
from tracerag.testing import ScriptedChatModel

PRIOR = (0.9842, 0.1162)


def heuristic_route(citation: float):
    """The route the default combiner and thresholds give an answer at a share of agreement."""
    return lambda share: decide(math.sqrt(citation * share), Thresholds())


def enumerated_risk(tally: Tally, n: int, prior: tuple[float, float]) -> float:
    """The change risk by brute force: integrate P(X = x | p) over a fine grid of the posterior
    Beta density (independent of the closed form the module uses)."""
    k, a = tally.drawn, tally.agreeing
    m = n - k
    alpha, beta = prior[0] + a, prior[1] + k - a
    grid = 200_000
    weights, pmf = 0.0, [0.0] * (m + 1)
    for i in range(1, grid):
        p = i / grid
        w = p ** (alpha - 1) * (1 - p) ** (beta - 1)
        weights += w
        for x in range(m + 1):
            pmf[x] += w * math.comb(m, x) * p**x * (1 - p) ** (m - x)
    now = tally.route_at(a / k)
    risk = 0.0
    for x in range(m + 1):
        if tally.rival + m - x >= a + x or tally.route_at((a + x) / n) != now:
            risk += pmf[x] / weights
    return risk


# -- the rule ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("agreeing", "drawn"), [(2, 2), (3, 3), (1, 2), (2, 3), (3, 4)])
def test_the_risk_is_the_posterior_probability_that_the_rest_would_change_the_route(
    agreeing, drawn
):
    tally = Tally(drawn, agreeing, drawn - agreeing, heuristic_route(1.0))
    assert change_risk(tally, 5, (1.5, 0.5)) == pytest.approx(
        enumerated_risk(tally, 5, (1.5, 0.5)), abs=2e-3
    )


def test_more_agreeing_samples_never_raise_the_risk_and_a_full_draw_has_none():
    route = heuristic_route(1.0)
    risks = [change_risk(Tally(k, k, 0, route), 5, PRIOR) for k in range(1, 6)]
    assert risks == sorted(risks, reverse=True)
    assert risks[-1] == 0.0
    # after four of five agree, the last sample cannot carry the share below 0.8: no risk
    assert risks[3] == 0.0


def test_a_route_no_share_can_change_is_settled_unless_another_answer_could_lead():
    always = lambda share: Route.ESCALATE  # noqa: E731 (a stale citation: escalate whatever)
    # two agree, three to come: only all three joining one other answer could take the lead
    risk = change_risk(Tally(2, 2, 0, always), 5, PRIOR)
    alpha, beta = PRIOR[0] + 2, PRIOR[1]
    # P(X = 0) of the beta-binomial: B(alpha, beta + 3) / B(alpha, beta)
    lbeta = lambda a, b: math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)  # noqa: E731
    assert risk == pytest.approx(math.exp(lbeta(alpha, beta + 3) - lbeta(alpha, beta)))
    assert risk < 0.05


def test_next_round_stops_settles_or_asks_for_the_fewest_that_could_settle():
    rule = StoppingRule(5, 2, 0.05, PRIOR)
    route = heuristic_route(1.0)
    settled = next_round(Tally(2, 2, 0, route), rule)
    assert settled.more == 0 and settled.reason is StopReason.SETTLED
    assert settled.risk is not None and settled.risk <= 0.05
    # one of two agrees: only all three more agreeing could settle it
    split = next_round(Tally(2, 1, 1, route), rule)
    assert split.more == 3 and split.reason is None and split.risk > 0.05
    assert next_round(Tally(5, 3, 2, route), rule).reason is StopReason.EXHAUSTED
    fixed = StoppingRule(5, 5, 0.05, PRIOR)
    assert fixed.fixed and fixed.first == 5
    assert next_round(Tally(5, 3, 2, route), fixed).reason is StopReason.FIXED
    # no answer yet: every remaining sample, nothing to judge by
    assert next_round(Tally(2, 0, 0, route), rule).more == 3


def test_a_candidate_that_does_not_verify_draws_on_while_an_agreeing_sample_could():
    """Two agreeing samples citing a fabricated id: the route is escalate at any share, but a
    third agreeing sample that verifies would be chosen instead and pass."""
    escalate = lambda share: Route.ESCALATE  # noqa: E731
    passing = heuristic_route(1.0)
    blind = Tally(2, 2, 0, escalate)
    seeing = Tally(2, 2, 0, escalate, passing)
    rule = StoppingRule(5, 2, 0.05, PRIOR, (0.1218, 0.1104))
    assert next_round(blind, rule).reason is StopReason.SETTLED
    going = next_round(seeing, rule)
    assert going.more >= 1 and going.risk > 0.05
    assert change_risk(seeing, 5, PRIOR, (0.1218, 0.1104)) > change_risk(blind, 5, PRIOR)


def test_a_stricter_bound_draws_more():
    route = heuristic_route(1.0)
    loose = next_round(Tally(2, 2, 0, route), StoppingRule(5, 2, 0.05, PRIOR))
    strict = next_round(Tally(2, 2, 0, route), StoppingRule(5, 2, 0.001, PRIOR))
    assert loose.more == 0 and strict.more >= 1


def test_the_fitted_prior_recovers_the_beta_it_was_drawn_from():
    rng = random.Random(3)
    counts = []
    for _ in range(20_000):
        p = rng.betavariate(2.0, 0.5)
        counts.append((sum(rng.random() < p for _ in range(5)), 5))
    alpha, beta = fit_agreement_prior(counts)
    assert alpha == pytest.approx(2.0, rel=0.15) and beta == pytest.approx(0.5, rel=0.15)


def test_the_prior_cannot_be_fitted_from_nothing_or_from_mixed_draws():
    with pytest.raises(ConfigurationError):
        fit_agreement_prior([])
    with pytest.raises(ConfigurationError):
        fit_agreement_prior([(2, 2), (3, 5)])


def test_the_prior_is_chosen_by_retrieval_shape_with_a_default():
    priors = {"clustered": (1.5, 0.5), "*": (1.0, 0.1)}
    assert prior_for(priors, "clustered") == (1.5, 0.5)
    assert prior_for(priors, "clear") == prior_for(priors, None) == (1.0, 0.1)
    assert prior_for((2.0, 1.0), "clustered") == (2.0, 1.0)


@pytest.mark.parametrize(
    "bad",
    [
        {"min_samples": 0},
        {"min_samples": 1.5},
        {"stop_risk": 1.0},
        {"stop_risk": -0.1},
        {"agreement_prior": (0.0, 1.0)},
        {"agreement_prior": {"clustered": (1.0, 1.0)}},  # no "*"
        {"agreement_prior": (1.0,)},
        {"max_concurrency": 0},
        {"max_concurrency": 2.5},
    ],
)
def test_bad_adaptive_settings_are_refused(bad):
    with pytest.raises(ConfigurationError):
        Settings(retriever=None, llm=None, **bad)


# -- the pipeline ------------------------------------------------------------------------------


def sample_spans(spans, rid):
    stage = spans.named(semconv.SPAN_SAMPLE, rid)[0]
    return stage, spans.children(stage)


def test_agreeing_samples_stop_after_the_first_round(make_pipeline, spans):
    records: list[dict] = []
    llm = scripted([GOOD])
    pipeline = make_pipeline(llm, min_samples=2, audit=records.append)
    response = pipeline.invoke(QUESTION)
    assert response.decision == "pass"
    assert response.signal_detail.samples_ok == 2
    assert llm.call_count == 1 + 2  # the plan and two samples, the other three never asked
    stage, children = sample_spans(spans, response.request_id)
    assert len(children) == 2
    attrs = stage.attributes
    assert attrs[semconv.SAMPLES_DRAWN] == 2 and attrs[semconv.SAMPLES_MAX] == 5
    assert attrs[semconv.SAMPLES_STOP] == "settled" and attrs[semconv.SAMPLES_ROUNDS] == 1
    assert 0.0 <= attrs[semconv.SAMPLES_STOP_RISK] <= 0.05
    adaptive = records[0]["params"]["adaptive"]
    assert adaptive["drawn"] == 2 and adaptive["max"] == 5 and adaptive["min_samples"] == 2
    assert adaptive["stop_reason"] == "settled" and adaptive["risk_bound"] == 0.05
    assert records[0]["usage"]["by_stage"]["sample"]["calls"] == 2


def test_disagreeing_samples_draw_on_to_the_most_allowed(make_pipeline, spans):
    records: list[dict] = []
    llm = scripted([GOOD, WRONG_NUMBER, OFF_TOPIC, GOOD, WRONG_NUMBER])
    response = make_pipeline(llm, min_samples=2, audit=records.append).invoke(QUESTION)
    assert response.signal_detail.samples_ok == 5
    adaptive = records[0]["params"]["adaptive"]
    assert adaptive["stop_reason"] == "exhausted" and adaptive["rounds"] == 2
    # the route is the one every sample gives: 2 of 5 agree, sqrt(0.4) -> review
    assert response.decision == "review"
    assert response.signal_detail.self_consistency == pytest.approx(0.4)


def test_fabricated_first_samples_do_not_settle_what_later_ones_would_verify(make_pipeline):
    records: list[dict] = []
    llm = scripted([FABRICATED, FABRICATED, GOOD, GOOD, GOOD])
    fixed = make_pipeline(scripted([FABRICATED, FABRICATED, GOOD, GOOD, GOOD])).invoke(QUESTION)
    response = make_pipeline(llm, min_samples=2, audit=records.append).invoke(QUESTION)
    assert fixed.decision == "pass"
    assert response.decision == fixed.decision and response.answer == fixed.answer
    assert records[0]["params"]["adaptive"]["drawn"] >= 3


def test_min_samples_equal_to_n_is_the_fixed_mode(make_pipeline, spans):
    records: list[dict] = []
    llm = scripted([GOOD])
    response = make_pipeline(llm, min_samples=5, audit=records.append).invoke(QUESTION)
    assert response.signal_detail.samples_ok == 5 and llm.call_count == 6
    assert records[0]["params"]["adaptive"]["stop_reason"] == "fixed"
    assert records[0]["params"]["adaptive"]["rounds"] == 1


async def test_async_and_batch_requests_stop_alike(make_pipeline):
    records: list[dict] = []
    pipeline = make_pipeline(scripted([GOOD]), min_samples=2, audit=records.append)
    await pipeline.ainvoke(QUESTION)
    await pipeline.abatch([QUESTION, QUESTION])
    assert [r["params"]["adaptive"]["drawn"] for r in records] == [2, 2, 2]


def test_the_metrics_say_why_sampling_stopped(make_pipeline):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    make_pipeline(scripted([GOOD]), min_samples=2, meter_provider=provider).invoke(QUESTION)
    data = reader.get_metrics_data()
    points = [
        point
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == semconv.METRIC_SAMPLES
        for point in metric.data.data_points
    ]
    assert points and points[0].attributes[semconv.METRIC_ATTR_STOP] == "settled"
    assert points[0].sum == 2


def test_the_samples_the_rule_verified_are_not_verified_again(make_pipeline, monkeypatch):
    import tracerag.stages._stopping as stopping
    import tracerag.stages._verify as verify_stage

    checked: list[str] = []
    real = verify_stage._verified

    async def counting(question, materials, sample, *args):
        checked.append(sample.answer)
        return await real(question, materials, sample, *args)

    monkeypatch.setattr(verify_stage, "_verified", counting)
    monkeypatch.setattr(stopping, "_verified", counting)
    make_pipeline(scripted([GOOD, GOOD_ALT]), min_samples=2).invoke(QUESTION)
    assert sorted(checked) == sorted([GOOD, GOOD_ALT])  # each distinct answer once


# -- several answers to one call, one prompt for all -------------------------------------------


def test_a_model_that_answers_n_times_is_called_once_per_round(spans):
    from tracerag import RAGPipeline
    from tracerag.demo.kb import build_retriever

    records: list[dict] = []
    llm = ExtractiveChatModel(seed=1)
    pipeline = RAGPipeline(
        build_retriever(k=4),
        llm,
        prompt_version="p",
        model_version="m",
        min_samples=5,
        audit=records.append,
        tracer_provider=spans.provider,
    )
    pipeline.invoke("How long is the warranty on a laptop?")
    used = records[0]["usage"]
    sample_calls = [c for c in used["calls_detail"] if c["stage"] == "sample"]
    assert len(sample_calls) == 1 and sample_calls[0]["generations"] == 5
    assert len(records[0]["samples"]) == 5
    # the prompt billed once: what one bare call of it reads
    bare = llm.invoke(pipeline_prompt(records[0]))
    assert sample_calls[0]["input_tokens"] == bare.usage_metadata["input_tokens"]
    assert records[0]["params"]["adaptive"]["calls"] == 1


def pipeline_prompt(record: dict) -> list[BaseMessage]:
    """The sample prompt of a recorded pipeline request, as the sample stage built it."""
    from tracerag.prompts import TASK_ANSWER, prompt_messages
    from tracerag.signals._types import Material
    from tracerag.stages._plan import parse_plan

    materials = [
        Material(id=m["id"], text=m["text"], title=m["title"], metadata=m["metadata"])
        for m in record["materials"]
    ]
    plan = parse_plan(record["plan"]["raw"], [m.id for m in materials])
    return prompt_messages(TASK_ANSWER, record["question"], materials, plan)


def test_a_model_without_n_gets_the_identical_prompt_for_every_sample(make_pipeline):
    llm = scripted([GOOD, WRONG_NUMBER, OFF_TOPIC])
    make_pipeline(llm, min_samples=2).invoke(QUESTION)
    prompts = {c.prompt for c in llm.calls if c.task != "plan"}
    assert len([c for c in llm.calls if c.task != "plan"]) == 5 and len(prompts) == 1


# -- a per-model concurrency limit ------------------------------------------------------------


class InFlight:
    """Calls in flight at once, and the most seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0


class OneSlotModel(ReplyChatModel):
    """A model that counts the calls in flight at once (and answers after a pause)."""

    model_name: str = "one-slot-model"
    answer: str = GOOD
    latency: float = 0.02
    max_concurrency: int | None = None
    _seen: InFlight = PrivateAttr(default_factory=InFlight)

    @property
    def most(self) -> int:
        return self._seen.most

    @property
    def _llm_type(self) -> str:
        return "one-slot"

    def _reply(self, messages: list[BaseMessage], **kwargs: object) -> ChatResult:
        raise NotImplementedError("async only")

    async def _areply(self, messages: list[BaseMessage], **kwargs: object) -> ChatResult:
        seen = self._seen
        with seen.lock:
            seen.now += 1
            seen.most = max(seen.most, seen.now)
        try:
            await asyncio.sleep(self.latency)
            prompt = "\n".join(str(m.content) for m in messages)
            match = TASK_RE.search(prompt)
            text = PLAN if match and match.group("task") == "plan" else self.answer
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])
        finally:
            with seen.lock:
                seen.now -= 1


@pytest.mark.parametrize(("limit", "most"), [(None, 5), (1, 1), (2, 2)])
def test_calls_beyond_the_limit_queue(make_pipeline, limit, most):
    llm = OneSlotModel(max_concurrency=limit)
    response = make_pipeline(llm, min_samples=5).invoke(QUESTION)  # type: ignore[arg-type]
    assert response.signal_detail.samples_ok == 5
    assert llm.most == most


def test_the_settings_limit_overrides_the_models_own(make_pipeline):
    llm = OneSlotModel(max_concurrency=1)
    make_pipeline(llm, min_samples=5, max_concurrency=3).invoke(QUESTION)  # type: ignore[arg-type]
    assert llm.most == 3


def test_the_limit_holds_across_concurrent_requests(make_pipeline):
    llm = OneSlotModel(max_concurrency=1)
    pipeline = make_pipeline(llm, min_samples=5)  # type: ignore[arg-type]

    async def both():
        return await asyncio.gather(pipeline.ainvoke(QUESTION), pipeline.ainvoke(QUESTION))

    for response in asyncio.run(both()):
        assert response.signal_detail.samples_ok == 5
    assert llm.most == 1


def test_a_queued_call_does_not_time_out_while_it_waits(make_pipeline):
    from tracerag import RetryPolicy

    # each call takes 0.1 s and may take 0.3 s: five at once on one slot would wait 0.4 s
    llm = OneSlotModel(max_concurrency=1, latency=0.1)
    policy = RetryPolicy(attempts=1, model_timeout=0.3)
    response = make_pipeline(llm, min_samples=5, retry=policy).invoke(QUESTION)  # type: ignore[arg-type]
    assert response.signal_detail.samples_ok == 5 and response.signal_detail.samples_failed == 0


# -- wrap() ------------------------------------------------------------------------------------


def test_wrap_draws_in_rounds_too(spans, retriever):
    from pipeline_fixtures import standard_chain

    from tracerag import wrap

    records: list[dict] = []
    llm = ScriptedChatModel(responses=["Customers may return unused items within 30 days. [1]"])
    wrapped = wrap(
        standard_chain(retriever, llm),
        n_samples=5,
        retry=FAST_RETRY,
        audit=records.append,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke(QUESTION)
    adaptive = records[0]["params"]["adaptive"]
    assert adaptive["drawn"] == len(records[0]["samples"]) == len(records[0]["params"]["runs"])
    assert adaptive["drawn"] < 5 and adaptive["stop_reason"] == "settled"
    assert response.signal_detail.samples_ok == adaptive["drawn"]
    stage = spans.named(semconv.SPAN_SAMPLE, response.request_id)[0]
    assert stage.attributes[semconv.SAMPLES_STOP] == "settled"


def test_wrap_draws_on_while_the_runs_disagree(spans, retriever):
    from pipeline_fixtures import standard_chain

    from tracerag import wrap

    records: list[dict] = []
    answers = [
        "Customers may return unused items within 30 days. [1]",
        "Gold members receive a 5% discount on every order. [4]",
    ]
    llm = ScriptedChatModel(responses=answers)
    wrap(
        standard_chain(retriever, llm),
        n_samples=4,
        retry=FAST_RETRY,
        audit=records.append,
        tracer_provider=spans.provider,
    ).invoke(QUESTION)
    adaptive = records[0]["params"]["adaptive"]
    assert adaptive["drawn"] == 4 and adaptive["stop_reason"] == "exhausted"


# -- the same routes as fixed N on the demo's own questions -----------------------------------


def test_the_demo_questions_take_the_routes_of_fixed_n():
    """Each question answered by a fresh seeded model both ways, so the adaptive request's
    samples are the first of the fixed request's: the routes must agree."""
    from tracerag import RAGPipeline
    from tracerag.demo.kb import build_retriever
    from tracerag.tools.adversarial import demo_questions

    retriever = build_retriever(k=4)

    def route(question: str, seed: int, first: int) -> str:
        pipeline = RAGPipeline(
            retriever,
            ExtractiveChatModel(seed=seed),
            prompt_version="p",
            model_version="m",
            min_samples=first,
            audit=None,
        )
        return pipeline.invoke(question).decision

    questions = demo_questions()
    pairs = [(q, seed) for seed in (1, 2) for q in questions]
    differ = [(q, s) for q, s in pairs if route(q, s, 2) != route(q, s, 5)]
    assert differ == []


def test_the_enumeration_helper_agrees_with_a_hand_count():
    # the brute-force integrator itself: a uniform prior, one agreeing of one, one to come
    tally = Tally(1, 1, 0, lambda share: Route.PASS if share > 0.6 else Route.REVIEW)
    # P(next agrees) under Beta(2, 1) is 2/3; disagreeing makes it 1/2 -> review, or overtaken
    assert enumerated_risk(tally, 2, (1.0, 1.0)) == pytest.approx(1 / 3, abs=1e-3)
    assert change_risk(tally, 2, (1.0, 1.0)) == pytest.approx(1 / 3)


# -- the first round: no fewer than the best case needs to settle ---------------------------


def _rule_settings(**options: object) -> Settings:
    return Settings(retriever=None, llm=None, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", ["unscored", "clustered", "clear", None])
def test_the_first_round_is_the_fewest_a_unanimous_verified_answer_settles_on(shape):
    from tracerag.stages._stopping import FULLY_VERIFIED, first_round, route_at_for

    settings = _rule_settings()
    n = settings.n_samples
    first = first_round(settings, n, None, True, shape=shape)
    rule = settings.stopping_rule(n, shape)
    assert rule.first <= first <= n  # never fewer than min_samples, never more than n

    def settles(k: int) -> bool:
        best = route_at_for(settings, None, True, FULLY_VERIFIED, (), k)
        return next_round(Tally(k, k, 0, best), rule).more == 0

    if first < n:
        assert settles(first)
    # one fewer could not settle even the best case (or it is min_samples itself)
    assert first == rule.first or not settles(first - 1)


def test_the_cautious_prior_draws_three_at_once_and_the_scored_one_two():
    from tracerag.stages._stopping import first_round

    settings = _rule_settings()
    assert first_round(settings, 5, None, True, shape="unscored") == 3
    assert first_round(settings, 5, None, True, shape="clear") == 2
    # fixed mode draws every sample in the first round, whatever the prior
    fixed = _rule_settings(min_samples=5)
    assert first_round(fixed, 5, None, True, shape="unscored") == 5
