"""Errors tracerag raises to its callers, in one tree.

Every exception tracerag raises on purpose is a ``TraceragError``. Some classes also derive
from a built-in (``(ValueError too)``): the one an older release raised in their place, or the
one Python raises for the same fault, so ``except ValueError`` / ``except KeyError`` keeps
working. Import a class from ``tracerag`` or from the module named beside it; ``(internal)``
ones are answered inside tracerag (by the server) and reach no caller::

    TraceragError
    ├── InputError (ValueError too)
    │   └── InputTypeError (TypeError too)
    ├── ConfigurationError (ValueError too)
    │   ├── AppTargetError                            (internal)
    │   ├── MissingDependencyError (ImportError too)
    │   ├── MissingVersionError
    │   ├── UnknownOptionError (TypeError too)
    │   └── UnknownPromptError (KeyError too)
    ├── AuthenticationError
    │   ├── InvalidUserToken (ValueError too)         tracerag.materials
    │   └── UnknownOperator (ValueError too)          tracerag.materials
    ├── ContractError (ValueError too)
    ├── PlanError
    ├── CallError
    │   ├── CallTimeoutError (TimeoutError too)
    │   │   ├── ModelTimeoutError
    │   │   └── RetrieverTimeoutError
    │   ├── ContextWindowError (ValueError too)       tracerag.demo.models.local
    │   ├── OutputTooLongError
    │   └── UnreadableOutputError (TypeError too)
    ├── StoreError                                    tracerag.store
    │   ├── AlreadyDecided                            tracerag.store
    │   ├── AlreadyReviewed                           tracerag.store
    │   ├── ClaimedByOther                            tracerag.store
    │   ├── DuplicateRequest                          tracerag.store
    │   ├── InvalidRecord (ValueError too)            tracerag.store
    │   ├── JournalError (OSError too)                tracerag.store
    │   │   └── JournalBusy                           tracerag.store
    │   ├── NotQueued (KeyError too)                  tracerag.store
    │   ├── RequestNotFound (KeyError too)            tracerag.store
    │   ├── SchemaTooNew                              tracerag.store
    │   ├── StoreFailing                              tracerag.store
    │   ├── StoreMissing                              tracerag.store
    │   ├── StoreReplaced                             tracerag.store
    │   └── StoreVanished                             tracerag.store
    ├── MaterialStoreError                            tracerag.materials
    │   ├── ConcurrentChange                          tracerag.materials
    │   ├── DuplicateFeedback                         tracerag.materials
    │   ├── FeedbackLimited                           tracerag.materials
    │   ├── InvalidTransition (ValueError too)        tracerag.materials
    │   └── MaterialNotFound (KeyError too)           tracerag.materials
    ├── CostTooHigh                                   tracerag.tools.explain
    ├── DeskStateError                                (internal)
    ├── KeyReused                                     (internal)
    ├── ReplayRefused                                 tracerag.tools.explain
    └── RunTableError                                 (internal)

What ``invoke()`` / ``ainvoke()`` raise: ``InputError`` for bad input, ``ConfigurationError``
(including ``MissingVersionError``) for a pipeline that cannot answer, ``ContractError`` if a
Response fails its own schema. Failures of the model, the retriever, a plan, a support backend,
tracing, metrics, the audit store and the escalation handler are not raised: they are recorded
in the Response's record and routed (a request whose samples all failed is escalated).
``CallError`` and ``PlanError`` are what such records name.

What tracerag raises that is not in the tree: ``NotImplementedError`` from an interface method,
``AttributeError`` from a module's ``__getattr__``, ``SystemExit`` ending a command, and an
exception it caught and raises again (docs/errors.md lists each category).
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "CallError",
    "CallTimeoutError",
    "ConfigurationError",
    "ContractError",
    "InputError",
    "InputTypeError",
    "MissingDependencyError",
    "MissingVersionError",
    "ModelTimeoutError",
    "OutputTooLongError",
    "PlanError",
    "RetrieverTimeoutError",
    "TraceragError",
    "UnknownOptionError",
    "UnknownPromptError",
    "UnreadableOutputError",
]


class TraceragError(Exception):
    """Base class of every error tracerag raises."""


class InputError(TraceragError, ValueError):
    """An input is malformed: a request's question (empty, invisible, invalid Unicode, an
    unknown field), an argument of a call, a row of a data file, a reviewer's decision."""


class InputTypeError(InputError, TypeError):
    """An input has the wrong type: text that is not a ``str``, a message that is not text."""


class ConfigurationError(TraceragError, ValueError):
    """A setting is invalid: a pipeline option or threshold, a policy, a price table, an
    environment variable, a credentials file, a missing retriever or model."""


class MissingVersionError(ConfigurationError):
    """A request has no prompt version or no model version; it is refused before any model call."""


class UnknownOptionError(ConfigurationError, TypeError):
    """A keyword argument the call does not take, refused as Python refuses one."""


class UnknownPromptError(ConfigurationError, KeyError):
    """No prompt version is registered under the name asked for."""

    __str__ = BaseException.__str__  # the message as written, not quoted as KeyError quotes it


class MissingDependencyError(ConfigurationError, ImportError):
    """An optional extra, or the model file it brings, is not installed; the message says what
    to install."""


class AuthenticationError(TraceragError):
    """A token or credential proves no one, or someone other than the name given with it."""


class ContractError(TraceragError, ValueError):
    """A payload does not match its shipped JSON Schema (a Response, a plan).

    ``message`` says what is wrong and ``path`` where (a JSON Pointer into the payload).
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(f"{path or '/'}: {message}")
        self.message = message
        self.path = path


class PlanError(TraceragError):
    """The model's plan could not be parsed or validated against the plan schema."""


class CallError(TraceragError):
    """A call to the model, the retriever or the wrapped app failed in a way tracerag itself
    detected."""


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


class UnreadableOutputError(CallError, TypeError):
    """The wrapped app's output holds no answer tracerag can find (``output_key=`` names it)."""
