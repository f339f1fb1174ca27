"""BigBird: BERT's block, its attention computing its products itself (see ``bert.ClassicBertAttention``).

Before transformers 5.20 its model builds a bidirectional mask even configured ``is_decoder=True``: it
attends to later tokens there.
"""

from transformers.models.big_bird import modeling_big_bird as MODELING

from nnterp_attention.families import bert

MODEL_TYPES = ("big_bird",)
ENVOYS = bert.envoys_of(MODELING, "BigBird", attention=bert.ClassicBertAttention)
RENAME = bert.RENAME
TINY_CONFIG = dict(bert.TINY_CONFIG, attention_type="original_full")
