"""The signals behind confidence: citations, support, self-consistency, rules, attribution."""
