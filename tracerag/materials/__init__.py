"""Materials with a memory: provenance, validity, credibility that learns from outcomes, and an
audited write path (``MaterialRegistry``), in the audit store's database.

The core of tracerag: this package imports no tools, demo, server or command line.
"""

from __future__ import annotations

from tracerag._identity import OperatorIdentity, UnknownOperator
from tracerag.materials._conflicts import Conflict, answer_conflicts, find_conflicts
from tracerag.materials._credibility import (
    OUTCOMES,
    CredibilityPolicy,
    credibility,
    ema_update,
    temporal_confidence,
)
from tracerag.materials._db import MaterialStoreError
from tracerag.materials._gate import GateReason, GateVerdict, WriteGate
from tracerag.materials._model import (
    METADATA_KEYS,
    MaterialState,
    MaterialVersion,
    Provenance,
    Usage,
    content_hash,
)
from tracerag.materials._principal import (
    FeedbackLimits,
    InvalidUserToken,
    UserTokens,
)
from tracerag.materials._records import (
    MATERIALS_LOG,
    ConcurrentChange,
    InvalidTransition,
    MaterialNotFound,
    ReadHit,
    StoredVersion,
    Use,
)
from tracerag.materials._registry import MaterialRegistry
from tracerag.materials.feedback import DuplicateFeedback, FeedbackLimited

__all__ = [
    "MATERIALS_LOG",
    "METADATA_KEYS",
    "OUTCOMES",
    "ConcurrentChange",
    "Conflict",
    "CredibilityPolicy",
    "DuplicateFeedback",
    "FeedbackLimited",
    "FeedbackLimits",
    "GateReason",
    "GateVerdict",
    "InvalidTransition",
    "InvalidUserToken",
    "MaterialNotFound",
    "MaterialRegistry",
    "MaterialState",
    "MaterialStoreError",
    "MaterialVersion",
    "OperatorIdentity",
    "Provenance",
    "ReadHit",
    "StoredVersion",
    "UnknownOperator",
    "Usage",
    "Use",
    "UserTokens",
    "WriteGate",
    "answer_conflicts",
    "content_hash",
    "credibility",
    "ema_update",
    "find_conflicts",
    "temporal_confidence",
]
