"""Every span name, attribute key, event name and metric name tracerag emits.

Stages and signals import names from here; no attribute string is written anywhere else.
Three vocabularies live side by side: ``tracerag.*`` (ours), OpenInference (read by Phoenix and
other OpenInference tools; names taken from ``openinference-semantic-conventions``) and the
OpenTelemetry GenAI semantic conventions (``gen_ai.*``; names taken from
``opentelemetry-semantic-conventions``).
"""

from __future__ import annotations

from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as _genai
from opentelemetry.semconv.attributes import error_attributes as _error

# ---------------------------------------------------------------------------------------------
# Span names: the root and its six stage children (plus one child span per sample).
SPAN_REQUEST = "tracerag.request"
SPAN_REGISTER = "tracerag.register"
SPAN_RETRIEVE = "tracerag.retrieve"
SPAN_PLAN = "tracerag.plan"
SPAN_SAMPLE = "tracerag.sample"
SPAN_SAMPLE_ONE = "tracerag.sample.generation"
SPAN_VERIFY = "tracerag.verify"
SPAN_ASSEMBLE = "tracerag.assemble"
# The spans the OpenTelemetry GenAI conventions name are named as they give it (the root, the
# retrieve stage, each sample's model call, the app's tool runs); every span also carries its
# tracerag name as ``tracerag.span`` (``SPAN_NAME``), so a query by tracerag's names still works.
SPAN_DELIVER = "tracerag.deliver"  # after the stages: the record, the ticket, the Response
SPAN_TOOL = "tracerag.tool"  # a tool the wrapped app ran inside a sample's run
STAGES = ("register", "retrieve", "plan", "sample", "verify", "assemble")
STAGE_SPANS = {
    "register": SPAN_REGISTER,
    "retrieve": SPAN_RETRIEVE,
    "plan": SPAN_PLAN,
    "sample": SPAN_SAMPLE,
    "verify": SPAN_VERIFY,
    "assemble": SPAN_ASSEMBLE,
}

# ---------------------------------------------------------------------------------------------
# tracerag.* attributes
REQUEST_ID = "tracerag.request_id"
#: the span's tracerag name (``tracerag.request``, ``tracerag.retrieve``, ...) whatever its name
SPAN_NAME = "tracerag.span"
STAGE = "tracerag.stage"
STAGE_SKIPPED = "tracerag.stage.skipped"
STAGE_SKIP_REASON = "tracerag.stage.skip_reason"
TIER = "tracerag.tier"
MODE = "tracerag.mode"  # "pipeline" | "wrap"
VERSION_PROMPT = "tracerag.version.prompt"
VERSION_MODEL = "tracerag.version.model"
VERSION_TRACERAG = "tracerag.version.tracerag"
# wrap(): the versions (["prompt", "model"]) neither given nor found in the app, learned from runs
VERSION_FROM_RUNS = "tracerag.version.from_runs"
# how each version was obtained: prompt "argument" | "template" | "run-template" | "model-input",
# model "argument" | "app" | "run" (tracerag.wrapping._versions)
VERSION_PROMPT_SOURCE = "tracerag.version.prompt_source"
VERSION_MODEL_SOURCE = "tracerag.version.model_source"
CHANNEL = "tracerag.channel"
N_SAMPLES = "tracerag.n_samples"
TEMPERATURE = "tracerag.temperature"
PLAN_MODE = "tracerag.plan.mode"
STARTED_AT = "tracerag.started_at"
# a conversation's turn: the standalone question verified and checked for relevance (the raw
# turn is input.value), how it was resolved and how many earlier user turns it was read with
QUESTION_STANDALONE = "tracerag.question.standalone"
QUESTION_RESOLUTION = "tracerag.question.resolution"
CONVERSATION_TURNS = "tracerag.conversation.earlier_turns"
CONVERSATION_SOURCE = "tracerag.conversation.source"

RETRIEVAL_COUNT = "tracerag.retrieval.count"
RETRIEVAL_SCORED = "tracerag.retrieval.scored"
RETRIEVAL_TOP_SCORE = "tracerag.retrieval.top_score"
RETRIEVAL_SCORE_MARGIN = "tracerag.retrieval.score_margin"
RETRIEVAL_MATERIAL_IDS = "tracerag.retrieval.material_ids"
# attribution (tracerag.signals.attribution): score shape on retrieve, roles on assemble
RETRIEVAL_SHAPE = "tracerag.retrieval.shape"
RETRIEVAL_RELATIVE_MARGIN = "tracerag.retrieval.relative_margin"
RETRIEVAL_NEAR_TOP = "tracerag.retrieval.near_top"
ATTRIBUTION_USED = "tracerag.attribution.used"
ATTRIBUTION_KEY = "tracerag.attribution.key"
ATTRIBUTION_UNATTRIBUTED = "tracerag.attribution.unattributed"
ROUTE_REASON = "tracerag.route.reason"
# tracerag explain: the offline attribution experiments, linked to the request's trace
SPAN_EXPLAIN = "tracerag.explain"
SPAN_EXPLAIN_EXPERIMENT = "tracerag.explain.experiment"
EXPLAIN_EXPERIMENT = "tracerag.explain.experiment.kind"
EXPLAIN_MATERIAL_ID = "tracerag.explain.material_id"
EXPLAIN_ANSWER_CHANGED = "tracerag.explain.answer_changed"
EXPLAIN_FLAGS = "tracerag.explain.flags"
EXPLAIN_MODEL_CALLS = "tracerag.explain.model_calls"
# wrap(): where materials came from: "retriever", "runs" (retrieved inside the app's runs only)
# or "retriever+runs" (runs retrieved documents the retriever did not)
RETRIEVAL_SOURCE = "tracerag.retrieval.source"

PLAN_OK = "tracerag.plan.ok"
PLAN_ERROR = "tracerag.plan.error"
PLAN_ATTEMPTS = "tracerag.plan.attempts"
PLAN_MATERIAL_IDS = "tracerag.plan.material_ids"
PLAN_KEY_FACTS = "tracerag.plan.key_facts"
PLAN_AGREEMENT = "tracerag.plan.agreement"
PLAN_SOURCE = "tracerag.plan.source"

SAMPLE_INDEX = "tracerag.sample.index"
SAMPLE_ATTEMPTS = "tracerag.sample.attempts"
SAMPLE_OK = "tracerag.sample.ok"
SAMPLE_ERROR = "tracerag.sample.error"
SAMPLE_RAW = "tracerag.sample.raw"
SAMPLES_OK = "tracerag.samples.ok"
SAMPLES_FAILED = "tracerag.samples.failed"
# adaptive sampling (tracerag._adaptive): samples drawn of the most allowed, in how many
# rounds, why sampling stopped (fixed | settled | exhausted) and the posterior probability that
# the samples not drawn would have changed the route
SAMPLES_DRAWN = "tracerag.samples.drawn"
SAMPLES_MAX = "tracerag.samples.max"
SAMPLES_ROUNDS = "tracerag.samples.rounds"
SAMPLES_STOP = "tracerag.samples.stop_reason"
SAMPLES_STOP_RISK = "tracerag.samples.stop_risk"
# samples answered by one call for several (OpenAI-compatible n): the calls made
SAMPLES_CALLS = "tracerag.samples.calls"
TEMPERATURE_ZERO = "tracerag.sample.temperature_zero"
# wrap(): how the samples were drawn ("answer" | "app"), and what each sample's run was: "app"
# (the app's own run), "fork" (its answering step again, from its checkpoint) or "private"
SAMPLING = "tracerag.sampling"
SAMPLE_RUN = "tracerag.sample.run"
# wrap(): the sample whose answer the app keeps (its own run's, in the caller's thread)
SAMPLE_KEPT = "tracerag.sample.kept"

SIGNAL_CITATION_VALID = "tracerag.signal.citation_valid"
SIGNAL_CITATION_SCORE = "tracerag.signal.citation_score"
SIGNAL_CITATION_COVERAGE = "tracerag.signal.citation_coverage"
SIGNAL_CITATION_ACCURACY = "tracerag.signal.citation_accuracy"
SIGNAL_FABRICATED = "tracerag.signal.fabricated_citations"
SIGNAL_STALE = "tracerag.signal.stale_citations"
SIGNAL_CONSISTENCY = "tracerag.signal.self_consistency"
SIGNAL_CONSISTENCY_GROUPS = "tracerag.signal.consistency_groups"
SIGNAL_SEMANTIC_ENTROPY = "tracerag.signal.semantic_entropy"
SIGNAL_CONSISTENCY_INFORMATIVE = "tracerag.signal.consistency_informative"
SIGNAL_RULE_CHECK = "tracerag.signal.rule_check"
SIGNAL_RULES_FAILED = "tracerag.signal.rules_failed"
SIGNAL_RETRIEVAL = "tracerag.signal.retrieval"
SIGNAL_PLAN = "tracerag.signal.plan"
SIGNAL_ANSWER_RELEVANT = "tracerag.signal.answer_relevant"

CONFIDENCE = "tracerag.confidence"
DECISION = "tracerag.decision"
STATUS = "tracerag.status"
TICKET_ID = "tracerag.ticket_id"
CALIBRATION = "tracerag.calibration"
CONFIDENCE_CAP = "tracerag.confidence.cap"
CHOSEN_SAMPLE = "tracerag.answer.sample_index"
AUDIT_PERSISTED = "tracerag.audit.persisted"
ERROR_COUNT = "tracerag.error.count"
# a turn paused for a person (an interrupt): not a route and not a failure. The root span's
# decision attribute and name say ``interrupted``; the interrupts' ids and payload types
INTERRUPTED = "interrupted"
INTERRUPT_KIND = "tracerag.interrupt.kind"
INTERRUPT_COUNT = "tracerag.interrupt.count"
INTERRUPT_IDS = "tracerag.interrupt.ids"
INTERRUPT_TYPES = "tracerag.interrupt.types"

EVENT_RETRY = "tracerag.retry"
EVENT_ESCALATED = "tracerag.escalated"
EVENT_WARNING = "tracerag.warning"
RETRY_ATTEMPT = "tracerag.retry.attempt"
RETRY_ERROR = "tracerag.retry.error"
WARNING_MESSAGE = "tracerag.warning.message"

# ---------------------------------------------------------------------------------------------
# OpenInference semantic conventions (names from openinference-semantic-conventions)
OI_SPAN_KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
OI_KIND_CHAIN = OpenInferenceSpanKindValues.CHAIN.value
OI_KIND_RETRIEVER = OpenInferenceSpanKindValues.RETRIEVER.value
OI_KIND_LLM = OpenInferenceSpanKindValues.LLM.value
OI_KIND_EVALUATOR = OpenInferenceSpanKindValues.EVALUATOR.value
OI_KIND_TOOL = OpenInferenceSpanKindValues.TOOL.value
OI_TOOL_NAME = SpanAttributes.TOOL_NAME
OI_INPUT_VALUE = SpanAttributes.INPUT_VALUE
OI_INPUT_MIME = SpanAttributes.INPUT_MIME_TYPE
OI_OUTPUT_VALUE = SpanAttributes.OUTPUT_VALUE
OI_OUTPUT_MIME = SpanAttributes.OUTPUT_MIME_TYPE
OI_SESSION_ID = SpanAttributes.SESSION_ID
OI_USER_ID = SpanAttributes.USER_ID
OI_METADATA = SpanAttributes.METADATA
OI_LLM_MODEL_NAME = SpanAttributes.LLM_MODEL_NAME
OI_LLM_INVOCATION_PARAMETERS = SpanAttributes.LLM_INVOCATION_PARAMETERS
OI_LLM_TOKEN_PROMPT = SpanAttributes.LLM_TOKEN_COUNT_PROMPT
OI_LLM_TOKEN_COMPLETION = SpanAttributes.LLM_TOKEN_COUNT_COMPLETION
OI_LLM_TOKEN_TOTAL = SpanAttributes.LLM_TOKEN_COUNT_TOTAL


def oi_document(i: int, field: str) -> str:
    """``retrieval.documents.{i}.document.{field}`` (field: id, content, score, metadata)."""
    return f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.{i}.document.{field}"


def oi_input_message(i: int, field: str) -> str:
    """``llm.input_messages.{i}.message.{field}`` (field: role, content)."""
    return f"{SpanAttributes.LLM_INPUT_MESSAGES}.{i}.message.{field}"


def oi_output_message(i: int, field: str) -> str:
    """``llm.output_messages.{i}.message.{field}`` (field: role, content)."""
    return f"{SpanAttributes.LLM_OUTPUT_MESSAGES}.{i}.message.{field}"


# ---------------------------------------------------------------------------------------------
# OpenTelemetry GenAI semantic conventions (names from opentelemetry-semantic-conventions)
GENAI_OPERATION_NAME = _genai.GEN_AI_OPERATION_NAME
GENAI_PROVIDER_NAME = _genai.GEN_AI_PROVIDER_NAME
GENAI_REQUEST_MODEL = _genai.GEN_AI_REQUEST_MODEL
GENAI_REQUEST_TEMPERATURE = _genai.GEN_AI_REQUEST_TEMPERATURE
GENAI_USAGE_INPUT_TOKENS = _genai.GEN_AI_USAGE_INPUT_TOKENS
GENAI_USAGE_OUTPUT_TOKENS = _genai.GEN_AI_USAGE_OUTPUT_TOKENS
GENAI_EVALUATION_EVENT = "gen_ai.evaluation.result"  # an event name: no constant ships for it
GENAI_EVALUATION_NAME = _genai.GEN_AI_EVALUATION_NAME
GENAI_EVALUATION_SCORE_VALUE = _genai.GEN_AI_EVALUATION_SCORE_VALUE
GENAI_EVALUATION_SCORE_LABEL = _genai.GEN_AI_EVALUATION_SCORE_LABEL
GENAI_EVALUATION_EXPLANATION = _genai.GEN_AI_EVALUATION_EXPLANATION
GENAI_OPERATION_CHAT = _genai.GenAiOperationNameValues.CHAT.value
GENAI_OPERATION_RETRIEVAL = _genai.GenAiOperationNameValues.RETRIEVAL.value
GENAI_OPERATION_INVOKE_WORKFLOW = _genai.GenAiOperationNameValues.INVOKE_WORKFLOW.value
GENAI_OPERATION_INVOKE_AGENT = _genai.GenAiOperationNameValues.INVOKE_AGENT.value
GENAI_OPERATION_EXECUTE_TOOL = _genai.GenAiOperationNameValues.EXECUTE_TOOL.value
GENAI_CONVERSATION_ID = _genai.GEN_AI_CONVERSATION_ID
GENAI_DATA_SOURCE_ID = _genai.GEN_AI_DATA_SOURCE_ID
# the number of documents asked of the retriever: the package ships no retrieval-specific name,
# the retrieval span takes the request's ``gen_ai.request.top_k``
GENAI_REQUEST_TOP_K = _genai.GEN_AI_REQUEST_TOP_K
GENAI_RETRIEVAL_DOCUMENTS = _genai.GEN_AI_RETRIEVAL_DOCUMENTS
GENAI_WORKFLOW_NAME = _genai.GEN_AI_WORKFLOW_NAME
GENAI_AGENT_NAME = _genai.GEN_AI_AGENT_NAME
GENAI_TOOL_NAME = _genai.GEN_AI_TOOL_NAME
GENAI_TOOL_CALL_ID = _genai.GEN_AI_TOOL_CALL_ID
GENAI_TOOL_TYPE = _genai.GEN_AI_TOOL_TYPE
ERROR_TYPE = _error.ERROR_TYPE
#: the instrumentation scope of tracerag's tracers, meters and loggers
INSTRUMENTATION_NAME = "tracerag"
#: the workflow name of a RAGPipeline request's root span (``invoke_workflow tracerag``)
WORKFLOW_NAME = "tracerag"
#: the evaluation name of the verdict (score: the confidence, label: the decision)
EVALUATION_VERDICT = "tracerag.verdict"
#: whether GenAI content (message and document text in ``gen_ai.*`` attributes and events) is
#: recorded: the OpenTelemetry GenAI instrumentations' switch, off unless set
GENAI_CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


def workflow_span_name(decision: str | None = None) -> str:
    """``invoke_workflow tracerag``, with ``[decision]`` once the request is routed."""
    base = f"{GENAI_OPERATION_INVOKE_WORKFLOW} {WORKFLOW_NAME}"
    return f"{base} [{decision}]" if decision else base


def agent_span_name(agent: str | None, decision: str | None = None) -> str:
    """``invoke_agent {agent}``, with ``[decision]`` once the request is routed."""
    base = f"{GENAI_OPERATION_INVOKE_AGENT} {agent}" if agent else GENAI_OPERATION_INVOKE_AGENT
    return f"{base} [{decision}]" if decision else base


def retrieval_span_name(data_source: str | None) -> str:
    """``retrieval {gen_ai.data_source.id}`` (``retrieval`` when the source has no id)."""
    return (
        f"{GENAI_OPERATION_RETRIEVAL} {data_source}" if data_source else GENAI_OPERATION_RETRIEVAL
    )


def chat_span_name(model: str | None) -> str:
    """``chat {gen_ai.request.model}`` (``chat`` when the model is not known)."""
    return f"{GENAI_OPERATION_CHAT} {model}" if model else GENAI_OPERATION_CHAT


def tool_span_name(tool: str | None) -> str:
    """``execute_tool {gen_ai.tool.name}``."""
    return f"{GENAI_OPERATION_EXECUTE_TOOL} {tool}" if tool else GENAI_OPERATION_EXECUTE_TOOL


# ---------------------------------------------------------------------------------------------
# Metric instrument names (OpenTelemetry names; Prometheus exposition adds unit/_total suffixes)
METRIC_REQUESTS = "tracerag.requests"
METRIC_CONFIDENCE = "tracerag.confidence"
METRIC_STAGE_DURATION = "tracerag.stage.duration"
METRIC_REQUEST_DURATION = "tracerag.request.duration"
METRIC_SAMPLES = "tracerag.samples"
METRIC_CITATION_COVERAGE = "tracerag.citation.coverage"
METRIC_CITATION_ACCURACY = "tracerag.citation.accuracy"
METRIC_FABRICATED = "tracerag.citations.fabricated"
METRIC_RETRIES = "tracerag.model.retries"
METRIC_MODEL_ERRORS = "tracerag.model.errors"
METRIC_AUDIT_FAILURES = "tracerag.audit.persist_failures"
METRIC_AUDIT_DROPPED = "tracerag.audit.dropped"
METRIC_AUDIT_BACKLOG = "tracerag.audit.backlog"
METRIC_SPANS_DROPPED = "tracerag.spans.dropped"
# the review desk's queue: how long a queued request waited for a reviewer's decision (recorded
# where the decision is made), and what waits now (gauges read from the queue's database)
METRIC_REVIEW_TIME_TO_DECISION = "tracerag.review.time_to_decision"
METRIC_REVIEW_BACKLOG = "tracerag.review.backlog"
METRIC_REVIEW_OLDEST = "tracerag.review.oldest_wait"
# turns paused for a person (an interrupt) and turns resumed from one, by kind (app: an interrupt
# a wrapped app raised; answer_review: TraceragMiddleware's review of a withheld answer) and,
# for resumes, the action taken (approve | edit | reject | respond | mixed | other)
METRIC_TURNS_INTERRUPTED = "tracerag.turns.interrupted"
METRIC_TURNS_RESUMED = "tracerag.turns.resumed"

# Metric attribute keys (short, so Prometheus labels read well: decision, tier, stage, ...)
METRIC_ATTR_DECISION = "decision"
METRIC_ATTR_TIER = "tier"
METRIC_ATTR_STAGE = "stage"
METRIC_ATTR_ERROR_TYPE = "error_type"
METRIC_ATTR_REASON = "reason"
METRIC_ATTR_STOP = "stop_reason"
METRIC_ATTR_ROUTE = "route"  # a queued request's route: review | escalate
METRIC_ATTR_ACTION = "action"  # a reviewer's action: approve | edit | reject
METRIC_ATTR_STATUS = "status"  # a queued request's status: pending | claimed
METRIC_ATTR_KIND = "kind"  # an interrupted turn's kind: app | answer_review

# OpenInference prompt template and tags (set through tracerag.tracing helpers)
OI_PROMPT_TEMPLATE = SpanAttributes.LLM_PROMPT_TEMPLATE
OI_PROMPT_TEMPLATE_VERSION = SpanAttributes.LLM_PROMPT_TEMPLATE_VERSION
OI_PROMPT_TEMPLATE_VARIABLES = SpanAttributes.LLM_PROMPT_TEMPLATE_VARIABLES
OI_TAGS = SpanAttributes.TAG_TAGS

# ---------------------------------------------------------------------------------------------
# Token usage and cost (see tracerag.usage)
USAGE_ESTIMATED = "tracerag.usage.estimated"
USAGE_CALLS = "tracerag.usage.calls"
USAGE_INPUT_TOKENS = "tracerag.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "tracerag.usage.output_tokens"
USAGE_COST = "tracerag.usage.cost"
METRIC_USAGE_TOKENS = "tracerag.usage.tokens"
METRIC_USAGE_CALLS = "tracerag.usage.calls"
METRIC_USAGE_COST = "tracerag.usage.cost"
METRIC_USAGE_REQUEST_TOKENS = "tracerag.usage.request.tokens"
METRIC_ATTR_PROMPT_VERSION = "prompt_version"
METRIC_ATTR_MODEL_VERSION = "model_version"
METRIC_ATTR_DIRECTION = "direction"


def usage_stage(stage: str, field: str) -> str:
    """``tracerag.usage.{stage}.{field}`` (field: input_tokens, output_tokens, calls)."""
    return f"tracerag.usage.{stage}.{field}"
