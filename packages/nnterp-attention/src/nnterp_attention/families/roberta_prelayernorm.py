"""RoBERTa-PreLayerNorm: BERT's block with pre-norms, the MLP's inside it (``intermediate.LayerNorm``), and a final norm."""

from transformers.models.roberta_prelayernorm import modeling_roberta_prelayernorm as MODELING

from nnterp_attention.families import bert


class RobertaPreLayerNormLayer(bert.PreNormBertLayer):
    ATTENTION_NORM = "attention.LayerNorm"
    MLP_NORM = "mlp.LayerNorm"


MODEL_TYPES = ("roberta-prelayernorm",)
ENVOYS = bert.envoys_of(MODELING, "RobertaPreLayerNorm", layer=RobertaPreLayerNormLayer)
RENAME = {**bert.RENAME, "roberta_prelayernorm.LayerNorm": "ln_final"}
TINY_CONFIG = bert.TINY_CONFIG
