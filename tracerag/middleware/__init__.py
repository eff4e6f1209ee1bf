"""``TraceragMiddleware``: the six verified stages as a LangChain ``AgentMiddleware``.

For ``create_agent(model, tools, middleware=[TraceragMiddleware(...)])``: the materials are what
the agent's tools returned in the turn, the answering model call is sampled N times (tools and
retrieval run once), and the answer is verified and routed before it enters the agent's state.
A withheld answer is replaced by a message saying a person will answer; on a checkpointed
thread the turn is interrupted for review (``Command(resume={"type": "approve" | "edit" |
"reject", ...})``). The turn's Response is ``result["tracerag"]``.
"""

from tracerag.errors import MissingDependencyError

try:
    import langchain.agents.middleware  # noqa: F401
    import langgraph.types  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed where tests run
    raise MissingDependencyError(
        'TraceragMiddleware needs LangChain\'s agents and LangGraph: pip install ".[agents]"'
    ) from exc

from tracerag.middleware._middleware import TraceragMiddleware, TraceragState
from tracerag.middleware._review import ReviewAction

__all__ = ["ReviewAction", "TraceragMiddleware", "TraceragState"]
