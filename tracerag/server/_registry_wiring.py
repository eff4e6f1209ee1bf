"""The server's material wiring: every material it answers from reaches the registry, and what
the desk may say about retrieval.

* After each request's record is persisted, ``record_usage`` registers the materials the
  answer used that the registry has not seen (with their provenance) and logs the request's
  read hits — for any pipeline the server runs, so an operator can quarantine any material
  the server has answered from.
* ``governs(pipeline, registry)``: whether the pipeline retrieves through a
  ``CredibilityRetriever`` of this registry's store (``registry.govern(retriever)``), so that
  quarantined, deleted, pending and expired materials are out of its retrieval. The desk says
  "out of retrieval" only when this holds; otherwise it says the quarantine is recorded but
  this server's retrieval does not consult it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tracerag.materials._rerank import CredibilityRetriever
from tracerag.materials.feedback import record_usage

if TYPE_CHECKING:
    from tracerag.materials import MaterialRegistry
    from tracerag.server._deps import Services

logger = logging.getLogger("tracerag.server")


def _retrievers(pipeline: object) -> list[object]:
    found: list[object] = []
    settings = getattr(pipeline, "settings", None)
    retriever = getattr(settings, "retriever", None)
    if retriever is not None:
        found.append(retriever)
    info = getattr(pipeline, "info", None)
    found += list(getattr(info, "retrievers", None) or [])
    return found


def _store_id(store: Any) -> str | None:  # any store: those without an identity are None
    try:
        return str(store.identity()["store_id"])
    except Exception:  # a store without an identity cannot be matched
        return None


def governs(pipeline: object, registry: MaterialRegistry | None) -> bool:
    """True when the pipeline's retrieval goes through a ``CredibilityRetriever`` whose
    registry lives in the same audit store as ``registry``."""
    if registry is None:
        return False
    want = _store_id(registry.store)
    for retriever in _retrievers(pipeline):
        if isinstance(retriever, CredibilityRetriever):
            theirs = retriever.registry
            if theirs is registry or (want is not None and _store_id(theirs.store) == want):
                return True
    return False


def retrieval_governed(svc: Services) -> bool:
    """Whether the app's served retrieval consults its material registry (kept once known)."""
    if svc.governed is None:
        if svc.registry is None:
            return False
        svc.governed = governs(svc.answerer.pipeline, svc.registry)
    return bool(svc.governed)


def usage_recorder(svc: Services) -> Callable[[Mapping[str, Any]], None]:
    """A record hook: first sight and read hits of a persisted request's materials, in the
    app's registry (opened on first use; a store that cannot hold one is told once)."""
    unavailable: list[str] = []

    def record(rec: Mapping[str, Any]) -> None:
        if unavailable:
            return
        try:
            registry = svc.materials()
        except Exception as exc:
            unavailable.append(type(exc).__name__)
            logger.info("no material registry beside this store (%s): read hits are not kept", exc)
            return
        record_usage(rec, registry=registry)

    return record


__all__ = ["governs", "retrieval_governed", "usage_recorder"]
