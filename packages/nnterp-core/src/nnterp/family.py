"""Family: everything a family module may declare, each with its meaning, checked when a plugin registers it.

A family is a module (``nnterp_attention.families.llama``) whose top-level
names declare how nnterp serves some transformers model types. ``Family`` is
the one place those names are defined: a field per name, spelled as the
module spells it, with its type and meaning. ``declared(module)`` reads a
module into a ``Family``, and the registry does so for every family a
plugin provides, so a name of the wrong type, a misspelled one
(``TINY_CONFG``) or one in the wrong case (``tiny_config``) is an error
naming the family and the name, not a declaration silently ignored. Code
that needs a family's fact reads it from ``declared(family)``, never from
the module with a default.

A module's other top-level names (its imports, its envoy classes, its own
constants) are its business, so long as none is within a typo of a field.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any


class FamilyError(TypeError):
    """A family module declares a name nnterp reads with a value of the wrong type, or a near miss of such a name."""


@dataclass(frozen=True)
class Family:
    """What one family module declares, by the names the module spells.

    Required of every family:

    - ``MODEL_TYPES``: the transformers ``model_type``\\ s the family serves.
    - ``ENVOYS``: nnsight's ``envoys=``, a module class (or a path pattern)
      to the standard envoy class that wraps it (``Layer``, ``Attention``, a
      ``RecurrentMixer`` kind...).
    - ``RENAME``: nnsight's ``rename=``, the model's module paths (or
      classes) to the standard names, merged over core's common spellings.
    - ``TINY_CONFIG``: keyword arguments of
      ``AutoConfig.for_model(MODEL_TYPES[0], ...)`` that build a random
      model in well under a second, for tests and ``nnterp check``.

    Optional, each ``None``/empty where the family leaves it out:

    - ``MODELING``: the transformers modeling module whose kernels
      ``route_kernels`` swaps, where the family's mixers call kernels.
    - ``CONTRIBUTIONS``: a block's ``(sublayer, value)`` contributions to
      the residual stream in the order its forward adds them, where that is
      not the attention's (or mixer's) and the MLP's alone (X-MOD's
      adapter, Gemma-4's per-layer input).
    - ``CAUSAL_LM``: the class checkpoints of the type load as for text,
      where transformers maps no causal LM to it (a multimodal wrapper).
    - ``HEAD``: the paths, from the model, of the modules that turn the
      last block's output into logits, in order, where they are not the
      final norm and ``lm_head`` (the logit lens reads them).
    - ``ATTENDS_BOTH_WAYS``: true where the prompt's tokens attend to later
      ones too (a BERT-style decoder, CPM-Ant), so causal checks skip.
    - ``GENERIC``: set by a generic family only, the block layout it
      recognized in one line.
    - ``prefix_positions(config)``: how many positions the blocks run on
      before the input's tokens (CPM-Ant's learned prompt).
    - ``tiny_weights(model)``: random values for what the model initializes
      to a constant that would hide what the suites check (a zero key
      scale, a zero projection), applied to every tiny model.

    A multimodal wrapper's family also declares (``nnterp.testing.vision``
    states the contract):

    - ``IMAGE_TOKENS``: the special tokens its processor writes, added to
      the local tokenizer in this order.
    - ``IMAGE_PROMPT``: what marks one image in a prompt.
    - ``tiny_processor(tokenizer)``: its processor over that tokenizer.
    - ``PROCESSOR_NEEDS_TORCHVISION``: true where ``AutoProcessor`` rebuilds
      the saved processor only with torchvision's image processor.
    - ``NO_IMAGES``: why the installed transformers cannot run the wrapper
      on images; it then loads and serves text only.
    - ``ROOT_SCATTER``: the operation in the model's own forward that
      scatters the image features into the token embeddings, where no
      submodule does (Llama-4).
    """

    MODEL_TYPES: tuple[str, ...]
    ENVOYS: Mapping[Any, type]
    RENAME: Mapping[Any, str]
    TINY_CONFIG: Mapping[str, Any]
    MODELING: ModuleType | None = None
    CONTRIBUTIONS: tuple[tuple[str, str], ...] | None = None
    CAUSAL_LM: type | None = None
    HEAD: tuple[str, ...] | None = None
    ATTENDS_BOTH_WAYS: bool = False
    GENERIC: str | None = None
    prefix_positions: Callable[[Any], int] | None = None
    tiny_weights: Callable[[Any], None] | None = None
    IMAGE_TOKENS: tuple[str, ...] = ()
    IMAGE_PROMPT: str | None = None
    tiny_processor: Callable[[Any], Any] | None = None
    PROCESSOR_NEEDS_TORCHVISION: bool = False
    NO_IMAGES: str | None = None
    ROOT_SCATTER: str | None = None


#: Every name a family module may declare.
FIELDS = tuple(field.name for field in dataclasses.fields(Family))
REQUIRED = tuple(field.name for field in dataclasses.fields(Family) if field.default is dataclasses.MISSING)
_TYPES = typing.get_type_hints(Family)


@functools.cache
def declared(family: ModuleType) -> Family:
    """``family``'s declarations as a ``Family``, checked: the typed view every reader of a family's facts uses.

    Raises:
        FamilyError: a required name missing, a declared name of the wrong
            type, or a top-level name within a typo of a declared one, each
            naming the family and the name.
    """
    name = family.__name__
    missing = [field for field in REQUIRED if not hasattr(family, field)]
    if missing:
        raise FamilyError(f"family {name} does not declare {', '.join(missing)}, which every family must")
    for own in vars(family):
        if own in FIELDS or own.startswith("_"):
            continue
        near = difflib.get_close_matches(own, FIELDS, n=1, cutoff=0.85) or [
            field for field in FIELDS if field.lower() == own.lower()
        ]
        if near:
            raise FamilyError(
                f"family {name} declares {own}, which nnterp does not read: did you mean {near[0]}? "
                f"(nnterp.family.Family lists what a family declares)"
            )
    values = {field: getattr(family, field) for field in FIELDS if hasattr(family, field)}
    for field, value in values.items():
        if not _conforms(value, _TYPES[field]):
            raise FamilyError(
                f"family {name} declares {field} as {type(value).__name__} {value!r:.80}, not {_spelled(_TYPES[field])}"
            )
    return Family(**values)


def is_family(value: Any) -> bool:
    """Whether ``value`` is a family module: a module declaring every name a family must."""
    return isinstance(value, ModuleType) and all(hasattr(value, field) for field in REQUIRED)


def _conforms(value: Any, annotation: Any) -> bool:
    """Whether ``value`` is of ``annotation``: the few kinds ``Family`` declares, checked a level deep."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, option) for option in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is Any:
        return True
    if origin is tuple:
        element = typing.get_args(annotation)[0]
        return isinstance(value, tuple) and all(_conforms(item, element) for item in value)
    if origin is Callable or annotation is Callable:
        return callable(value)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, annotation)


def _spelled(annotation: Any) -> str:
    return str(annotation).replace("typing.", "").replace("collections.abc.", "")
