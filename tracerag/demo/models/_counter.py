"""A thread-safe count of model calls, shared by the demo models (it numbers their seeds)."""

from __future__ import annotations

import itertools
import threading
from typing import Any


class CallCounter:
    """A thread-safe call counter; copies share nothing and start where the original was."""

    def __init__(self, start: int = 0) -> None:
        self._lock = threading.Lock()
        self._count = itertools.count(start)
        self._last = start - 1

    def next(self) -> int:
        """The number of this call (0, 1, 2, … in the order calls arrive)."""
        with self._lock:
            self._last = next(self._count)
            return self._last

    def __deepcopy__(self, memo: dict[int, Any]) -> CallCounter:
        return CallCounter(self._last + 1)
