"""GPT-OSS: a pre-norm block whose attention has a learned sink per head and whose MLP is a mixture of experts.

The attention's softmax runs over the keys and the head's sink, whose column
is dropped before the values are mixed (``nnterp_attention.sink``). The
router picks the top-k logits and softmaxes only those; the experts take them
as ``router_indices`` and ``routing_weights``. The MLP returns
``(hidden_states, router_scores)``: ``mlp_output`` is the first.
"""

from transformers.models.gpt_oss import modeling_gpt_oss as MODELING

from nnterp import Layer, Moe, Scoring
from nnterp_attention.sink import SinkAttention


class GptOssMoe(Moe):
    """A softmax over the top-k logits alone; no shared expert."""

    SCORING = Scoring(after_top_k=True)
    INDICES = "router_indices"
    WEIGHTS = "routing_weights"


MODEL_TYPES = ("gpt_oss",)
ENVOYS = {
    MODELING.GptOssDecoderLayer: Layer,
    MODELING.GptOssAttention: SinkAttention,
    MODELING.GptOssMLP: GptOssMoe,
}
RENAME: dict = {}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=64,  # longer than the test prompts, so every pattern is the full causal one
)
