"""The Mamba-2 families: one module each, as the plugin registry expects."""
