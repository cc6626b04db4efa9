"""FlexiGPT's own methods (pruning, extension) and the dense reference."""
