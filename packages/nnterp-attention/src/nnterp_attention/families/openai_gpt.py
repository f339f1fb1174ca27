"""The original GPT (``openai-gpt``): a post-norm block, lists for outputs, and an attention of its own arithmetic.

``Block`` computes ``n = ln_1(x + attn(x))`` then ``ln_2(n + mlp(n))``: the
sublayers read the stream itself, so ``attention_norm_output`` and
``mlp_norm_output`` are unavailable, ``layer_mid`` is ``ln_1``'s output, and
``layer_output == ln_2(ln_1(layer_input + attention_output) + mlp_output)``
(``stream_norms``). The block and its attention return a Python list whose
first element is the hidden states; those values are read there
(``ListHead``), and a skipped block hands the model loop a one-element list.

The attention (``Attention``) computes its pattern itself and is read at its
own operations, found by what they are in the installed forward: the queries,
keys and values as the forward hands them to ``_attn``, the scores at its
softmax (scaled by ``1/sqrt(head_dim)``, the causal mask applied as ``-1e4``),
the pattern after ``attn_dropout``, the head outputs as ``merge_heads``
receives them. The forward lays the keys out transposed,
``[batch, heads, head_dim, seq]``; they are served as ``[batch, heads, seq,
head_dim]`` like every attention's, and an assignment is transposed back. The
queries, keys and values are views of pieces ``split`` cuts from one
``c_attn`` output, which torch refuses to edit in place while the graph
records gradients: assign them. The model keeps no cache: every generation
step runs the whole sequence again.
"""

from typing import Any

import torch
from transformers.models.openai import modeling_openai as MODELING

from nnterp import POST_NORM_ATTENTION, POST_NORM_MLP, EProperty, Layer, Mlp, unavailable
from nnterp.forward_source import Call, ForwardSource
from nnterp.layouts import Keys, Neurons, Residual
from nnterp_attention.own_arithmetic import OwnArithmeticAttention

#: nnsight's labels, in this transformers, of the calls of ``_attn`` and ``merge_heads`` and of ``_attn``'s softmax.
ATTN = ForwardSource.of(MODELING.Attention.forward).find(Call("self._attn")).label
MERGE = ForwardSource.of(MODELING.Attention.forward).find(Call("self.merge_heads")).label
SOFTMAX = ForwardSource.of(MODELING.Attention._attn).find(Call("nn.functional.softmax")).label


class ListHead(EProperty):
    """A value that is the first element of a list a module returns: served as that element, put back in its place."""

    def _rows(self, obj: Any, element: Any) -> Any:
        return element[0] if isinstance(element, list) else element

    def _whole(self, obj: Any, current: Any, value: Any) -> Any:
        return [value, *current[1:]] if isinstance(current, list) else value


def _first_of_list(cls: type, *names: str) -> None:
    for name in names:
        value = cls.values()[name]
        setattr(cls, name, value.laid_out(value.layout, kind=ListHead))


class OpenAIGPTLayer(Layer):
    def stream_norms(self) -> tuple[str, str]:
        """The norms of the stream right after each addition."""
        return ("ln_1", "ln_2")

    attention_norm_output = unavailable(POST_NORM_ATTENTION)
    mlp_norm_output = unavailable(POST_NORM_MLP)

    @EProperty("ln_1.output")
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers, [batch, seq, hidden_size]: the first norm's output.

        The MLP reads it and adds its output to it. Assign or edit in place.
        """
        return value

    def skip(self, hidden: Any) -> None:
        """Skip this block: it does not run, and ``hidden`` takes the place of its ``layer_output``, in a list as it returns it."""
        super().skip([hidden])


class OpenAIGPTAttention(OwnArithmeticAttention):
    QUERIES = f"source.{ATTN}.inputs"
    KEYS = f"source.{ATTN}.inputs"
    VALUES = f"source.{ATTN}.inputs"
    SCORES = f"source.{ATTN}.source.{SOFTMAX}.input"
    PATTERN = "attn_dropout.output"
    HEAD_OUTPUTS = f"source.{MERGE}.inputs"
    ELEMENTS = {"QUERIES": 0, "KEYS": 1, "VALUES": 2, "HEAD_OUTPUTS": 0}

    @property
    def head_dim(self) -> int:
        """Width of one head: the module's width (``split_size``) over its heads; it holds no config."""
        return self._module.split_size // self.num_heads

    @EProperty(KEYS, select=1)
    def attention_keys(self, value: Any) -> Keys:
        """The keys the scores are computed with, [batch, num_kv_heads, seq, qk_head_dim].

        The forward holds them transposed, ``[batch, heads, head_dim, seq]``;
        this is a view of that tensor. Assign to replace them (an in-place
        edit is refused, see the family).
        """
        return value.transpose(-1, -2)

    @attention_keys.postprocess
    def attention_keys(self, value: torch.Tensor) -> torch.Tensor:
        return value.transpose(-1, -2)


class OpenAIGPTMlp(Mlp):
    """GPT's MLP, whose activation is one module shared by every block of every model (``ACT_FNS``).

    Its output cannot tell the blocks apart, so ``mlp_activation`` is read
    where this block's projection receives it, as ``mlp_neurons`` is.
    """

    @EProperty("down_proj.input")
    def mlp_activation(self, value: Any) -> Neurons:
        """The activation's output, [batch, seq, intermediate_size]: what ``c_proj`` sums. Assign or edit in place."""
        return value


_first_of_list(OpenAIGPTLayer, "layer_output")
_first_of_list(OpenAIGPTAttention, "attention_output")

MODEL_TYPES = ("openai-gpt",)
ENVOYS = {
    MODELING.Block: OpenAIGPTLayer,
    MODELING.Attention: OpenAIGPTAttention,
    MODELING.MLP: OpenAIGPTMlp,
}
RENAME = {
    "transformer.h": "layers",
    "transformer.tokens_embed": "embed_tokens",
    "attn": "self_attn",
    "mlp.c_proj": "mlp.down_proj",
}
TINY_CONFIG = dict(
    vocab_size=64,
    n_embd=32,
    n_layer=2,
    n_head=4,
    n_positions=64,
)
