"""The model families nnterp-rwkv serves."""
