"""A setting or counter an object keeps in one of its parts: read and set through the owner.

``Kept("_part")`` on a class makes ``owner.name`` read and set ``owner._part.name`` (or the
part's attribute named ``attr``), so a class composed of parts keeps its public attributes
while each part owns the values it uses.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

_T = TypeVar("_T")


class Kept(Generic[_T]):
    """An attribute kept by the part ``part`` of its owner (under ``attr``, default its name)."""

    def __init__(self, part: str, attr: str | None = None) -> None:
        self.part = part
        self.attr = attr or ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = self.attr or name

    @overload
    def __get__(self, owner: None, cls: type) -> Kept[_T]: ...

    @overload
    def __get__(self, owner: object, cls: type) -> _T: ...

    def __get__(self, owner: object | None, cls: type) -> _T | Kept[_T]:
        if owner is None:
            return self
        value: _T = getattr(getattr(owner, self.part), self.attr)
        return value

    def __set__(self, owner: object, value: _T) -> None:
        part: Any = getattr(owner, self.part)
        setattr(part, self.attr, value)
