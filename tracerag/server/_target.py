"""``tracerag serve --app module:attribute``: find the app to serve, the way ``uvicorn`` does.

The module is imported with ``app_dir`` (default: the current directory) first on the import
path; the attribute may be dotted (``module:holder.app``). It must be a ``wrap()``-ed app, a
``RAGPipeline`` or a ``create_agent`` app with ``TraceragMiddleware``; with ``factory=True`` it
is called with no arguments and must return one.
Anything else is an ``AppTargetError`` that says what was found and what to do.
"""

from __future__ import annotations

import importlib
import os
import sys

from tracerag._runnable import StagedRunnable
from tracerag.errors import ConfigurationError


class AppTargetError(ConfigurationError):
    """``--app`` names nothing the server can run (no module, no attribute, a wrong type)."""


FORM = 'give it as "module:attribute", e.g. --app myproject.rag:app'


def _describe(obj: object) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _import(module_name: str, app_dir: str | None) -> object:
    if app_dir is not None:
        path = os.path.abspath(app_dir)
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            where = f" (looked in {app_dir!r} and on the import path)" if app_dir else ""
            raise AppTargetError(f"no module named {module_name!r}{where}") from None
        raise AppTargetError(
            f"importing {module_name!r} failed: it needs the module {missing!r}, which is not "
            "installed"
        ) from exc
    except Exception as exc:
        raise AppTargetError(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def _served_agent(obj: object) -> StagedRunnable | None:
    """A ``create_agent`` app with ``TraceragMiddleware``, as the server runs it."""
    if not hasattr(obj, "nodes"):
        return None
    try:
        from tracerag.middleware._served import served_agent
    except ImportError:  # LangChain's agents are not installed: it cannot be one
        return None
    return served_agent(obj)


def load_app(target: str, *, factory: bool = False, app_dir: str | None = ".") -> StagedRunnable:
    """The app ``target`` (``module:attribute``) names; ``AppTargetError`` when it cannot be
    served."""
    module_name, sep, attribute = target.strip().partition(":")
    if not sep or not module_name or not attribute:
        raise AppTargetError(f"--app {target!r} is not module:attribute; {FORM}")
    if not all(part.isidentifier() for part in module_name.split(".")) or not all(
        part.isidentifier() for part in attribute.split(".")
    ):
        raise AppTargetError(f"--app {target!r} is not module:attribute; {FORM}")
    obj = _import(module_name, app_dir)
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppTargetError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if factory:
        if not callable(obj):
            raise AppTargetError(
                f"--factory calls {target}, but it is a {_describe(obj)}, not a function"
            )
        try:
            obj = obj()
        except Exception as exc:
            raise AppTargetError(
                f"calling the factory {target}() failed: {type(exc).__name__}: {exc}"
            ) from exc
    if isinstance(obj, StagedRunnable):
        return obj
    served = _served_agent(obj)
    if served is not None:
        return served
    made = f"{target}() returned" if factory else f"{target} is"
    from langchain_core.runnables import Runnable

    if isinstance(obj, Runnable):
        hint = (
            "tracerag serves it once wrapped: app = tracerag.wrap(graph); a create_agent app "
            "also once given middleware=[tracerag.TraceragMiddleware(...)]"
        )
    elif callable(obj) and not factory and not isinstance(obj, type):
        hint = "if it builds the app, add --factory to call it; or point --app at the app itself"
    else:
        hint = "point --app at a tracerag.wrap(...) result or a RAGPipeline"
    raise AppTargetError(f"{made} a {_describe(obj)}, not a wrap()-ed app or a RAGPipeline; {hint}")
