"""The gated short-convolution families, one module per model type."""
