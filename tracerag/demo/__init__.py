"""The offline demo: the bundled knowledge base, ``tracerag demo`` and its scenarios."""
