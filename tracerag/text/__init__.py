"""Chinese and English text utilities: sentences, tokens, quantities and negation."""

from tracerag.text._negation import is_negated, negation_cues
from tracerag.text._quantities import Quantity, extract_quantities, quantities_match
from tracerag.text._sentences import CITATION_MARKER_RE, Sentence, split_sentences
from tracerag.text._tokens import content_terms, tokenize

__all__ = [
    "CITATION_MARKER_RE",
    "Quantity",
    "Sentence",
    "content_terms",
    "extract_quantities",
    "is_negated",
    "negation_cues",
    "quantities_match",
    "split_sentences",
    "tokenize",
]
