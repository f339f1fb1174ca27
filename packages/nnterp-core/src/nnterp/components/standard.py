"""Standard: the envoy that carries standard values, and what every such envoy shares."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from nnsight.intervention.envoy import Envoy

from ..descriptor import EProperty
from ..value_host import ValueHost


class Standard(ValueHost, Envoy):
    """An envoy carrying standard values: what ``Layer``, ``Attention``, ``Mlp`` and the recurrent mixers share.

    Its values are the :class:`~nnterp.EProperty` attributes of its class; each
    is listed in the repr with its layout, and ``support()`` says which this
    module has. A family subclasses the standard envoy of a module whose
    forward is spelled differently and overrides only the values that differ.

    A value that is an operation inside this module's forward is served only
    on a call whose forward was instrumented before the call began. Reading it
    first, before the module runs, instruments it in time; reading it after
    the worker has already entered the module (after a value of one of its
    submodules) is too late for that call. A family whose values are read in
    that order sets ``sourced = True``, and the forward is instrumented when
    the envoy is built and again when real weights replace meta ones.
    """

    sourced: ClassVar[bool] = False
    #: Standard names this envoy takes from children of its own that are spelled the same, each pointed at an envoy
    #: below the child: ``{"self_attn": "self_attn.0"}`` for a block whose ``self_attn`` is a list of two attentions.
    #: A family's ``RENAME`` cannot say this, as nnsight refuses an alias that shadows a child. The child stays in the
    #: tree under its own path.
    over_children: ClassVar[dict[str, str]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, path in self.over_children.items():
            target: Any = self
            for step in path.split("."):
                target = target[int(step)] if step.isdigit() else getattr(target, step)
            # recorded as nnsight records an alias, so messages and support() spell the standard name
            object.__setattr__(self, name, target)
            self._aliases[name] = path
        if self.sourced:
            self.source

    def _update(self, module: torch.nn.Module) -> None:
        super()._update(module)
        if self.sourced:
            self.source

    @classmethod
    def values(cls) -> dict[str, EProperty]:
        """Every standard value this envoy class declares, by name."""
        found: dict[str, EProperty] = {}
        for klass in reversed(cls.__mro__):
            for name, attr in vars(klass).items():
                if isinstance(attr, EProperty):
                    found[name] = attr
                elif name in found:
                    del found[name]
        return found

    def support(self) -> dict[str, str | None]:
        """Which values this module has: value name -> ``None`` when available, else the reason it is not."""
        return {name: value.reason(self) for name, value in self.values().items()}

    def unavailable(self, name: str) -> str | None:
        """Why this module does not have the value ``name``, as ``support()`` says; ``None`` when it has it, or when
        its class declares no standard value so named. Asks that value alone: ``support()`` asks every one."""
        value = self.values().get(name)
        return None if value is None else value.reason(self)


class Sublayer(Standard):
    """A module whose output its block adds to the residual stream: an attention, an MLP, a recurrent mixer.

    Its contribution (``attention_output``, ``mlp_output``) is read at
    ``CONTRIBUTION``, a path from the module: its own output, unless the
    block changes that output on its way into the stream, where the family
    names the place the change is made (a post-norm, a dropout, a scaling
    in the block's forward). Reading it there keeps
    ``layer_input + contributions == layer_output`` on every family.
    """

    #: Where what the block adds is read, relative to this module ("../post_attention_layernorm.output").
    CONTRIBUTION: ClassVar[str] = "output"


def contribution(envoy: Sublayer) -> str:
    """The key of a sublayer's contribution: its class's ``CONTRIBUTION``."""
    return type(envoy).CONTRIBUTION


def axis_size(envoy: Envoy, axis: str) -> int:
    """The size of layout axis ``axis`` on a value ``envoy`` serves.

    An axis that is a fact about the model is named after the attribute holding
    its size (``HIDDEN`` is ``"hidden_size"``), so the size is that attribute:
    on ``envoy`` when its class declares it (an attention's ``num_heads``), else
    on the first envoy above it whose class does, up to the model's root::

        axis_size(model.layers[3], HIDDEN)          # model.hidden_size
        axis_size(model.layers[3].self_attn, HEADS)  # this block's heads

    Only an envoy's class counts, never an attribute of the wrapped module,
    which can share a name and hold another number.

    Raises:
        ValueError: no envoy from ``envoy`` to the root declares ``axis``
            (``batch`` and ``seq`` are facts about the input, not the model).
    """
    node: Envoy | None = envoy
    while node is not None:
        if any(axis in vars(klass) for klass in type(node).__mro__ if klass is not Envoy):
            return getattr(node, axis)
        node = node.parent
    raise ValueError(f"no envoy from {envoy.path} up to the root declares the size of axis {axis!r}")


def blocks_support(blocks: list[Envoy], layer: int | None = None) -> dict[str, Any]:
    """The block values of a block list, the way ``support`` reports them.

    With ``layer``, that block's values by dotted name (``"layer_output"``,
    ``"self_attn.attention_probabilities"``) -> reason or ``None``. Without,
    each value -> ``None`` when available on every block, else
    ``{layer: reason}`` for the blocks where it is not. A value of a module
    some blocks do not have (a hybrid's ``linear_attn``) is reported on those
    blocks as ``no <module> module on this block``.
    """
    per_block = [_block_support(block) for block in blocks]
    names = list(dict.fromkeys(name for table in per_block for name in table))
    for block, table in zip(blocks, per_block, strict=True):
        for name in names:
            if name not in table:
                table[name] = _missing(block, name)
    if layer is not None:
        return per_block[layer]
    support: dict[str, Any] = {}
    for name in names:
        missing = {i: table[name] for i, table in enumerate(per_block) if table[name] is not None}
        support[name] = missing or None
    return support


def _missing(block: Envoy, name: str) -> str:
    """Why a value other blocks have is not on ``block``: it lacks the module, or its module is of a kind without it."""
    owner, _, value = name.rpartition(".")
    child = getattr(block, owner, None) if owner else block
    if not isinstance(child, Envoy):
        return f"no {owner} module on this block"
    # A hybrid's dense MLP beside its mixtures of experts, say: the module is there, of another kind.
    return f"this block's {owner or 'block'} is a {type(child).__name__}, which has no {value}"


def _block_support(block: Envoy) -> dict[str, str | None]:
    table = dict(block.support()) if isinstance(block, Standard) else {}
    children = dict(block._named_children())
    for alias, real in block._aliases.items():
        # Under its standard name only, however deep the alias reaches (a hybrid's mixer one level down).
        children.pop(real, None)
        children[alias] = getattr(block, alias)
    for name, child in children.items():
        if isinstance(child, Standard):
            table.update({f"{name}.{value}": reason for value, reason in child.support().items()})
    return table
