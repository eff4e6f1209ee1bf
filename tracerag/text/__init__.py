"""Chinese and English text utilities: sentences, tokens, quantities and negation."""

from tracerag.text.negation import is_negated, negation_cues
from tracerag.text.quantities import Quantity, extract_quantities, quantities_match
from tracerag.text.sentences import CITATION_MARKER_RE, Sentence, split_sentences
from tracerag.text.tokens import content_terms, tokenize

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
