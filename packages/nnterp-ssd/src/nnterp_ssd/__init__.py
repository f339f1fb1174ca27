"""nnterp-ssd: the Mamba-2 (SSD) mixer, ``StateSpace``, and its families.

Mamba-2, Nemotron-H, Bamba, Falcon-H1, Zamba2 and GraniteMoeHybrid run a
Mamba-2 mixer; this plugin serves its values under the standard names
(``layers[i].linear_attn.states``, ``...betas``) and adds
``nnterp.chunk_per_token``, which makes the chunk scan keep the state after
every token.
"""

from .state_space import NO_STATE_OCCURRENCES, NO_STATE_WRITES, StateSpace, chunk_per_token, needs_per_token_chunks

__all__ = ["NO_STATE_OCCURRENCES", "NO_STATE_WRITES", "StateSpace", "chunk_per_token", "needs_per_token_chunks"]
