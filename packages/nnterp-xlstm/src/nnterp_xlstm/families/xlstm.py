"""xLSTM (NX-AI's xLSTM-7b): pre-norm blocks of an mLSTM layer and a gated feed-forward.

``backbone.blocks.i`` holds ``norm_mlstm``, ``mlstm_layer``, ``norm_ffn`` and
``ffn``; the mLSTM layer is standardized to ``linear_attn``. The tiny config
keeps ``hidden_size * qk_dim_factor`` a multiple of 64, as the cache rounds
its state's widths up to one, and prompts shorter than ``chunk_size``, so
they run the recurrent sequence kernel.
"""

from transformers.models.xlstm import modeling_xlstm as MODELING

from nnterp import Mlp
from nnterp_xlstm.blocks import MatrixMemoryBlock
from nnterp_xlstm.matrix_memory import MatrixMemory

MODEL_TYPES = ("xlstm",)
ENVOYS = {
    MODELING.xLSTMBlock: MatrixMemoryBlock,
    MODELING.xLSTMLayer: MatrixMemory,
    MODELING.xLSTMFeedForward: Mlp,
}
RENAME = {
    "backbone.blocks": "layers",
    "backbone.embeddings": "embed_tokens",
    "backbone.out_norm": "ln_final",
    "mlstm_layer": "linear_attn",
    "norm_mlstm": "input_layernorm",
    "norm_ffn": "post_attention_layernorm",
    "ffn": "mlp",
    "proj_down": "down_proj",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    num_heads=4,
    num_hidden_layers=2,
    qk_dim_factor=2.0,
    v_dim_factor=2.0,
    chunk_size=64,
    autocast_kernel_dtype="float32",
)
