"""The six stages. Each is ``async def stage(ctx, settings, span, config) -> ctx``: it reads what
earlier stages put in the RequestContext, adds its own part, and records it on its span."""
