"""tracerag: traced, verified retrieval-augmented generation for LangChain.

Give a ``create_agent`` app ``TraceragMiddleware``, wrap any other chain (``wrap``) or build one
(``RAGPipeline``); every request runs six traced stages and returns a ``Response`` with a
confidence, a decision (pass / review / escalate) and evidence.
Public names load on first use, so ``import tracerag`` stays cheap.
"""

from __future__ import annotations

import sys
from importlib import import_module
from typing import TYPE_CHECKING, Any

from tracerag._version import __version__

_EXPORTS = {
    "RAGPipeline": "tracerag._pipeline",
    "PipelineOptions": "tracerag._pipeline",
    "RAGPipelineOptions": "tracerag._pipeline",
    "wrap": "tracerag.wrapping",
    "TraceragMiddleware": "tracerag.middleware",
    "Response": "tracerag.contract",
    "Evidence": "tracerag.contract",
    "response_schema": "tracerag.contract",
    "validate_response": "tracerag.contract",
    "support": "tracerag.signals._support",
    "Support": "tracerag.signals._support",
    "JudgeSupport": "tracerag.signals._judge",
    "AnswerRelevance": "tracerag.signals._relevance",
    "CheckerSupport": "tracerag.signals._checker",
    "RuleResult": "tracerag.signals._rules",
    "rule": "tracerag.signals._rules",
    "Thresholds": "tracerag._routing",
    "Ticket": "tracerag._routing",
    "EscalationHandler": "tracerag._routing",
    "InMemoryEscalationHandler": "tracerag._routing",
    "RetryPolicy": "tracerag._settings",
    "TraceragError": "tracerag.errors",
    "InputError": "tracerag.errors",
    "MissingVersionError": "tracerag.errors",
    "PlanError": "tracerag.errors",
    "ConfigurationError": "tracerag.errors",
    "ContractError": "tracerag.errors",
    "CallError": "tracerag.errors",
    "CallTimeoutError": "tracerag.errors",
    "ModelTimeoutError": "tracerag.errors",
    "RetrieverTimeoutError": "tracerag.errors",
    "OutputTooLongError": "tracerag.errors",
    "UnreadableOutputError": "tracerag.errors",
    "InputTypeError": "tracerag.errors",
    "UnknownOptionError": "tracerag.errors",
    "UnknownPromptError": "tracerag.errors",
    "MissingDependencyError": "tracerag.errors",
    "AuthenticationError": "tracerag.errors",
    "Combiner": "tracerag.signals._confidence",
    "HeuristicCombiner": "tracerag.signals._confidence",
    "Signals": "tracerag.signals._confidence",
    "CalibratedCombiner": "tracerag.signals.calibrated",
    "SupportBackend": "tracerag.signals._support",
    "register_backend": "tracerag.signals._support",
    "Rule": "tracerag.signals._rules",
    "Equivalence": "tracerag.signals._consistency",
    "WrappedChain": "tracerag.wrapping",
    "StageEvent": "tracerag.events",
    "Stage": "tracerag._choices",
    "Tier": "tracerag._choices",
    "PlanMode": "tracerag._choices",
    "Route": "tracerag._choices",
    "configure": "tracerag.tracing",
    "configure_metrics": "tracerag.metrics",
    "trace_link": "tracerag.tracing",
}

__all__ = [
    "AnswerRelevance",
    "AuthenticationError",
    "CalibratedCombiner",
    "CallError",
    "CallTimeoutError",
    "CheckerSupport",
    "Combiner",
    "ConfigurationError",
    "ContractError",
    "Equivalence",
    "EscalationHandler",
    "Evidence",
    "HeuristicCombiner",
    "InMemoryEscalationHandler",
    "InputError",
    "InputTypeError",
    "JudgeSupport",
    "MissingDependencyError",
    "MissingVersionError",
    "ModelTimeoutError",
    "OutputTooLongError",
    "PipelineOptions",
    "PlanError",
    "PlanMode",
    "RAGPipeline",
    "RAGPipelineOptions",
    "Response",
    "RetrieverTimeoutError",
    "RetryPolicy",
    "Route",
    "Rule",
    "RuleResult",
    "Signals",
    "Stage",
    "StageEvent",
    "Support",
    "SupportBackend",
    "Thresholds",
    "Ticket",
    "Tier",
    "TraceragError",
    "TraceragMiddleware",
    "UnknownOptionError",
    "UnknownPromptError",
    "UnreadableOutputError",
    "WrappedChain",
    "__version__",
    "configure",
    "configure_metrics",
    "register_backend",
    "response_schema",
    "rule",
    "support",
    "trace_link",
    "validate_response",
    "wrap",
]


#: The audit store's names, exported here before the library and the application were told
#: apart: where they are imported from now.
_MOVED = {
    name: "tracerag.store"
    for name in ("AuditRecord", "AuditStore", "AuditWriter", "StoreError", "open_store")
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        if name in _MOVED:
            raise AttributeError(
                f"tracerag.{name} is the audit store's: import it from {_MOVED[name]} "
                f"(from {_MOVED[name]} import {name})",
                name=name,
                obj=sys.modules[__name__],
            )
        raise AttributeError(f"module 'tracerag' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from tracerag._choices import PlanMode, Route, Stage, Tier
    from tracerag._pipeline import PipelineOptions, RAGPipeline, RAGPipelineOptions
    from tracerag._routing import EscalationHandler, InMemoryEscalationHandler, Thresholds, Ticket
    from tracerag._settings import RetryPolicy
    from tracerag.contract import Evidence, Response, response_schema, validate_response
    from tracerag.errors import (
        AuthenticationError,
        CallError,
        CallTimeoutError,
        ConfigurationError,
        ContractError,
        InputError,
        InputTypeError,
        MissingDependencyError,
        MissingVersionError,
        ModelTimeoutError,
        OutputTooLongError,
        PlanError,
        RetrieverTimeoutError,
        TraceragError,
        UnknownOptionError,
        UnknownPromptError,
        UnreadableOutputError,
    )
    from tracerag.events import StageEvent
    from tracerag.metrics import configure_metrics
    from tracerag.middleware import TraceragMiddleware
    from tracerag.signals._checker import CheckerSupport
    from tracerag.signals._confidence import Combiner, HeuristicCombiner, Signals
    from tracerag.signals._consistency import Equivalence
    from tracerag.signals._judge import JudgeSupport
    from tracerag.signals._relevance import AnswerRelevance
    from tracerag.signals._rules import Rule, RuleResult, rule
    from tracerag.signals._support import Support, SupportBackend, register_backend, support
    from tracerag.signals.calibrated import CalibratedCombiner
    from tracerag.tracing import configure, trace_link
    from tracerag.wrapping import WrappedChain, wrap
