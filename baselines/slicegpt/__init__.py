"""SliceGPT (Ashkboos et al., ICLR 2024) re-implemented on current transformers.

Modules: ``config`` (options), ``fusion`` (norm folding → weight-free RMSN), ``pca``
(second moments, eigenbases), ``accounting`` (widths and exact parameter counts),
``modules`` (RMSN, SlicedBlock with shortcut matrices), ``rotate`` (the layer loop),
``method`` (``METHOD`` for the registry: compress / rebuild).
"""
