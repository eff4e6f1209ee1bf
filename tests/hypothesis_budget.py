"""How many examples a property test draws, and the Hypothesis profiles that decide it.

A property test names its full count: ``@settings(max_examples=examples(400))``; a test that
names none draws the profile's default. A run of the whole suite, as CI runs it, loads the
``full`` profile: every property test draws its full count (Hypothesis's default of 100 when it
names none). The fast suite (``-m "not integration"``) loads the ``fast`` profile unless
another is named with ``--hypothesis-profile``: each property test draws a quarter of its
count, and never fewer than 25. A failing example is kept in Hypothesis's example database and
replayed first by every later run, whatever the profile.
"""

from __future__ import annotations

from hypothesis import settings

#: the default count of the full profile (Hypothesis's own default)
FULL_DEFAULT = 100
#: the default count of the fast profile, and so its share of every full count
FAST_DEFAULT = 25

settings.register_profile("full", max_examples=FULL_DEFAULT)
settings.register_profile("fast", max_examples=FAST_DEFAULT)


def load(name: str) -> None:
    """Load a profile (``full`` or ``fast``) for the tests collected from now on."""
    settings.load_profile(name)


def profile() -> str:
    """The name of the loaded profile."""
    return settings.get_current_profile_name()


def share() -> float:
    """The share of each property test's full count that the loaded profile draws."""
    return min(1.0, settings.default.max_examples / FULL_DEFAULT)


def examples(full: int) -> int:
    """The examples to draw for a test whose full count is ``full``, under the loaded profile."""
    default = settings.default.max_examples
    if default >= FULL_DEFAULT:
        return full
    return max(default, full * default // FULL_DEFAULT)
