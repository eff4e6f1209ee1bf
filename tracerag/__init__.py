"""tracerag: traced, verified retrieval-augmented generation for LangChain."""

__version__ = "0.1.0"
