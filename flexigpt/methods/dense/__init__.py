"""The dense reference: the unpruned model as a registry method (``method``: identity
compression; ``facts``: its declaration)."""
