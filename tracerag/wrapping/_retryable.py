"""Which failures of a wrapped app are worth retrying.

An app run fails the same way every time for a deterministic error: a graph given an update it
rejects (LangGraph's ``InvalidUpdateError``), an input that fails validation, a graph that
recurses without end, a provider that refuses the credentials or the request. Retrying those
only multiplies the calls; they are recorded once and the sample fails. Everything else (time
outs, rate limits, dropped connections, provider 5xx) is treated as transient.
"""

from __future__ import annotations

from tracerag._llm import is_transient as model_error_is_transient

# class names (anywhere in the exception's MRO) of errors that repeat on every attempt
DETERMINISTIC_NAMES = frozenset(
    {
        # LangGraph graph errors (matched by name: langgraph is not a dependency of tracerag)
        "InvalidUpdateError",
        "GraphRecursionError",
        "EmptyInputError",
        "EmptyChannelError",
        "UnknownInterruptError",
        # validation
        "ValidationError",
        "SchemaError",
        # provider SDKs (OpenAI, Anthropic, Google, …): the request or the credentials are wrong
        "AuthenticationError",
        "PermissionDeniedError",
        "PermissionDenied",
        "Unauthenticated",
        "BadRequestError",
        "NotFoundError",
        "UnprocessableEntityError",
    }
)
# HTTP statuses a provider answers for a request that will never succeed as it is
DETERMINISTIC_STATUSES = frozenset({400, 401, 403, 404, 422})
# plain Python errors that come from the code, not from the world
DETERMINISTIC_TYPES: tuple[type[BaseException], ...] = (LookupError, ImportError, SyntaxError)


def is_deterministic(error: BaseException) -> bool:
    """Whether an app run's error would repeat on every attempt (graph, validation, auth)."""
    if isinstance(error, DETERMINISTIC_TYPES):
        return True
    if any(cls.__name__ in DETERMINISTIC_NAMES for cls in type(error).__mro__):
        return True
    status = getattr(error, "status_code", None)
    if status is None:
        status = getattr(getattr(error, "response", None), "status_code", None)
    return isinstance(status, int) and status in DETERMINISTIC_STATUSES


def is_transient(error: BaseException) -> bool:
    """Whether an app run's error is worth retrying: neither deterministic nor a code error."""
    return model_error_is_transient(error) and not is_deterministic(error)


__all__ = ["DETERMINISTIC_NAMES", "DETERMINISTIC_STATUSES", "is_deterministic", "is_transient"]
