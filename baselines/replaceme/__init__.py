"""ReplaceMe (Shopkhoev et al., NeurIPS 2025; arXiv 2505.02819): training-free depth pruning.

A contiguous span of blocks is removed and replaced by one linear map ``T [d, d]`` estimated
on calibration activations (closed-form least squares, or a cosine objective optimised with
Adam), folded into the MLP output projection of the block before the span: the result is a
stock architecture with fewer blocks and no added parameters.

Modules: ``config`` (options), ``span`` (angular distances, span choice), ``transform``
(activation statistics, the least-squares and cosine estimates, folding), ``method``
(``METHOD`` for the registry: compress / rebuild).
"""
