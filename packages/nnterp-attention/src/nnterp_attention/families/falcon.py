"""Falcon: three blocks, an attention read where its forward computes it, and a block that adds into the MLP's output.

The block is pre-norm, ``self_attention`` as ``self_attn``, the MLP's
``dense_4h_to_h`` as ``down_proj`` and ``act`` as ``act_fn``. Checkpoints
use three of its shapes:

- the new decoder architecture (Falcon-40B/180B): a parallel block with a norm
  per sublayer, ``ln_attn`` and ``ln_mlp`` as ``input_layernorm`` and
  ``post_attention_layernorm``;
- ``parallel_attn`` (Falcon-7B): a parallel block with one ``input_layernorm``,
  whose output both sublayers are called with;
- sequential (Falcon-RW): ``input_layernorm``, the attention, the stream
  between them (``layer_mid``), ``post_attention_layernorm``, the MLP.

A parallel block adds the attention's output into the MLP's output tensor in
place (``mlp_output += attention_output``), so ``mlp_output`` is served so that
what is read stays the MLP's own (see ``FalconMlp``). The dropouts between the
sublayers and the stream (zero in the released configs, inactive in eval) are
not read through: in training the contributions do not add up.

The attention is served as the installed forward computes it
(``SHARED_INTERFACE``). A forward that calls transformers' attention interface
(transformers 5.25 on) is an ordinary ``Attention``: the keys and values as
the interface receives them, after the cache update, with ``num_kv_heads``
heads (the new architecture's are no longer repeated); the scores at the eager
softmax, where ALiBi comes in once, over sqrt(head_dim), through the mask the
model folds it into, so eager and sdpa compute the same attention; under sdpa
the interior is unavailable, as on every such attention.

An earlier forward computes its pattern itself and is read at its own
operations (``FalconAttention``), on the branch the config takes, rotary or
ALiBi. The queries after the rotary embedding (under ALiBi, where they are
laid out by head). The keys and values as the cache update returns them, so a
decode step's include the cached ones; they are the cache's own tensors, so an
in-place edit reaches later steps too and an assignment this call alone, and a
trace with ``use_cache=False`` makes no update and is refused them (an
``OrderError``). The new architecture repeats each key and value head for its
query group before the cache, so they come with ``num_heads`` heads
(``num_kv_heads`` says so). The scores at the softmax: under ALiBi the model
adds the bias twice, to the logits and through the mask it folds the bias
into, each time over sqrt(head_dim). The pattern after the softmax (after the
dropout, under ALiBi), the head outputs where the forward lays them out by
head. Under sdpa the forward hands the queries, keys and values to
``scaled_dot_product_attention``, which adds ALiBi once: the scores and the
pattern are unavailable, the rest are read as under eager (a trace passing
``output_attentions=True`` runs the eager arithmetic, which an sdpa load does
not read).
"""

from typing import Any

import torch
from transformers.models.falcon import modeling_falcon as MODELING

from nnterp import PARALLEL, EProperty, Mlp, TupleLayer, contribution
from nnterp.forward_source import ForwardSource
from nnterp.layouts import Residual
from nnterp_attention.attention import Attention
from nnterp_attention.generic import INTERFACE_CALL
from nnterp_attention.own_arithmetic import OwnArithmeticAttention

#: Whether the installed FalconAttention.forward calls the attention interface rather than computing its pattern itself.
SHARED_INTERFACE = bool(ForwardSource.of(MODELING.FalconAttention.forward).calls(INTERFACE_CALL))
PARALLEL_BLOCK = (
    f"{PARALLEL}; both are called with layer_input through their norms (attention_norm_output, mlp_norm_output), "
    "and the block adds both outputs at once, layer_output = layer_input + attention_output + mlp_output; read "
    "those instead"
)
FUSED = (
    "under attn_implementation='sdpa' Falcon's attention hands its queries, keys and values to torch's "
    "scaled_dot_product_attention, which computes the scores and the pattern without materializing them; load the "
    "model with attn_implementation='eager'"
)
FLASH = (
    "Falcon's attention under attn_implementation={implementation!r} runs FalconFlashAttention2's forward, which "
    "this family does not read; load the model with attn_implementation='eager' (or 'sdpa', for all but the scores "
    "and the pattern)"
)
#: The values a forward computing its pattern itself materializes under sdpa: all but the scores and the pattern.
SDPA_MATERIALIZES = ("QUERIES", "KEYS", "VALUES", "HEAD_OUTPUTS")
#: Where such a forward computes each value on the rotary branch, the ALiBi branch, and the ALiBi branch under sdpa.
ROTARY = dict(
    QUERIES="source.apply_rotary_pos_emb_0.output",
    SCORES="source.F_softmax_0.input",
    PATTERN="source.F_softmax_0.output",
    HEAD_OUTPUTS="source.attn_output_view_0.output",
)
ALIBI = dict(
    QUERIES="source.reshape_0.output",
    SCORES="source.F_softmax_1.input",
    PATTERN="attention_dropout.output",
    # The product comes out with the heads folded into the batch; _merge_heads unfolds it first.
    HEAD_OUTPUTS="source.self__merge_heads_0.source.x_view_0.output",
)
ALIBI_SDPA = dict(ALIBI, HEAD_OUTPUTS="source.torch_nn_functional_scaled_dot_product_attention_1.output")


def parallel(layer: TupleLayer) -> str | None:
    """Why this block has no stream between its sublayers, or ``None``: both Falcon-40B's and Falcon-7B's are parallel."""
    config = layer._module.config
    return PARALLEL_BLOCK if config.new_decoder_architecture or config.parallel_attn else None


class FalconLayer(TupleLayer):
    @EProperty("post_attention_layernorm.input", unavailable=parallel, shared=True)
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers of a sequential block (Falcon-RW's), [batch, seq, hidden_size].

        Assign or edit in place.
        """
        return value

    @EProperty("mlp.input")
    def mlp_norm_output(self, value: Any) -> Residual:
        """What the MLP is called with: its pre-norm's output, [batch, seq, hidden_size].

        Read where the MLP is called, after the attention on every block
        (Falcon-40B's computes both norms before the attention). On a block
        with one norm (Falcon-7B's) it is the attention's norm output: an
        assignment reaches the MLP alone, an in-place edit the tensor the
        attention has already read. Assign or edit in place.
        """
        return value


class FalconAttention(OwnArithmeticAttention):
    """A forward that computes its pattern itself, read at its own operations: the branch's, and sdpa's where it differs."""

    ELEMENTS = {"KEYS": 0, "VALUES": 1}
    KEYS = VALUES = "source.layer_past_update_0.output"
    QUERIES = property(lambda self: self.places()["QUERIES"])
    SCORES = property(lambda self: self.places()["SCORES"])
    PATTERN = property(lambda self: self.places()["PATTERN"])
    HEAD_OUTPUTS = property(lambda self: self.places()["HEAD_OUTPUTS"])

    def places(self) -> dict[str, str]:
        """Where this module's forward computes each value: its branch is the config's (rotary or ALiBi), then sdpa's."""
        config = self._module.config
        if not config.alibi:
            return ROTARY
        return ALIBI_SDPA if config._attn_implementation == "sdpa" else ALIBI

    def unmaterialized(self, place: str) -> str | None:
        implementation = self._module.config._attn_implementation
        if implementation == "sdpa":
            return None if place in SDPA_MATERIALIZES else FUSED
        return None if implementation == "eager" else FLASH.format(implementation=implementation)

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads as the scores take them: the new architecture repeats each for its group as it splits them."""
        module = self._module
        return module.num_heads if module.new_decoder_architecture else module.num_kv_heads


class FalconMlp(Mlp):
    @EProperty(contribution)
    def mlp_output(self, value: Any) -> Residual:
        """What the MLP adds to the residual stream, [batch, seq, hidden_size]: its output, the MLP's own part.

        A parallel block adds the attention's output into the MLP's output
        tensor in place, so by the end of the run ``mlp.output`` (and
        ``mlp.down_proj.output``, the same tensor) holds the two summed. Read
        here, the tensor stays the MLP's: the model goes on with a copy of it,
        in-place edits made here included, and an assigned tensor goes in as
        a copy, so the block's addition changes neither. Assign or edit in
        place.
        """
        return value

    @mlp_output.postprocess
    def mlp_output(self, value: torch.Tensor) -> torch.Tensor:
        # The block adds into what the MLP returns: an assigned tensor goes in as a copy, so the user's stays as given.
        return value.clone()

    @mlp_output.transform
    def mlp_output(self, view: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        # Once read, the model goes on with a copy, edits made here included: the block's += leaves the read tensor.
        return view.clone()


MODEL_TYPES = ("falcon",)
ENVOYS = {
    MODELING.FalconDecoderLayer: FalconLayer,
    MODELING.FalconAttention: Attention if SHARED_INTERFACE else FalconAttention,
    MODELING.FalconMLP: FalconMlp,
}
RENAME = {
    "transformer.h": "layers",
    "transformer.word_embeddings": "embed_tokens",
    "transformer.ln_f": "ln_final",
    "self_attention": "self_attn",
    "ln_attn": "input_layernorm",
    "ln_mlp": "post_attention_layernorm",
    "mlp.dense_4h_to_h": "mlp.down_proj",
    "act": "act_fn",
}
# Falcon-7B's block: parallel_attn with one norm, multi_query (one key/value head), rotary.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
)
