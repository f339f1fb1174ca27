"""X-MOD: BERT's block (see ``bert``) whose MLP output module ends in a language adapter, a third addition to the stream.

``XmodOutput`` (the block's child ``output``, served as ``E_output``) projects the MLP's neurons, adds the stream, and runs
``lang_adapter``: each row goes through the bottleneck adapter of its
language (``lang_ids``, or the config's ``default_language``), and the
adapter's output, after the module's dropout, is added to the stream again.
So a block adds three contributions, ``attention_output``, ``mlp_output`` and
``mlp.adapter_output`` (``CONTRIBUTIONS``), and normalizes the stream
where the config says (``stream_norms``). On the released checkpoints' layout
(post-norm, ``ln_before_adapter``, the adapter reusing the MLP's norm)::

    layer_mid    == attention.output.LayerNorm(layer_input + attention_output)
    layer_output == output.LayerNorm(output.LayerNorm(layer_mid + mlp_output) + adapter_output)

With ``pre_norm`` the norms stand in front of the sublayers instead
(``attention.output.LayerNorm`` before the attention, ``output.LayerNorm``
before the MLP), and the encoder's ``LayerNorm`` is the final norm. The causal
LM must be configured ``is_decoder=True`` to attend causally.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.models.xmod import modeling_xmod as MODELING

from nnterp import POST_NORM_ATTENTION, POST_NORM_MLP, EProperty, Standard
from nnterp.forward_source import Call, ForwardSource
from nnterp.layouts import Residual
from nnterp_attention.families import bert

#: nnsight's labels of the output module's call of ``lang_adapter``, and of the dropout inside it.
LANG_ADAPTER = ForwardSource.of(MODELING.XmodOutput.forward).find(Call("self.lang_adapter")).label
DROPOUT = ForwardSource.of(MODELING.XmodOutput.lang_adapter).find(Call("self.dropout")).label


def _pre_norm(layer: Any) -> bool:
    return bool(layer._module.pre_norm)


class XmodLayer(bert.BertLayer):
    """BERT's block with the adapter's addition, post-norm or pre-norm by the config's ``pre_norm``."""

    def stream_norms(self) -> tuple[str | None, ...]:
        """The norms after the attention's, the MLP's and the adapter's additions, as the config arranges them."""
        output = self._module.output
        if not output.ln_before_adapter:
            after_mlp = None
        elif output.adapter_layer_norm is not None:
            after_mlp = "output.adapter_layer_norm"
        else:
            after_mlp = "output.LayerNorm" if output.adapter_reuse_layer_norm else None
        if _pre_norm(self):
            return (None, after_mlp, None)
        return ("attention.output.LayerNorm", after_mlp, "output.LayerNorm")

    @EProperty(
        "attention.E_output.LayerNorm.output",
        unavailable=lambda layer: None if _pre_norm(layer) else POST_NORM_ATTENTION,
    )
    def attention_norm_output(self, value: Any) -> Residual:
        """What the attention is called with: its pre-norm's output, [batch, seq, hidden_size]. Assign or edit in place."""
        return value

    @EProperty(lambda layer: "attention.output" if _pre_norm(layer) else "attention.E_output.LayerNorm.output")
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the attention and the MLP, [batch, seq, hidden_size].

        On a post-norm block the first norm's output; with ``pre_norm`` what
        the attention module returns. The MLP (through its norm, with
        ``pre_norm``) and the residual its output is added to both read it.
        Assign or edit in place.
        """
        return value

    @EProperty("E_output.LayerNorm.output", unavailable=lambda layer: None if _pre_norm(layer) else POST_NORM_MLP)
    def mlp_norm_output(self, value: Any) -> Residual:
        """The MLP's pre-norm output, [batch, seq, hidden_size]. Assign or edit in place."""
        return value


class XmodOutput(Standard):
    """The block's output module (the MLP's projection, then the adapter), its forward instrumented when built.

    The adapter's contribution is an operation inside it, read after the
    module's own children (the MLP's projection and dropout).
    """

    sourced = True


class XmodMlp(bert.BertMlp):
    """BERT's MLP, and the language adapter that the block's output module runs after it."""

    @EProperty(f"../E_output.source.{LANG_ADAPTER}.source.{DROPOUT}.output")
    def adapter_output(self, value: Any) -> Residual:
        """What the language adapter adds to the stream after the MLP's addition, [batch, seq, hidden_size].

        Each row's own language's adapter output, after the dropout. The
        forward then adds the stream to that tensor in place (``+= residual``),
        so a copy of it (with any in-place edit) takes its place, and an
        assigned tensor is copied in: what was read or written keeps its
        values. Assign or edit in place.
        """
        return value

    @adapter_output.transform
    def adapter_output(self, view: torch.Tensor, current: Any) -> torch.Tensor:
        return view.clone()

    @adapter_output.postprocess
    def adapter_output(self, value: torch.Tensor) -> torch.Tensor:
        return value.clone()


MODEL_TYPES = ("xmod",)
#: The adapter adds its output after the MLP.
CONTRIBUTIONS = (("self_attn", "attention_output"), ("mlp", "mlp_output"), ("mlp", "adapter_output"))
ENVOYS = {
    **bert.envoys_of(MODELING, "Xmod", layer=XmodLayer, mlp=XmodMlp),
    MODELING.XmodOutput: XmodOutput,
}
RENAME = {**bert.RENAME, "roberta.encoder.LayerNorm": "ln_final"}
TINY_CONFIG = dict(
    bert.TINY_CONFIG,
    languages=["en_XX", "de_DE"],
    default_language="de_DE",
)
