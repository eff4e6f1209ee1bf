"""Every span name, attribute key, event name and metric name tracerag emits.

Stages and signals import names from here; no attribute string is written anywhere else.
Three vocabularies live side by side: ``tracerag.*`` (ours), OpenInference (read by Phoenix and
other OpenInference tools) and the OpenTelemetry GenAI semantic conventions (``gen_ai.*``).
"""

from __future__ import annotations

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
CHANNEL = "tracerag.channel"
N_SAMPLES = "tracerag.n_samples"
TEMPERATURE = "tracerag.temperature"
PLAN_MODE = "tracerag.plan.mode"
STARTED_AT = "tracerag.started_at"

RETRIEVAL_COUNT = "tracerag.retrieval.count"
RETRIEVAL_SCORED = "tracerag.retrieval.scored"
RETRIEVAL_TOP_SCORE = "tracerag.retrieval.top_score"
RETRIEVAL_SCORE_MARGIN = "tracerag.retrieval.score_margin"
RETRIEVAL_MATERIAL_IDS = "tracerag.retrieval.material_ids"
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
TEMPERATURE_ZERO = "tracerag.sample.temperature_zero"

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

CONFIDENCE = "tracerag.confidence"
DECISION = "tracerag.decision"
STATUS = "tracerag.status"
TICKET_ID = "tracerag.ticket_id"
CALIBRATION = "tracerag.calibration"
CONFIDENCE_CAP = "tracerag.confidence.cap"
CHOSEN_SAMPLE = "tracerag.answer.sample_index"
AUDIT_PERSISTED = "tracerag.audit.persisted"
ERROR_COUNT = "tracerag.error.count"

EVENT_RETRY = "tracerag.retry"
EVENT_ESCALATED = "tracerag.escalated"
EVENT_WARNING = "tracerag.warning"
RETRY_ATTEMPT = "tracerag.retry.attempt"
RETRY_ERROR = "tracerag.retry.error"
WARNING_MESSAGE = "tracerag.warning.message"

# ---------------------------------------------------------------------------------------------
# OpenInference semantic conventions
OI_SPAN_KIND = "openinference.span.kind"
OI_KIND_CHAIN = "CHAIN"
OI_KIND_RETRIEVER = "RETRIEVER"
OI_KIND_LLM = "LLM"
OI_KIND_EVALUATOR = "EVALUATOR"
OI_INPUT_VALUE = "input.value"
OI_INPUT_MIME = "input.mime_type"
OI_OUTPUT_VALUE = "output.value"
OI_OUTPUT_MIME = "output.mime_type"
OI_SESSION_ID = "session.id"
OI_USER_ID = "user.id"
OI_METADATA = "metadata"
OI_LLM_MODEL_NAME = "llm.model_name"
OI_LLM_INVOCATION_PARAMETERS = "llm.invocation_parameters"
OI_LLM_TOKEN_PROMPT = "llm.token_count.prompt"
OI_LLM_TOKEN_COMPLETION = "llm.token_count.completion"
OI_LLM_TOKEN_TOTAL = "llm.token_count.total"


def oi_document(i: int, field: str) -> str:
    """``retrieval.documents.{i}.document.{field}`` (field: id, content, score, metadata)."""
    return f"retrieval.documents.{i}.document.{field}"


def oi_input_message(i: int, field: str) -> str:
    """``llm.input_messages.{i}.message.{field}`` (field: role, content)."""
    return f"llm.input_messages.{i}.message.{field}"


def oi_output_message(i: int, field: str) -> str:
    """``llm.output_messages.{i}.message.{field}`` (field: role, content)."""
    return f"llm.output_messages.{i}.message.{field}"


# ---------------------------------------------------------------------------------------------
# OpenTelemetry GenAI semantic conventions
GENAI_OPERATION_NAME = "gen_ai.operation.name"
GENAI_PROVIDER_NAME = "gen_ai.provider.name"
GENAI_REQUEST_MODEL = "gen_ai.request.model"
GENAI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GENAI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GENAI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GENAI_EVALUATION_EVENT = "gen_ai.evaluation.result"
GENAI_EVALUATION_NAME = "gen_ai.evaluation.name"
GENAI_EVALUATION_SCORE_VALUE = "gen_ai.evaluation.score.value"
GENAI_EVALUATION_SCORE_LABEL = "gen_ai.evaluation.score.label"
GENAI_EVALUATION_EXPLANATION = "gen_ai.evaluation.explanation"
GENAI_OPERATION_CHAT = "chat"

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
METRIC_SPANS_DROPPED = "tracerag.spans.dropped"

# Metric attribute keys (short, so Prometheus labels read well: decision, tier, stage, ...)
METRIC_ATTR_DECISION = "decision"
METRIC_ATTR_TIER = "tier"
METRIC_ATTR_STAGE = "stage"
METRIC_ATTR_ERROR_TYPE = "error_type"
METRIC_ATTR_REASON = "reason"

# OpenInference prompt template and tags (set through tracerag.tracing helpers)
OI_PROMPT_TEMPLATE = "llm.prompt_template.template"
OI_PROMPT_TEMPLATE_VERSION = "llm.prompt_template.version"
OI_PROMPT_TEMPLATE_VARIABLES = "llm.prompt_template.variables"
OI_TAGS = "tag.tags"
