"""tracerag's version: written here once, read by the package, its spans and its metrics."""

__version__ = "0.1.0"
