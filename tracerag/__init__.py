"""tracerag: traced, verified retrieval-augmented generation for LangChain.

Wrap a chain (``wrap``) or build one (``RAGPipeline``); every request runs six traced stages and
returns a ``Response`` with a confidence, a decision (pass / review / escalate) and evidence.
Public names load on first use, so ``import tracerag`` stays cheap.
"""

from __future__ import annotations

import sys
import types
from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "RAGPipeline": "tracerag.pipeline",
    "PipelineOptions": "tracerag.pipeline",
    "RAGPipelineOptions": "tracerag.pipeline",
    "wrap": "tracerag.wrap",
    "Response": "tracerag.contract",
    "Evidence": "tracerag.contract",
    "response_schema": "tracerag.contract",
    "validate_response": "tracerag.contract",
    "ExtractiveChatModel": "tracerag.demo.models.extractive",
    "support": "tracerag.signals.support",
    "Support": "tracerag.signals.support",
    "JudgeSupport": "tracerag.signals.judge",
    "AnswerRelevance": "tracerag.signals.relevance",
    "CheckerSupport": "tracerag.signals.checker",
    "RuleResult": "tracerag.signals.rules",
    "rule": "tracerag.signals.rules",
    "Thresholds": "tracerag.routing",
    "Ticket": "tracerag.routing",
    "EscalationHandler": "tracerag.routing",
    "InMemoryEscalationHandler": "tracerag.routing",
    "RetryPolicy": "tracerag.settings",
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
    "StoreError": "tracerag.store",
    "Combiner": "tracerag.signals.confidence",
    "HeuristicCombiner": "tracerag.signals.confidence",
    "Signals": "tracerag.signals.confidence",
    "CalibratedCombiner": "tracerag.signals.calibrated",
    "SupportBackend": "tracerag.signals.support",
    "register_backend": "tracerag.signals.support",
    "Rule": "tracerag.signals.rules",
    "Equivalence": "tracerag.signals.consistency",
    "WrappedChain": "tracerag.wrap",
    "StageEvent": "tracerag.events",
    "Stage": "tracerag._choices",
    "Tier": "tracerag._choices",
    "PlanMode": "tracerag._choices",
    "Route": "tracerag._choices",
    "AuditRecord": "tracerag.record",
    "AuditStore": "tracerag.store",
    "AuditWriter": "tracerag.store",
    "open_store": "tracerag.store",
    "configure": "tracerag.tracing",
    "configure_metrics": "tracerag.metrics",
    "trace_link": "tracerag.tracing",
}

__all__ = [
    "AnswerRelevance",
    "AuditRecord",
    "AuditStore",
    "AuditWriter",
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
    "ExtractiveChatModel",
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
    "StoreError",
    "Support",
    "SupportBackend",
    "Thresholds",
    "Ticket",
    "Tier",
    "TraceragError",
    "UnknownOptionError",
    "UnknownPromptError",
    "UnreadableOutputError",
    "WrappedChain",
    "__version__",
    "configure",
    "configure_metrics",
    "open_store",
    "register_backend",
    "response_schema",
    "rule",
    "support",
    "trace_link",
    "validate_response",
    "wrap",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tracerag' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


class _Package(types.ModuleType):
    """tracerag's module: importing its ``wrap`` package keeps ``tracerag.wrap`` the function.

    Python binds a package's submodule as an attribute of the package once it is imported, so
    ``from tracerag import WrappedChain, wrap`` (or any earlier ``from tracerag.wrap import …``)
    would otherwise leave ``tracerag.wrap`` the ``tracerag.wrap`` package, not ``wrap()``.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == value.__name__:
            value = getattr(value, name)  # the submodule that defines the export: the export
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from tracerag._choices import PlanMode, Route, Stage, Tier
    from tracerag.contract import Evidence, Response, response_schema, validate_response
    from tracerag.demo.models.extractive import ExtractiveChatModel
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
    from tracerag.pipeline import PipelineOptions, RAGPipeline, RAGPipelineOptions
    from tracerag.record import AuditRecord
    from tracerag.routing import EscalationHandler, InMemoryEscalationHandler, Thresholds, Ticket
    from tracerag.settings import RetryPolicy
    from tracerag.signals.calibrated import CalibratedCombiner
    from tracerag.signals.checker import CheckerSupport
    from tracerag.signals.confidence import Combiner, HeuristicCombiner, Signals
    from tracerag.signals.consistency import Equivalence
    from tracerag.signals.judge import JudgeSupport
    from tracerag.signals.relevance import AnswerRelevance
    from tracerag.signals.rules import Rule, RuleResult, rule
    from tracerag.signals.support import Support, SupportBackend, register_backend, support
    from tracerag.store import AuditStore, AuditWriter, StoreError, open_store
    from tracerag.tracing import configure, trace_link
    from tracerag.wrap import WrappedChain, wrap
