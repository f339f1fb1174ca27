"""The gated-DeltaNet hybrid families: one module each, reachable as ``nnterp.families.<name>``."""
