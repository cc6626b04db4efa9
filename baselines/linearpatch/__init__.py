"""LinearPatch (Chen et al., NeurIPS 2025, "A Simple Linear Patch Revives Layer-Pruned Large
Language Models"): remove a contiguous span of blocks and put one ``d × d`` patch where it
was, ``P = H·diag(s)·Hᵀ`` (a Hadamard rotation ``H`` and channel scales ``s`` measured on
calibration activations), training-free.

Modules: ``config`` (options), ``hadamard`` (Hadamard matrices of the hidden sizes in use),
``span`` (the official span criterion and the channel scales), ``replay`` (the patch layer,
one definition for the method and its fragment of the standalone remote-code loader),
``method`` (``METHOD`` for the registry: compress / rebuild), ``facts`` (its declaration).
"""
