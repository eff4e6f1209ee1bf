"""Chinese and English text utilities: sentences, tokens, quantities and negation."""
