"""The Mamba-1 families: Mamba, Falcon-Mamba and Jamba."""
