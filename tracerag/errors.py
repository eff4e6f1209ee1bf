"""Errors tracerag raises to its callers, in one tree.

Every exception tracerag raises on purpose is a ``TraceragError``::

    TraceragError
    ├── InputError                 the request input is malformed (ValueError too)
    ├── ConfigurationError         a pipeline setting is invalid (ValueError too)
    │   └── MissingVersionError    no prompt or model version: refused before any model call
    ├── ContractError              a Response fails the shipped JSON Schema (ValueError too)
    ├── PlanError                  the model's plan is not valid plan JSON
    ├── CallError                  a model or retriever call failed in a way tracerag detects
    │   ├── CallTimeoutError       the call did not return within its timeout (TimeoutError too)
    │   │   ├── ModelTimeoutError
    │   │   └── RetrieverTimeoutError
    │   └── OutputTooLongError     the model's output is longer than the configured cap
    └── tracerag.store.StoreError  the audit store refused an operation (see tracerag.store)
        ├── RequestNotFound        (KeyError too)
        ├── NotQueued              (KeyError too)
        ├── InvalidRecord          (ValueError too)
        └── DuplicateRequest, AlreadyDecided, ClaimedByOther, SchemaTooNew

What ``invoke()`` / ``ainvoke()`` raise: ``InputError`` for bad input, ``ConfigurationError``
(including ``MissingVersionError``) for a pipeline that cannot answer, ``ContractError`` if a
Response fails its own schema. Failures of the model, the retriever, a plan, a support backend,
tracing, metrics, the audit store and the escalation handler are not raised: they are recorded
in the Response's record and routed (a request whose samples all failed is escalated).
``CallError`` and ``PlanError`` are what such records name.

Some classes also derive from the built-in an older release raised in their place (noted
above), so ``except ValueError`` / ``except KeyError`` written against it keeps working.
"""

from __future__ import annotations

__all__ = [
    "CallError",
    "CallTimeoutError",
    "ConfigurationError",
    "ContractError",
    "InputError",
    "MissingVersionError",
    "ModelTimeoutError",
    "OutputTooLongError",
    "PlanError",
    "RetrieverTimeoutError",
    "TraceragError",
]


class TraceragError(Exception):
    """Base class of every error tracerag raises."""


class InputError(TraceragError, ValueError):
    """The request input is malformed (empty or invisible question, wrong type, unknown field,
    invalid Unicode)."""


class ConfigurationError(TraceragError, ValueError):
    """A pipeline setting is invalid (thresholds out of order, unknown tier, bad backend name,
    a missing retriever or model)."""


class MissingVersionError(ConfigurationError):
    """A request has no prompt version or no model version; it is refused before any model call."""


class ContractError(TraceragError, ValueError):
    """A Response does not match the shipped JSON Schema.

    ``message`` says what is wrong and ``path`` where (a JSON Pointer into the payload).
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(f"{path or '/'}: {message}")
        self.message = message
        self.path = path


class PlanError(TraceragError):
    """The model's plan could not be parsed or validated against the plan schema."""


class CallError(TraceragError):
    """A call to the model or the retriever failed in a way tracerag itself detected."""


class CallTimeoutError(CallError, TimeoutError):
    """A model or retriever call did not return within its timeout (``RetryPolicy``)."""

    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(f"the {what} call did not return within {seconds:g} s")
        self.seconds = seconds


class ModelTimeoutError(CallTimeoutError):
    """A model call did not return within ``RetryPolicy.model_timeout``."""

    def __init__(self, seconds: float) -> None:
        super().__init__("model", seconds)


class RetrieverTimeoutError(CallTimeoutError):
    """A retriever call did not return within ``RetryPolicy.retriever_timeout``."""

    def __init__(self, seconds: float) -> None:
        super().__init__("retriever", seconds)


class OutputTooLongError(CallError):
    """The model's output is longer than ``RetryPolicy.max_output_chars``.

    ``text`` holds the output cut to the cap; ``length`` is the full length in characters.
    """

    def __init__(self, length: int, cap: int, text: str) -> None:
        super().__init__(
            f"the model's output is {length} characters, over the cap of {cap} "
            "(RetryPolicy.max_output_chars); it is not used"
        )
        self.length = length
        self.cap = cap
        self.text = text
