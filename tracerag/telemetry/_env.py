"""What the standard ``OTEL_*`` environment variables ask for, read without the SDK (looking
a provider up must not import it; only making one does)."""

from __future__ import annotations

import os
from typing import Literal


def env_value(*names: str) -> str | None:
    """The first of the environment variables ``names`` set to something, stripped."""
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip():
            return value.strip()
    return None


def env_exporters(signal: Literal["TRACES", "METRICS"]) -> list[str] | None:
    """The exporters ``OTEL_{signal}_EXPORTER`` names (lower case), ``["otlp"]`` when only an
    OTLP endpoint is set, or None when the environment does not say."""
    names = env_value(f"OTEL_{signal}_EXPORTER")
    if names is not None:
        return [n.strip().lower() for n in names.split(",") if n.strip()]
    if env_value(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        return ["otlp"]
    return None
