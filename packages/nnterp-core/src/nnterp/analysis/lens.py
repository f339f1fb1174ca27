"""Lenses and steering: the model's own head on any residual stream, and a vector added to a standard value.

``unembed`` applies what follows the last block in the model's forward to a residual-stream
tensor: the final norm (``ln_final``), the unembedding (``lm_head``), and what the root forward
does to the head's output before it returns logits (Gemma-2's soft-capping, Cohere's logit
scale, Granite's logits scaling, ...). Those last transforms are facts about transformers'
forwards, kept as data in :data:`HEAD_TRANSFORMS`, keyed on the config attribute that holds each
number; a head the table cannot express raises :class:`~nnterp.Unavailable` rather than give
other logits than the model's. ``logit_lens`` is ``unembed`` of chosen blocks' outputs at chosen
positions, and ``steer`` is ``value[:, positions] += vector`` on a standard value, checked first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from nnsight.intervention.source import SourceNotAvailable
from torch import Tensor

from ..availability import Unavailable
from ..components.standard import axis_size
from ..descriptor import DerivedEProperty, EProperty
from ..family import declared
from ..forward_source import ForwardSource
from ..positions import Positions, select_indices


@dataclass(frozen=True)
class HeadTransform:
    """One operation the root forward applies around the head, with the number a config attribute holds.

    ``operation`` is ``"softcap"`` (``tanh(x / c) * c``), ``"multiply"`` or
    ``"divide"``; ``stage`` is ``"logits"`` (on the head's output) or
    ``"hidden"`` (on the normalized stream, before the head). A row with
    ``model_types`` applies to those types only, and is listed before a row of
    the same attribute for every other type.
    """

    attribute: str
    operation: Literal["softcap", "multiply", "divide"]
    stage: Literal["hidden", "logits"] = "logits"
    model_types: tuple[str, ...] = ()

    def apply(self, tensor: Tensor, number: float) -> Tensor:
        if self.operation == "softcap":
            return torch.tanh(tensor / number) * number
        if self.operation == "multiply":
            return tensor * number
        return tensor / number


#: What transformers' causal-LM forwards do around the head, keyed on the config attribute holding
#: the number (first row of an attribute that matches the model type wins). A row applies where the
#: config's value is not ``None`` and the root forward reads the attribute: MPT's config carries a
#: ``logit_scale`` its forward ignores.
HEAD_TRANSFORMS: tuple[HeadTransform, ...] = (
    # gemma2, gemma3_text, gemma3n, gemma4_text, vaultgemma, nanochat, beam
    HeadTransform("final_logit_softcapping", "softcap"),
    HeadTransform("logits_soft_cap", "softcap"),  # recurrent_gemma
    HeadTransform("output_logit_soft_cap", "softcap"),  # xlstm
    HeadTransform("logit_scale", "multiply"),  # cohere, cohere2, cohere2_moe, cohere_compass_text
    HeadTransform("logits_scaling", "multiply", model_types=("hyperclovax",)),  # MuP: multiplies, where granite divides
    # minicpm3 divides the stream before the head (the same, but for rounding, as dividing its logits)
    HeadTransform("logits_scaling", "divide", stage="hidden", model_types=("minicpm3",)),
    HeadTransform("logits_scaling", "divide"),  # granite, granite_swa, granitemoe(_swa, shared, hybrid)
    HeadTransform("lm_head_multiplier", "multiply"),  # falcon_h1
)

#: Model types whose forward does something to the head's output the table cannot express, and what.
HEAD_UNAVAILABLE: dict[str, str] = {
    "inkling_text": "its forward cuts the logits to an unpadded vocabulary after the head",
    "inkling2_text": "its forward soft-caps the logits with a module of its own (logit_softcap)",
    "inkling2_loop_text": "its forward soft-caps the logits with a module of its own (logit_softcap)",
    "gemma4_assistant": "its head reads a masked embedding of the stream, not the stream",
    "gemma4_unified_assistant": "its head reads a masked embedding of the stream, not the stream",
    "cpmant": (
        "its blocks run on learned prompt tokens put before the input, which the model drops after its final norm, "
        "so a block's positions are not the tokens the logits are for"
    ),
    "musicgen": "it has one head per codebook",
    "musicgen_melody": "it has one head per codebook",
    "prophetnet": (
        "its blocks carry the main stream and its n-gram streams one after another along the sequence axis, and its "
        "logits are the first n-gram stream's, so a block's positions are not the tokens the logits are for"
    ),
}


def _forward_source(cls: type) -> ForwardSource | None:
    try:
        return ForwardSource.of(cls.forward)
    except (SourceNotAvailable, OSError, TypeError, SyntaxError):
        return None


def called_after_blocks(cls: type, blocks: str) -> tuple[str, ...] | None:
    """The attributes of ``self`` that ``cls.forward`` calls after its loop over ``self.<blocks>``, in running order.

    ``None`` when the forward's source cannot be read or holds no such loop.
    """
    source = _forward_source(cls)
    return None if source is None else source.called_after_loop(blocks)


def _model_types(model: Any) -> tuple[str, ...]:
    """The model types of the model's config and of its text config, where it has one of its own."""
    config = model._module.config
    configs = (config, getattr(config, "text_config", None) or config)
    return tuple(dict.fromkeys(getattr(c, "model_type", "") for c in configs))


@dataclass(frozen=True)
class Head:
    """What a model's forward does to its last block's output to return logits; :func:`head` finds it.

    ``final`` are the modules its blocks' parent calls on the stream after
    the blocks (the final norm; Qwen4-exp's hyper-connection mixer; none on a
    post-norm model such as BERT) and any final norm the family names outside
    it; ``unembedding`` the modules giving the logits (``lm_head``, or the
    family's ``HEAD``); ``transforms`` the rows of :data:`HEAD_TRANSFORMS` the
    root forward applies, each with its number; ``laid_back`` the blocks'
    ``layer_output`` write conversion, turning the served stream into the
    model's tensor (Qwen4-exp's streams laid side by side), or ``None``.
    """

    final: tuple[Any, ...]
    unembedding: tuple[Any, ...]
    transforms: tuple[tuple[HeadTransform, float], ...]
    laid_back: Any


def head(model: Any) -> Head:
    """How ``model``'s forward turns its last block's output into logits, found once per model.

    The modules come from the family where it declares ``HEAD`` (the paths
    from the model's root of what its causal-LM forward applies to the last
    block's output, ELECTRA's ``("generator_predictions",
    "generator_lm_head")``). Otherwise the final modules are read off the
    forward of the blocks' parent, those it calls after its loop over the
    blocks, and the unembedding is ``lm_head``; ``ln_final``, where the family
    names one outside that parent, follows the final modules (RoBERTa with
    pre-layer-norm applies its norm in the model around the encoder). An
    ``ln_final`` the parent calls before its blocks is not final (BART's
    ``layernorm_embedding``) and is left out.

    Raises:
        nnterp.Unavailable: the head does what :data:`HEAD_TRANSFORMS` cannot
            express (:data:`HEAD_UNAVAILABLE`), the config holds a number of
            the table and the root forward's source cannot be read, or the
            blocks' parent's forward cannot be read for what follows the
            blocks; each names the model type and why.
    """
    found = model.__dict__.get("_lens_head")
    if found is not None:
        return found
    root = model._module
    types = _model_types(model)
    for model_type in types:
        if model_type in HEAD_UNAVAILABLE:
            raise Unavailable(f"unembed on a {model_type} model: {HEAD_UNAVAILABLE[model_type]}")
    envoys = {id(envoy._module): envoy for envoy in model.modules()}
    head = declared(model.family).HEAD
    if head is not None:
        final, unembedding = (), tuple(envoys[id(root.get_submodule(path))] for path in head)
    else:
        paths = {id(module): path for path, module in root.named_modules()}
        parent_path, _, blocks = paths[id(model.layers._module)].rpartition(".")
        parent = root.get_submodule(parent_path)
        called = called_after_blocks(type(parent), blocks)
        if called is None:
            raise Unavailable(
                f"unembed on a {types[0]} model: {type(parent).__name__}.forward, which runs its blocks, has no "
                f"readable loop over self.{blocks}, so what it applies after them (a final norm) is unknown; a family "
                "can name its head's modules in HEAD"
            )
        # an attribute the parent lacks is never called on a forward that runs: a branch this config does not take
        # (X-MOD's final LayerNorm, built with pre_norm only)
        called = [name for name in called if hasattr(parent, name)]
        # a method, or a list of modules the forward indexes (Gemma-3n's per-stream projections), is no one module
        # applied to the stream
        methods = [
            name
            for name in called
            if not isinstance(getattr(parent, name), torch.nn.Module)
            or isinstance(getattr(parent, name), (torch.nn.ModuleList, torch.nn.ModuleDict))
        ]
        if methods:
            raise Unavailable(
                f"unembed on a {types[0]} model: after its blocks {type(parent).__name__}.forward calls "
                f"{', '.join(f'self.{name}' for name in methods)}, which may change the stream; a family can name its "
                "head's modules in HEAD"
            )
        modules = [getattr(parent, name) for name in called]
        norm = getattr(model, "ln_final", None)
        if norm is not None and not any(norm._module is module for module in parent.modules()):
            modules.append(norm._module)
        final = tuple(envoys[id(module)] for module in modules)
        unembedding = (model.lm_head,)
    served = getattr(type(model.layers[-1]), "layer_output", None)
    laid_back = getattr(served, "_postprocess", None)
    found = Head(final, unembedding, tuple(head_transforms(model)), laid_back)
    object.__setattr__(model, "_lens_head", found)  # the envoys stay the model's through dispatch and reloads
    return found


def head_transforms(model: Any) -> list[tuple[HeadTransform, float]]:
    """The rows of :data:`HEAD_TRANSFORMS` ``model``'s root forward applies, each with its number, in table order.

    Raises:
        nnterp.Unavailable: its config holds a number of the table and the
            root forward's source cannot be read to tell whether it is used.
    """
    types = _model_types(model)
    root, text = model._module.config, model.text_config
    source = _forward_source(type(model._module))
    found: list[tuple[HeadTransform, float]] = []
    seen: set[str] = set()
    for row in HEAD_TRANSFORMS:
        if row.attribute in seen or (row.model_types and not set(row.model_types) & set(types)):
            continue
        number = getattr(text, row.attribute, None)
        number = getattr(root, row.attribute, None) if number is None else number
        if number is None:
            continue
        seen.add(row.attribute)
        if source is None:
            raise Unavailable(
                f"unembed on a {types[0]} model: its config sets {row.attribute}={number!r}, and the source of "
                f"{type(model._module).__name__}.forward, which says whether it is applied, cannot be read"
            )
        if source.reads(row.attribute):
            found.append((row, float(number)))
    return found


def unembed(model: Any, hidden: Tensor) -> Tensor:
    """The logits the model's own head gives for a residual-stream tensor: final norm, unembedding, and what follows.

    ``hidden`` is the residual stream as ``layers[i].layer_output`` serves it,
    ``[batch, seq, hidden_size]`` or any leading axes (``[..., streams,
    hidden_size]`` on a model with several streams); the result is
    ``[..., vocab_size]`` in the head's dtype, what the model's forward would
    return as logits had its last block output ``hidden``: the modules it
    applies after its blocks (``model.ln_final``), the unembedding
    (``model.lm_head``), and the root forward's transforms of the logits
    (:data:`HEAD_TRANSFORMS`); :func:`head` says which. Inside a trace the
    modules run ad hoc, away from their place in the forward (they serve no
    values and the forward's own call is untouched); outside one it is a
    plain computation::

        with model.trace(prompt):
            logits = unembed(model, model.layers[5].layer_output[:, -1:]).save()   # [batch, 1, vocab_size]

    Select the positions you need before unembedding: the result has the
    vocabulary's width at every position of ``hidden``.

    Raises:
        nnterp.Unavailable: the model's head cannot be applied exactly, naming
            the model type and why (see :func:`head`).
    """
    found = head(model)
    stream = hidden if found.laid_back is None else found.laid_back(model.layers[-1], hidden)
    for module in found.final:
        stream = module(stream)
    for row, number in found.transforms:
        if row.stage == "hidden":
            stream = row.apply(stream, number)
    first = next((p for p in found.unembedding[0]._module.parameters() if p.is_floating_point()), None)
    if first is not None:
        stream = stream.to(first.dtype)
    for module in found.unembedding:
        stream = module(stream)
    for row, number in found.transforms:
        if row.stage == "logits":
            stream = row.apply(stream, number)
    return stream


def logit_lens(model: Any, layers: Positions = None, positions: Positions = None) -> Tensor:
    """The logit lens: the model's head applied to chosen blocks' outputs at chosen positions, in float32.

    Call it inside a trace (or on a step of ``tracer.iter`` during
    ``generate``). It reads ``model.layers[i].layer_output`` for each asked
    block, in forward order, keeps the asked ``positions`` of it, then
    :func:`unembed` s each. The result is
    ``[layers, batch, positions, vocab_size]`` as ``full[layers][:, :, positions]``
    would give it (an int for either drops that axis; negative indices count
    back, lists keep their order and repeats), float32::

        with model.trace(prompt):
            lens = logit_lens(model, positions=[-1]).save()   # [num_layers, batch, 1, vocab]
        print(lens.softmax(-1).argmax(-1)[:, 0, 0])           # each block's top next token

    The last block's lens is the model's logits. Positions are kept before
    unembedding, so memory grows with the positions asked: the whole lens,
    ``positions=None``, is ``num_layers * batch * seq * vocab_size * 4`` bytes
    (a 32-block model with a 128k vocabulary holds 16 MiB per token), and is
    for the caller to choose.

    Raises:
        IndexError: ``layers`` reaches outside the model's blocks.
        nnterp.Unavailable: the model's head cannot be applied exactly (see
            :func:`unembed`), or a block has no ``layer_output``.
        nnterp.OrderError: a block's output was already passed in this trace
            (read earlier values first).
    """
    count = len(model.layers)
    needed, order, single = select_indices(layers, count, "layers", f"the model's {count} blocks", "its blocks")
    head(model)  # an unavailable head raises before any value is waited for
    where = slice(None) if positions is None else positions
    outputs = [model.layers[int(i)].layer_output[:, where] for i in needed]
    lens = None
    for k, output in enumerate(outputs):
        logits = unembed(model, output)
        if lens is None:  # filled block by block: one block's logits in the head's dtype at a time beside the result
            lens = logits.new_empty((len(outputs), *logits.shape), dtype=torch.float32)
        lens[k] = logits
    if order is not None:
        lens = lens[order.to(lens.device)]
    return lens[0] if single else lens


def steer(envoy: Any, value: str, vector: Tensor, positions: Positions = None) -> None:
    """Add ``vector`` to a standard value at ``positions``: ``envoy.<value>[:, positions] += vector``.

    ``envoy`` is the envoy serving the value (``model.layers[3]``) and
    ``value`` its name (``"layer_output"``). ``vector`` is laid out over the
    value's last axis (``[hidden_size]`` for the residual stream) and is
    broadcast over batch and positions; ``positions`` index the value's
    second axis, its sequence (an int, a slice, a list; ``None`` is every
    position). Call it inside a trace, or on each step of ``tracer.iter``
    during ``generate`` to steer every generated token::

        with model.generate(prompt, max_new_tokens=5) as tracer:
            for _ in tracer.iter[:]:
                steer(model.layers[3], "layer_output", direction, positions=[-1])

    Raises:
        ValueError: ``vector``'s last axis is not the value's (the message
            names the value and the size), or ``positions`` are given for a
            value whose second axis is not its sequence; raised before the
            value is waited for where its layout names its last axis,
            otherwise before it is written, so the model is left as it was.
        AttributeError: ``envoy`` serves no ``value``.
    """
    served = getattr(type(envoy), value, None)
    dims = served.dims if isinstance(served, EProperty) else None
    where = f"{value} on {getattr(envoy, 'path', type(envoy).__name__)}"
    if isinstance(served, DerivedEProperty):
        raise ValueError(f"steer {where}: it is computed from other values and read-only; steer one of those")
    if positions is not None and dims and (len(dims) < 2 or dims[1] != "seq"):
        raise ValueError(f"steer {where}: positions index the sequence axis, and {value} is laid out {list(dims)}")
    try:
        size = axis_size(envoy, dims[-1]) if dims else None
    except ValueError:  # no envoy declares the axis: checked against the value once it is read
        size = None
    if size is not None:
        _check_vector(where, vector, size, dims[-1])
    current = getattr(envoy, value)
    _check_vector(where, vector, current.shape[-1], dims[-1] if dims else "last axis")
    current[:, slice(None) if positions is None else positions] += vector.to(current.device)


def _check_vector(where: str, vector: Any, size: int, axis: str) -> None:
    if not isinstance(vector, Tensor) or vector.dim() == 0 or vector.shape[-1] != size:
        shape = tuple(vector.shape) if isinstance(vector, Tensor) else type(vector).__name__
        raise ValueError(
            f"steer {where}: the vector must end in the value's {axis} axis of size {size} (a [{size}] tensor is "
            f"added at every asked position of every batch row), got {shape}; nothing was written"
        )


__all__ = [
    "HEAD_TRANSFORMS",
    "HEAD_UNAVAILABLE",
    "Head",
    "HeadTransform",
    "called_after_blocks",
    "head",
    "head_transforms",
    "logit_lens",
    "steer",
    "unembed",
]
