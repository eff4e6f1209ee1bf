"""A ``create_agent`` app with ``TraceragMiddleware``, served by ``tracerag serve --app``.

``ServedAgent`` is the agent as the server runs it: a request's question becomes a user message
on the thread its ``session_id`` names (else a thread of its own), the turn's Response is the
middleware's, and its audit record goes where the server sends it (the middleware's run takes
the server's record sink and stage listener for this call, through ``CallHooks``). A decision
taken at the review desk resumes the escalated turn's thread (``resume_decision``), on
whichever server process took it: the thread is read from the request's record, the approved
candidate is the one the desk read from the record, and the agent's checkpointer — one all
processes share — holds the interrupted turn.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import AsyncCallbackManagerForChainRun
from langchain_core.messages import HumanMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.types import Command

from tracerag._runnable import StagedRunnable
from tracerag._runner import SETTINGS_SINK
from tracerag._state import RequestInput
from tracerag.contract import Response
from tracerag.errors import ConfigurationError, UnreadableOutputError
from tracerag.middleware._call import CALL_HOOKS, CallHooks
from tracerag.middleware._middleware import TraceragMiddleware
from tracerag.middleware._source import TurnSource
from tracerag.middleware._turn import Turn

if TYPE_CHECKING:
    from tracerag._settings import RecordSink
    from tracerag.events import StageListener

__all__ = ["ServedAgent", "find_middleware", "served_agent"]


def find_middleware(graph: object) -> TraceragMiddleware | None:
    """The ``TraceragMiddleware`` a compiled ``create_agent`` graph runs, if any."""
    nodes = getattr(graph, "nodes", None)
    if not isinstance(nodes, Mapping):
        return None
    for node in nodes.values():
        bound = getattr(node, "bound", None)
        for name in ("func", "afunc"):
            owner = getattr(getattr(bound, name, None), "__self__", None)
            if isinstance(owner, TraceragMiddleware):
                return owner
    return None


def served_agent(graph: object) -> ServedAgent | None:
    """The agent as the server runs it, or None when it has no ``TraceragMiddleware``."""
    middleware = find_middleware(graph)
    if middleware is None or not isinstance(graph, Runnable):
        return None
    return ServedAgent(graph, middleware)


async def _no_draw(*_: Any) -> Any:  # pragma: no cover - never called: the agent answers
    raise ConfigurationError("a served agent answers through its middleware")


class ServedAgent(StagedRunnable):
    """An agent with ``TraceragMiddleware``, as the server runs it: question in, Response out."""

    def __init__(self, agent: Runnable[Any, Any], middleware: TraceragMiddleware) -> None:
        # the stage table is the middleware's, run inside the agent's model node
        super().__init__(middleware.settings, TurnSource(Turn("", (), (), (), 0), _no_draw, []))
        self.agent = agent
        self.middleware = middleware

    def _thread(self, request: RequestInput) -> str:
        return request.session_id or f"tracerag-{request.request_id or uuid.uuid4().hex}"

    async def _answer(
        self,
        input: Any,
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        *,
        caller: frozenset[int],
        on_stage: StageListener | None = None,
        record_sink: RecordSink | None = SETTINGS_SINK,
    ) -> Response:
        """One question as one turn of the agent, on its session's thread (every surface of
        ``StagedRunnable`` answers through this)."""
        request = self.parse_input(input)
        thread = self._thread(request)
        token = CALL_HOOKS.set(CallHooks(request.request_id, record_sink, on_stage))
        try:
            result = await self.agent.ainvoke(
                {"messages": [HumanMessage(request.question)]},
                {"configurable": {"thread_id": thread}},
            )
        finally:
            CALL_HOOKS.reset(token)
        verified = result.get("tracerag") if isinstance(result, Mapping) else None
        if not isinstance(verified, Mapping):
            raise UnreadableOutputError(
                "the agent's turn ended without an answer tracerag verified"
            )
        return Response.model_validate(verified)

    def resume_decision(self, payload: Mapping[str, Any]) -> None:
        """Resume the thread of a request the review desk decided (a decision payload)."""
        thread = payload.get("session_id")
        request_id = str(payload.get("request_id") or "")
        action = payload.get("action")
        if not thread or action not in ("approve", "edit", "reject"):
            return
        value: dict[str, Any] = {"type": action}
        approved: dict[str, str] = {}
        if action == "edit":
            value["answer"] = payload.get("final_answer") or ""
        elif action == "approve" and payload.get("final_answer"):
            approved[request_id] = str(payload["final_answer"])
        config: RunnableConfig = {"configurable": {"thread_id": str(thread)}}
        state = self.agent.get_state(config)  # type: ignore[attr-defined]
        if not any(
            isinstance(i.value, Mapping) and i.value.get("request_id") == request_id
            for i in state.interrupts
        ):
            return  # the thread does not wait for this request's review (decided already)
        token = CALL_HOOKS.set(CallHooks(request_id=request_id, approved=approved))
        try:
            self.agent.invoke(Command(resume=value), config)
        finally:
            CALL_HOOKS.reset(token)
