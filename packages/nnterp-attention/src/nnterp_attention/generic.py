"""The generic family: a model type no plugin names, served from the layout of its blocks.

When no family claims a config's ``model_type``, the registry asks the
plugins to recognize it (``nnterp_generic_family``). This plugin builds the
model on the meta device (no weights, no memory), finds its decoder blocks,
reads each block's layout off its forward (``block_layout``), and, when the
blocks are a softmax attention and an MLP added to the residual stream in a
layout it knows (pre-norm, parallel, with a norm after a sublayer, scaled by
a number the block holds), builds a family module for that model type: the
standard envoys keyed on the model's own classes, the block's values keyed on
the norms the layout names in the block's own spelling, and the standard
names ``layers``, ``self_attn``, ``mlp``, ``embed_tokens``, ``ln_final`` and
``lm_head`` aliased to the model's modules. The attention's interior values
are served where its forward calls transformers' shared attention interface
and the eager function behind it is the standard one, and are unavailable
with the reason where not.

A generic family says so: its ``GENERIC`` is the recognized layout, which
``StandardizedTransformer``'s repr, ``support()`` and ``nnterp plugins`` show.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any, ClassVar

import torch

from nnterp import PARALLEL, POST_NORM_ATTENTION, POST_NORM_MLP, EProperty, Layer, Mlp, TupleLayer
from nnterp.analysis.lens import called_after_blocks
from nnterp.forward_source import ForwardSource
from nnterp.layouts import Neurons, Residual
from nnterp.registry import Unrecognized
from nnterp.testing.shrink import tiny_overrides

from .attention import OUTPUT_PROJECTIONS, Attention
from .block_layout import BlockLayout, describe_layout, is_norm, read_layout
from .scaled import ScaledAttention, ScaledMlp

#: Why an attention's interior is out of reach when its forward does not call the shared interface.
OWN_ATTENTION = (
    "read inside transformers' shared attention interface, which {name}.forward does not call (it computes "
    "its attention itself); a family for this model type can read it at the module's own operations"
)
#: Why it is out of reach when the model's eager attention function computes its pattern otherwise.
OWN_EAGER = (
    "read inside the eager attention function, and {function} computes its pattern otherwise than "
    "transformers' standard one (an attention sink, another softmax); a family for this model type says where "
    "these values are read"
)
#: Why it is out of reach when the attention has no output projection to read its head sizes against.
OWN_HEADS = (
    "read inside the attention, whose heads {name} arranges its own way (it has no output projection, "
    "{projections}, to read their sizes against); a family for this model type says how its heads are laid out"
)
#: The attention interface call the standard Attention reads its interior at.
INTERFACE_CALL = "attention_interface"


def _norm(role: str, end: str):
    return lambda layer: f"{getattr(layer.LAYOUT, role)}.{end}"


def _without(role: str, reason: str):
    return lambda layer: reason if getattr(layer.LAYOUT, role) is None else None


def _layer_mid(layer: Layer) -> str:
    layout = layer.LAYOUT
    if layout.attention_stream_norm is not None:
        return f"{layout.attention_stream_norm}.output"
    if layout.mlp_norm is not None:
        return f"{layout.mlp_norm}.input"
    return f"{layout.mlp_entry or 'mlp'}.input"


class GenericLayer(Layer):
    """A recognized block: the boundary values keyed on the norms its ``LAYOUT`` names, in the block's own spelling.

    A family's subclass sets ``LAYOUT``. A norm a layout lacks makes the value
    read at it unavailable with the reason (a block whose sublayers read the
    stream itself has no pre-norm outputs; a parallel block has no stream
    between its sublayers).
    """

    LAYOUT: ClassVar[BlockLayout]

    def stream_norms(self) -> tuple[str | None, ...]:
        """A post-norm block's norms of the stream after each addition; empty on every other layout."""
        norms = (self.LAYOUT.attention_stream_norm, self.LAYOUT.mlp_stream_norm)
        return norms if any(norms) else ()

    @EProperty(_norm("attention_norm", "output"), unavailable=_without("attention_norm", POST_NORM_ATTENTION))
    def attention_norm_output(self, value: Any) -> Residual:
        """What the attention is called with: its pre-norm's output, [batch, seq, hidden_size]. Assign or edit in place."""
        return value

    @EProperty(_layer_mid, unavailable=lambda layer: PARALLEL if layer.LAYOUT.parallel else None, shared=True)
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers, [batch, seq, hidden_size].

        What the MLP's pre-norm (or, without one, the MLP) is called with.
        Assign or edit in place.
        """
        return value

    @EProperty(lambda layer: f"{layer.LAYOUT.mlp_entry or 'mlp'}.input")
    def mlp_input(self, value: Any) -> Residual:
        """What the MLP is called with (its first projection's input where the block spells it out), [batch, seq, hidden_size].

        Assign or edit in place.
        """
        return value

    @EProperty(_norm("mlp_norm", "output"), unavailable=_without("mlp_norm", POST_NORM_MLP))
    def mlp_norm_output(self, value: Any) -> Residual:
        """The MLP's pre-norm output, [batch, seq, hidden_size]; on a block with one shared norm, the attention's.

        Assign or edit in place.
        """
        return value


def scaled(sublayer: type, scaled_base: type, scale: str | None) -> type:
    """``sublayer``, its contribution multiplied by the block's attribute ``scale`` where there is one."""
    if scale is None:
        return sublayer
    return type(sublayer.__name__, (scaled_base, sublayer), {"__module__": __name__, "SCALE": scale})


NO_ACTIVATION_MODULE = (
    "the block calls no activation module between its MLP's projections; read mlp_neurons, the last projection's input"
)


class UnpackedMlp(Mlp):
    """An MLP a block spells out in its own children (BART's ``fc1``, ``activation_fn``, ``fc2``), at its last projection.

    ``layers[i].mlp`` is that projection, whose output is what the block adds
    and whose input is the neurons; ``ACTIVATION`` names the block's activation
    module, whose output is ``mlp_activation``.
    """

    ACTIVATION: ClassVar[str | None]

    @property
    def intermediate_size(self) -> int:
        """Width of the MLP's hidden layer: the last projection's input width."""
        return self._module.in_features

    @EProperty(
        lambda mlp: f"../{mlp.ACTIVATION}.output",
        unavailable=lambda mlp: NO_ACTIVATION_MODULE if mlp.ACTIVATION is None else None,
    )
    def mlp_activation(self, value: Any) -> Neurons:
        """The activation's output, [batch, seq, intermediate_size]. Assign or edit in place."""
        return value

    @EProperty("input")
    def mlp_neurons(self, value: Any) -> Neurons:
        """The neurons the last projection sums, [batch, seq, intermediate_size]. Assign or edit in place."""
        return value


def generic_family(config: Any) -> ModuleType | Unrecognized | None:
    """The generic family of ``config``'s model, or :class:`Unrecognized` saying why its blocks are not served.

    ``None`` for a config with no causal language model in the installed
    transformers. Built once per distinct config.
    """
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return None
    key = (config.model_type, config.to_json_string(use_diff=True))
    if key not in BUILT:
        try:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
            if model.config.model_type not in (config.model_type, *MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
                raise Unrecognized(
                    f"its causal LM is configured by its text model's config, of type {model.config.model_type!r}, "
                    f"which transformers' causal-LM mapping does not name"
                )
            BUILT[key] = build_family(config.model_type, model)
        except Unrecognized as error:
            BUILT[key] = error
        except Exception as error:
            BUILT[key] = Unrecognized(
                f"its model could not be built on the meta device to read it: {type(error).__name__}: {error}"
            )
    return BUILT[key]


#: The families (or the reasons there is none) built so far, by model type and config.
BUILT: dict[tuple[str, str], ModuleType | Unrecognized] = {}


def build_family(model_type: str, model: torch.nn.Module) -> ModuleType:
    """A family module for ``model_type`` from a built ``model`` (meta weights do), or raise :class:`Unrecognized`."""
    layers_path, blocks = find_blocks(model)
    layouts = {read_layout(block) for block in blocks}
    if len(layouts) != 1:
        raise Unrecognized(f"its blocks differ in layout ({len(layouts)} layouts), which a generic family cannot name")
    (layout,) = layouts
    names = dict(model.named_modules())
    attentions = {
        type(module): module for module in (names[f"{layers_path}.{i}.{layout.attention}"] for i in range(len(blocks)))
    }
    mlp_classes = {type(names[f"{layers_path}.{i}.{layout.mlp}"]) for i in range(len(blocks))}
    attention = scaled(attention_envoy(list(attentions.values()), layout), ScaledAttention, layout.attention_scale)
    if layout.mlp_entry is None:
        mlp = Mlp
    else:
        unpacked = {"__module__": __name__, "ACTIVATION": layout.mlp_activation}
        mlp = type("UnpackedMlp", (UnpackedMlp,), unpacked)
    mlp = mlp if layout.mlp_post_norm is None else contributing(mlp, layout.mlp_post_norm)
    mlp = scaled(mlp, ScaledMlp, layout.mlp_scale)
    bases = (GenericLayer, TupleLayer) if layout.returned else (GenericLayer,)
    layer = type("GenericLayer", bases, {"__module__": __name__, "LAYOUT": layout, "RETURNED": layout.returned})
    envoys: dict = dict.fromkeys({type(block) for block in blocks}, layer)
    envoys.update(dict.fromkeys(attentions, attention))
    # An unpacked MLP's last projection is a plain Linear, so it is keyed by its name in the block, not its class.
    envoys.update(dict.fromkeys(mlp_classes if layout.mlp_entry is None else [layout.mlp], mlp))
    rename = {
        **model_rename(model, layers_path),
        **{name: alias for name, alias in ((layout.attention, "self_attn"), (layout.mlp, "mlp")) if name != alias},
    }
    # One family per model type and layout, so two loads of one checkpoint share it (as a named family is shared).
    identity = (model_type, layout, tuple(sorted(rename.items())))
    if identity not in FAMILIES:
        family = ModuleType(
            f"{__name__}.{model_type}", f"The generic family of {model_type!r}: {describe_layout(layout)}."
        )
        family.MODEL_TYPES = (model_type,)
        family.ENVOYS = envoys
        family.RENAME = rename
        family.TINY_CONFIG = tiny_overrides(model_type)
        family.GENERIC = describe_layout(layout)
        FAMILIES[identity] = family
    return FAMILIES[identity]


#: The generic families built, by model type, layout and aliases.
FAMILIES: dict[tuple, ModuleType] = {}


def find_blocks(model: torch.nn.Module) -> tuple[str, list[torch.nn.Module]]:
    """The path of the model's decoder blocks and the blocks: the module list as long as the config's layer count."""
    config = model.config.get_text_config()
    # A decoder-only model of an encoder-decoder family (BART's ForCausalLM) counts its blocks as decoder_layers.
    count = getattr(config, "decoder_layers", None) or getattr(config, "num_hidden_layers", None)
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count and count:
            return path, list(module)
    raise Unrecognized(f"no module list holds its {count} decoder blocks")


def model_rename(model: torch.nn.Module, layers_path: str) -> dict[str, str]:
    """Aliases of the model's own paths to the standard ``layers``, ``embed_tokens``, ``ln_final`` and ``lm_head``."""
    paths = {id(module): path for path, module in model.named_modules()}
    rename = {layers_path: "layers"}
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    if embeddings is not None:
        rename[paths[id(embeddings)]] = "embed_tokens"
    if head is not None and paths[id(head)] != "lm_head":
        rename[paths[id(head)]] = "lm_head"
    backbone_path, _, blocks = layers_path.rpartition(".")
    backbone = model.get_submodule(backbone_path)
    # the final norm runs after the blocks: not an embedding norm before them (BART's layernorm_embedding)
    after = called_after_blocks(type(backbone), blocks)
    norms = [name for name, child in backbone.named_children() if is_norm(child) and (after is None or name in after)]
    if len(norms) == 1:
        rename[f"{backbone_path}.{norms[0]}" if backbone_path else norms[0]] = "ln_final"
    return {path: alias for path, alias in rename.items() if path != alias}


def attention_envoy(modules: list[torch.nn.Module], layout: BlockLayout) -> type[Attention]:
    """An Attention whose contribution is read after its post-norm, if any, and whose interior says where it is."""
    attention = Attention if layout.attention_post_norm is None else contributing(Attention, layout.attention_post_norm)
    reasons = sorted(filter(None, (interior_reason(module) for module in modules)))
    if not reasons:
        return attention
    reason = reasons[0]
    return type("GenericAttention", (attention,), {"__module__": __name__, "off_interface": lambda self: reason})


def interior_reason(module: torch.nn.Module) -> str | None:
    """Why the standard Attention cannot read ``module``'s interior, or ``None`` when it can.

    It can when the forward calls the attention interface and the eager
    function it falls back to (its modeling module's
    ``eager_attention_forward``) has the standard's operations: one
    ``nn.functional.softmax`` of the scores, then one ``nn.functional.dropout``,
    and nothing concatenated to the scores (an attention sink); and when the
    module has an output projection, against which its head sizes are read.
    """
    cls = type(module)
    if not any(hasattr(module, name) for name in OUTPUT_PROJECTIONS):
        return OWN_HEADS.format(name=cls.__name__, projections=", ".join(OUTPUT_PROJECTIONS))
    if not ForwardSource.of(cls.forward).calls(INTERFACE_CALL):
        return OWN_ATTENTION.format(name=cls.__name__)
    eager = getattr(inspect.getmodule(cls), "eager_attention_forward", None)
    if eager is None:
        return OWN_EAGER.format(function=f"{cls.__module__} (which has no eager_attention_forward)")
    operations = [operation.called for operation in ForwardSource.of(eager).operations]
    standard = operations.count("nn.functional.softmax") == 1 and operations.count("nn.functional.dropout") == 1
    if not standard or "torch.cat" in operations:
        return OWN_EAGER.format(function=f"{cls.__module__}.eager_attention_forward")
    return None


def contributing(sublayer: type, post_norm: str) -> type:
    """``sublayer`` whose contribution is read after the block's ``post_norm``, what the block adds to the stream."""
    return type(
        f"PostNorm{sublayer.__name__}", (sublayer,), {"__module__": __name__, "CONTRIBUTION": f"../{post_norm}.output"}
    )
