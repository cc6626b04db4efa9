"""FlexiGPT's own methods, one method among the others (the baselines live in ``baselines/``).

``prune`` (Block Influence → the blocks to replace, each by a weight-shared copy of its closest
unpruned block chosen in ``base_selection``, block-specific LoRA from the SVD of the weight
difference, output feature normalisation), ``extend`` (grow a model by weight-shared
repeats), and ``export_hooks`` (what the two tell the export, the card and the decoder).
"""
