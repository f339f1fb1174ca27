"""The model families nnterp-rglru serves."""
