"""The softmax-attention families, one module each."""
