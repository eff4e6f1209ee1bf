"""Errors tracerag raises to its callers."""

from __future__ import annotations


class TraceragError(Exception):
    """Base class of every error tracerag raises."""


class InputError(TraceragError, ValueError):
    """The request input is malformed (empty question, wrong type, unknown field)."""


class MissingVersionError(TraceragError, ValueError):
    """A request has no prompt version or no model version; it is refused before any model call."""


class PlanError(TraceragError):
    """The model's plan could not be parsed or validated against the plan schema."""


class ConfigurationError(TraceragError, ValueError):
    """A pipeline setting is invalid (thresholds out of order, unknown tier, bad backend name)."""
