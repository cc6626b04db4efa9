"""Layer 2, storage: what a saved model is.

The typed manifest (``manifest``), the structure a manifest describes (``structure``),
save/load of a compressed checkpoint (``artifacts``), checksummed input files
(``input_files``), dense-model loading and the model-family adapters (``models``: the only code
that knows a family's attribute names), and the method registry (``registry``).
"""
