"""Keyword options declared once, as a ``TypedDict``, for the functions that share them.

A function taking ``**options: Unpack[SomeOptions]`` is checked by type checkers; at run time
``check_options`` refuses a keyword the declaration does not name, as Python refuses a keyword
a signature does not name.
"""

from __future__ import annotations

from collections.abc import Iterable

from tracerag.errors import UnknownOptionError


def check_options(caller: str, options: Iterable[str], declared: frozenset[str]) -> None:
    """``UnknownOptionError`` (a ``TypeError``) for the first of ``options`` not ``declared``."""
    for name in options:
        if name not in declared:
            raise UnknownOptionError(f"{caller}() got an unexpected keyword argument {name!r}")


__all__ = ["check_options"]
