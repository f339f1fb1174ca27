"""BigBird: BERT's block, its attention computing its products itself (see ``bert.ClassicBertAttention``)."""

from transformers.models.big_bird import modeling_big_bird as MODELING

from nnterp_attention.families import bert

ATTENDS_BOTH_WAYS = bert.DECODER_ATTENDS_BOTH_WAYS
MODEL_TYPES = ("big_bird",)
ENVOYS = bert.envoys_of(MODELING, "BigBird", attention=bert.ClassicBertAttention)
RENAME = bert.RENAME
TINY_CONFIG = dict(bert.TINY_CONFIG, attention_type="original_full")
