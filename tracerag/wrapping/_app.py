"""wrap(app) and the Runnable it returns."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.history import RunnableWithMessageHistory

from tracerag._choices import check_options
from tracerag._pipeline import PipelineOptions, build_settings
from tracerag._runnable import StagedRunnable
from tracerag._state import Conversation, RequestInput
from tracerag._withheld import check_withheld_message
from tracerag.errors import ConfigurationError, InputError
from tracerag.stages._sample import TEMPERATURE_ZERO_WARNING
from tracerag.telemetry._instruments import record_turn_resumed, resume_action
from tracerag.wrapping._commit import (
    CURRENT_TURNS,
    Turns,
    is_command,
)
from tracerag.wrapping._hooks import instrument
from tracerag.wrapping._inspect import ChainInfo, inspect_chain, retrieval_parts
from tracerag.wrapping._io import MESSAGES_KEY, ChainIO, user_turns
from tracerag.wrapping._samples import SAMPLING_MODES, Sampler, Sampling, checkpointer_of
from tracerag.wrapping._source import ChainSource

if TYPE_CHECKING:
    from langchain_core.callbacks import AsyncCallbackManagerForChainRun
    from langchain_core.runnables import RunnableConfig
    from typing_extensions import Unpack

    from tracerag._routing import EscalationHandler
    from tracerag._settings import Settings
    from tracerag.contract import Response

logger = logging.getLogger("tracerag.wrapping")


class WrappedChain(StagedRunnable):
    """An existing chain or graph run through the six traced stages; returns a ``Response``.

    Input: what the app takes (a question string, or a dict such as ``{"question": …}`` or
    ``{"input": …, "chat_history": […]}``), passed to it unchanged; ``session_id``,
    ``user_id``, ``channel`` and ``request_id`` in a dict are recorded too. A
    ``RequestInput`` is tracerag's own request: the app gets its question as a bare question.
    """

    def __init__(
        self,
        chain: Runnable[Any, Any],
        *,
        settings: Settings,
        info: ChainInfo,
        chain_input: Callable[[str], Any] | None = None,
        io: ChainIO | None = None,
        run_once: Sequence[str] = (),
        sampling: Sampling = "answer",
        withheld_message: str | None = None,
    ) -> None:
        io = io or ChainIO()
        self.withheld_message = check_withheld_message(withheld_message)
        source = ChainSource(
            chain,
            info,
            io=io,
            sampler=Sampler(chain, run_once, sampling, answer_of=io.answer_or_none),
            chain_input=chain_input,
        )
        super().__init__(settings, source)
        self.chain = chain
        self.info = info
        self.chain_input = chain_input
        self.io = source.io
        self.sampler = source.sampler

    @property
    def escalation(self) -> EscalationHandler:
        return self.settings.escalation

    async def _answer(
        self,
        input: Any,
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> Response:
        """The request, then what it leaves in the app's own thread or history: committed
        only now that it is routed, a withheld answer replaced by ``withheld_message``.

        A turn the app paused (an interrupt it raised) is delivered by the run loop as
        interrupted, its Response naming the interrupts; a ``Command(resume=...)`` that finishes
        its turn (the caller's thread no longer waits at the interrupts it resumed: answered, or
        paused at new ones) is counted as resumed (``kind="app"``)."""
        resumed: _Resume | None = None
        if is_command(input):
            input = resumed = await self._resume(input, config)
        # the question the withheld message answers in its language (parsing is pure: a bad
        # input raises here as it would in the run)
        question = self.parse_input(input).question
        turns = Turns()
        token = CURRENT_TURNS.set(turns)
        try:
            response = await super()._answer(input, run_manager, config, **kwargs)
        finally:
            CURRENT_TURNS.reset(token)
        committed = await turns.commit(response, self.withheld_message, question)
        if resumed is not None and await self._left(resumed, config):
            action = resume_action(_resume_actions(resumed.command))
            record_turn_resumed("app", action, meter_provider=self.settings.meter_provider)
        return committed

    async def _left(self, resumed: _Resume, config: RunnableConfig) -> bool:
        """Whether the caller's thread left the interrupts a resume answered (a turn not kept
        in the thread still waits at them); a thread that cannot be read is not counted."""
        try:
            state = await self.chain.aget_state(  # type: ignore[attr-defined]
                {"configurable": dict(config.get("configurable") or {})}
            )
        except Exception:
            logger.warning("tracerag wrap: cannot read the resumed thread", exc_info=True)
            return False
        pending = {i.id for i in getattr(state, "interrupts", ()) or ()}
        return not (pending & resumed.waiting)

    async def _resume(self, command: Any, config: RunnableConfig) -> _Resume:
        """A ``Command(resume=...)`` for the caller's interrupted thread, with the question
        of the turn it resumes (the thread's last user message)."""
        if self.sampler.saver is None:
            raise InputError(
                "Command(resume=...) resumes an interrupted turn on a checkpointed graph's "
                "thread, and this app has no checkpointer: build it with one (e.g. "
                "create_agent(..., checkpointer=InMemorySaver())) to pause and resume turns"
            )
        configurable = dict(config.get("configurable") or {})
        thread = configurable.get("thread_id")
        if thread is None:
            raise InputError(
                "Command(resume=...) needs the thread it resumes: "
                "config={'configurable': {'thread_id': ...}}"
            )
        state = await self.chain.aget_state({"configurable": configurable})  # type: ignore[attr-defined]
        if not state.next or not getattr(state, "interrupts", ()):
            raise InputError(
                f"thread {thread!r} has no interrupted turn to resume: call the app with the "
                "next question instead"
            )
        waiting = frozenset(i.id for i in state.interrupts)
        return _Resume(command, self.io.question(state.values), waiting)

    def parse_input(self, input: Any) -> RequestInput:
        """The checked request, with the caller's input kept for the app."""
        if isinstance(input, RequestInput):
            return super().parse_input(input)
        if isinstance(input, _Resume):  # the question is the resumed turn's
            parsed = super().parse_input({"question": input.question})
            return dataclasses.replace(parsed, app_input=input.command)
        if is_command(input):
            raise InputError(
                "Command(resume=...) is taken by invoke/ainvoke/stream with the thread's config"
            )
        request = self.io.request(input)
        parsed = super().parse_input({"question": request.question, **request.fields})
        if request.history_source is not None:
            parsed = parsed.following(request.earlier, request.history_source)
        if self.chain_input is not None:  # the app's input is made from the question
            return parsed
        return dataclasses.replace(parsed, app_input=request.chain_input)

    async def read_conversation(
        self, request: RequestInput, config: RunnableConfig | None
    ) -> RequestInput:
        """The request as a turn of the conversation the app keeps for ``config``: the user
        turns of its checkpointed thread (``aget_state``; a graph with a checkpointer called
        with a ``thread_id``) or of its ``RunnableWithMessageHistory`` session, before those
        of the input itself. An app whose store cannot be read is answered with what its input
        holds, the failure logged and recorded (``conversation.read_error``)."""
        try:
            kept = await conversation_kept(self.chain, config)
        except Exception as exc:  # the turn is still answered, read with what its input holds
            error = f"{type(exc).__name__}: {exc}"
            logger.warning("tracerag wrap: cannot read the app's conversation: %s", error)
            held = request.conversation or Conversation(
                (), request.question, "standalone", store_source(self.chain)
            )
            return dataclasses.replace(
                request, conversation=dataclasses.replace(held, read_error=error)
            )
        if kept is None or not kept[0]:
            return request
        turns, source = kept
        earlier = request.conversation.earlier if request.conversation is not None else ()
        return request.following((*turns, *earlier), source)


def _resume_actions(command: Any) -> list[str]:
    """The actions a ``Command(resume=...)`` takes: the ``type`` of each of its decisions
    (``HumanInTheLoopMiddleware``: ``{"decisions": [{"type": "approve"}, ...]}``), of the value
    itself (``{"type": ...}``), or of the values of a resume keyed by interrupt id."""
    value = getattr(command, "resume", None)
    values = [value]
    if isinstance(value, dict) and not ({"decisions", "type"} & value.keys()):
        values = list(value.values())  # {interrupt id: resume value}
    actions: list[str] = []
    for item in values:
        if not isinstance(item, dict):
            continue
        decisions = item.get("decisions")
        found = decisions if isinstance(decisions, list) else [item]
        actions += [str(d.get("type")) for d in found if isinstance(d, dict) and "type" in d]
    return actions


@dataclasses.dataclass(frozen=True)
class _Resume:
    """A caller's ``Command(resume=...)`` and the question of the turn it resumes."""

    command: Any
    question: str
    #: the ids of the interrupts the thread waits at
    waiting: frozenset[str] = frozenset()


def wrap(
    chain: Runnable[Any, Any],
    *,
    prompt_version: str | None = None,
    model_version: str | None = None,
    chain_input: Callable[[str], Any] | None = None,
    input_key: str | None = None,
    output_key: str | None = None,
    documents_key: str | None = None,
    run_once: Sequence[str] = (),
    retriever: BaseRetriever | None = None,
    sampling: Sampling = "answer",
    withheld_message: str | None = None,
    **options: Unpack[PipelineOptions],
) -> WrappedChain:
    """Wrap an existing LangChain chain or LangGraph graph so each request runs the six traced,
    verified stages.

    The caller's input is passed to the app unchanged. ``input_key`` names the field holding
    the question (default: ``question``, ``input``, ``query``, or a string input);
    ``output_key`` the field holding the answer (default: ``answer``, ``output``, ``result``, or
    a string or ``AIMessage`` output); ``documents_key`` the field of the output holding the
    documents the app used (default: ``context``, ``source_documents``). ``run_once`` names
    graph nodes that must run once per request, not once per sample. ``retriever`` is the
    retriever the app uses inside its nodes, called once in the retrieve stage for scored
    materials. ``chain_input`` turns the question into the app's input instead.

    ``sampling="answer"`` (the default) retrieves once and draws the N answers from the same
    materials: a graph (an agent) runs once and its answering step is forked N-1 times from
    the checkpoint before it; a chain's retrieval is shared by its N runs. ``sampling="app"``
    runs the whole app N times, for apps whose retrieval itself varies. The options it shares
    with ``RAGPipeline`` are ``tracerag.pipeline.PipelineOptions``.

    What the app keeps of a turn — a checkpointed graph's thread, a
    ``RunnableWithMessageHistory``'s history — is written only once the turn is verified and
    routed: the released answer, or for a withheld one ``withheld_message`` (by default a
    message in the question's language that a person will answer; ``{ticket_id}``
    and ``{request_id}`` filled in), so the thread, its history and the next turn never hold
    what tracerag withheld.
    """
    check_options("wrap", options, PipelineOptions.__optional_keys__)
    if not isinstance(chain, Runnable):
        raise ConfigurationError(f"wrap() needs a LangChain Runnable, got {type(chain).__name__}")
    if sampling not in SAMPLING_MODES:
        raise ConfigurationError(
            f"sampling must be one of {list(SAMPLING_MODES)}, got {sampling!r}"
        )
    info = inspect_chain(chain)
    if retriever is not None and retriever not in info.retrievers:
        info.retrievers.append(retriever)
    reached, stores = retrieval_parts(chain)
    info.reached_retrievers = [r for r in reached if r not in info.retrievers]
    info.stores = stores
    instrument([*info.retrievers, *info.reached_retrievers], stores)
    temperature = info.temperature
    settings = build_settings(
        retriever=None,
        llm=None,
        prompt_version=prompt_version or info.prompt_version,
        model_version=model_version or info.model_version,
        prompt_version_source=_source(prompt_version, info.prompt_version, "template"),
        model_version_source=_source(model_version, info.model_version, "app"),
        temperature=temperature if temperature is not None else 0.7,
        plan_mode="inline",
        **options,
    )
    if temperature == 0.0 and settings.n_samples > 1:
        logger.warning("tracerag wrap: %s", TEMPERATURE_ZERO_WARNING)
    io = ChainIO(
        input_key=input_key,
        output_key=output_key,
        documents_key=documents_key,
        app=None if input_key else chain,
    )
    return WrappedChain(
        chain,
        settings=settings,
        info=info,
        chain_input=chain_input,
        io=io,
        run_once=run_once,
        sampling=sampling,
        withheld_message=withheld_message,
    )


async def conversation_kept(
    chain: Any, config: RunnableConfig | None
) -> tuple[tuple[str, ...], Literal["thread", "history"]] | None:
    """The user turns the app keeps for the conversation ``config`` names (oldest first), and
    where: ``thread`` (a checkpointed graph's state), ``history`` (a
    ``RunnableWithMessageHistory``'s session); None when it keeps none for it."""
    configurable = dict((config or {}).get("configurable") or {})
    if isinstance(chain, RunnableWithMessageHistory):
        history = _session_history(chain, configurable)
        if history is None:
            return None
        messages = await history.aget_messages()
        return user_turns(messages, "history") if messages else (), "history"
    if checkpointer_of(chain) is None or not configurable.get("thread_id"):
        return None
    snapshot = await chain.aget_state({"configurable": configurable})
    values = getattr(snapshot, "values", None)
    held = values.get(MESSAGES_KEY) if isinstance(values, dict) else None
    if not held or isinstance(held, str):
        return None
    return user_turns(held, MESSAGES_KEY), "thread"


def store_source(chain: Any) -> Literal["thread", "history"]:
    """Where an app keeps its conversation: a message history's session, else a thread."""
    return "history" if isinstance(chain, RunnableWithMessageHistory) else "thread"


def _session_history(
    chain: RunnableWithMessageHistory, configurable: dict[str, Any]
) -> BaseChatMessageHistory | None:
    """The session history ``RunnableWithMessageHistory`` gives the call (as it finds it:
    one configurable field is passed positionally, several by name); None when the config
    lacks a field it needs."""
    keys = [spec.id for spec in chain.history_factory_config]
    if any(key not in configurable for key in keys):
        return None
    if len(keys) == 1:
        return chain.get_session_history(configurable[keys[0]])
    return chain.get_session_history(**{key: configurable[key] for key in keys})


def _source(given: str | None, found: str | None, how: str) -> str | None:
    if given:
        return "argument"
    return how if found else None


__all__ = ["WrappedChain", "wrap"]
