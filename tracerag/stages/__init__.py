"""The six stages and the one table that orders them for a tier.

Each stage is ``async def stage(state, settings, span, config) -> output``: it reads the
``RequestState`` built so far and returns its own typed, immutable output, recorded on its span.
``steps_for`` is the stage table both front doors run; they differ only in their ``Source``:
how a request retrieves its materials and draws its samples.
"""
