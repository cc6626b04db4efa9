"""Layer 6, api: one method run from the command line or Python, published.

* :mod:`flexigpt.api.compression`: :func:`~flexigpt.api.compression.compress` (load the
  dense model, check the request, compress, count, publish; ``flexigpt.compress``);
* :mod:`flexigpt.api.ratios`: the ratio rule every method inherits and the basis check;
* :mod:`flexigpt.api.values`: value checks shared with the CLI (no torch).

Import from the module that owns a name; this package imports nothing, so the CLI's value
checks load no torch.
"""
