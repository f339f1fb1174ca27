"""XLM-RoBERTa-XL: BERT's block with pre-norms (``attention.self_attn_layer_norm``, ``LayerNorm``) and a final norm.

Its MLP's output module has no dropout: what the MLP adds is ``output.dense``'s output.
"""

from transformers.models.xlm_roberta_xl import modeling_xlm_roberta_xl as MODELING

from nnterp_attention.families import bert


class XLMRobertaXLLayer(bert.PreNormBertLayer):
    ATTENTION_NORM = "attention.self_attn_layer_norm"
    MLP_NORM = "LayerNorm"


class XLMRobertaXLMlp(bert.BertMlp):
    CONTRIBUTION = "../E_output.dense.output"


MODEL_TYPES = ("xlm-roberta-xl",)
ENVOYS = bert.envoys_of(MODELING, "XLMRobertaXL", layer=XLMRobertaXLLayer, mlp=XLMRobertaXLMlp)
RENAME = {**bert.RENAME, "roberta.encoder.LayerNorm": "ln_final"}
TINY_CONFIG = bert.TINY_CONFIG
