"""Chat models the demo runs offline without an API key: extractive (no weights) and local."""
