"""StandardizedTransformer: a transformers language model under the standard names."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch
from nnsight import NNsightDeprecationWarning
from nnsight.modeling.tp.envoys import tp_envoys, wants_tensor_parallel
from nnsight.modeling.transformers import TransformersModel
from transformers.models.auto.configuration_auto import model_type_to_module_name
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from .components.standard import blocks_support
from .components.vision import VISION_NAMES, check_images, missing_tower, vision_family
from .descriptor import DerivedEProperty, EProperty
from .family import declared
from .layouts import Logits, Probabilities
from .placement import check_device_map, input_device, pipeline_placement
from .registry import REGISTRY, ForeignModel, family_name
from .remote import archive, by_value, carried, exclude_from_nnsight_by_value, shipped
from .tensor_parallel import shim_nnsight
from .value_host import ValueHost

#: The spellings most transformers families share; a family's RENAME is merged over them.
COMMON_RENAME: dict[Any, Any] = {
    "model.layers": "layers",
    "model.embed_tokens": "embed_tokens",
    "model.norm": "ln_final",
    # A multimodal wrapper's text model, under its inner model.
    "model.language_model.layers": "layers",
    "model.language_model.embed_tokens": "embed_tokens",
    "model.language_model.norm": "ln_final",
}
#: The task a multimodal checkpoint loads under with its processor.
IMAGE_TEXT_TO_TEXT = "image-text-to-text"
#: The files a checkpoint directory saves its processor in.
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def family_tables(family: ModuleType, config: Any) -> tuple[dict, dict]:
    """The envoys and standard names a load of ``family`` uses.

    A multimodal family says what its wrapper adds (the tower, the scatter);
    its text model's modules are the family of the ``text_config``'s type, so
    a LLaVA over a Mistral gets Mistral's envoys.
    """
    envoys, rename = dict(family.ENVOYS), {**COMMON_RENAME, **family.RENAME}
    text = getattr(config, "text_config", None)
    if vision_family(family) and text is not None and text.model_type not in family.MODEL_TYPES:
        text_family = REGISTRY.family_for(text.model_type, text)
        envoys = {**text_family.ENVOYS, **envoys}
        rename = {**COMMON_RENAME, **text_family.RENAME, **family.RENAME}
    return envoys, rename


def load_task(family: ModuleType, model: Any, processor: Any, kwargs: dict) -> str:
    """The task a model loads under: a multimodal family with a processor at hand takes images, else text.

    A processor is at hand when one is passed, when a checkpoint directory
    saves one, or for a hub id (a multimodal checkpoint ships its processor).
    A family whose wrapper the installed transformers cannot run on images
    (its ``NO_IMAGES``) loads for text.
    """
    if "task" in kwargs:
        return kwargs["task"]
    if not vision_family(family) or declared(family).NO_IMAGES:
        return "text-generation"
    if processor is not None:
        return IMAGE_TEXT_TO_TEXT
    if isinstance(model, torch.nn.Module):
        return "text-generation"
    if os.path.isdir(model):
        saved = any(os.path.isfile(os.path.join(model, name)) for name in PROCESSOR_FILES)
        return IMAGE_TEXT_TO_TEXT if saved else "text-generation"
    return IMAGE_TEXT_TO_TEXT


def register_causal_lm(family: ModuleType, config: Any) -> None:
    """Make the family's ``CAUSAL_LM`` the causal LM of ``config``'s type, where transformers maps none.

    GLM-5-Next ships only its multimodal wrapper, which runs text alone as a
    causal LM does; registering it lets the text-generation pipeline, and
    ``AutoModelForCausalLM``, load such a checkpoint. A family with no
    ``CAUSAL_LM`` leaves transformers' mapping as it is.
    """
    causal_lm = declared(family).CAUSAL_LM
    if causal_lm is not None:
        from transformers import AutoModelForCausalLM

        # AutoModelForCausalLM.register skips a config class of transformers' own before 5.24: add it as register does.
        AutoModelForCausalLM._model_mapping._extra_content.setdefault(type(config), causal_lm)


def check_family_modules(family: ModuleType, envoys: Mapping, module: torch.nn.Module) -> None:
    """Raise :class:`~nnterp.registry.ForeignModel` unless some module of ``module`` is one the load's ``envoys`` wrap.

    A package can register its own model for a type transformers ships (flash-linear-attention registers its
    Mamba and Mamba-2 over transformers' when it is imported, which transformers does when it looks for fla's
    kernels); a checkpoint of that type then loads as the package's classes, which no family serves, and every
    standard value of its blocks would be missing. Checked before any weights load.
    """
    classes = tuple(kind for kind in envoys if isinstance(kind, type))
    if not classes or any(isinstance(part, classes) for part in module.modules()):
        return
    built = type(module)
    config = getattr(module, "config", None)
    kind = model_type(config) if config is not None else "?"
    own = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(kind)
    where = f"transformers.models.{model_type_to_module_name(kind)}"
    fix = (
        f"load transformers' own class and pass the model: `from {where} import {own}` then "
        f"`StandardizedTransformer({own}.from_pretrained(name_or_path), tokenizer=...)`"
        if own
        else f"load the model with the classes of {sorted({kind.__module__ for kind in classes})[0]}"
    )
    raise ForeignModel(
        f"the {kind!r} model was built as {built.__module__}.{built.__name__}, whose modules the "
        f"{family_name(family)} family does not serve (it wraps {', '.join(sorted(k.__name__ for k in classes))} of "
        f"{classes[0].__module__}): another package registered its own {kind!r} model in transformers' Auto classes "
        f"({type(config).__module__}; flash-linear-attention does for mamba and mamba2 when it is imported). To read "
        f"it with nnterp, {fix}"
    )


def model_type(config: Any) -> str:
    """The ``model_type`` a model's family is keyed on."""
    return config.model_type


def load_config(model: Any, kwargs: dict) -> Any:
    """The config of ``model`` (a loaded model, a local directory or a hub id), read before any weights load."""
    if isinstance(model, torch.nn.Module):
        config = getattr(model, "config", None)
        if config is None:
            raise TypeError(f"{type(model).__name__} has no transformers config; pass a transformers PreTrainedModel")
        return config
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a hub id, a local directory or a loaded model, not {type(model).__name__}")
    if "config" in kwargs:
        return kwargs["config"]
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(os.fspath(model), trust_remote_code=kwargs.get("trust_remote_code", False))
    except (OSError, ValueError) as error:
        where = (
            "a directory with no loadable config.json"
            if os.path.isdir(model)
            else "neither a local directory nor a reachable hub id"
        )
        raise ValueError(f"cannot load {os.fspath(model)!r}: it is {where} ({error})") from error


class Support(dict):
    """``support()``'s table of values and reasons, with ``generic``: the layout a generic family served it by."""

    def __init__(self, table: dict[str, Any], generic: str | None = None) -> None:
        super().__init__(table)
        self.generic = generic

    def __repr__(self) -> str:
        table = super().__repr__()
        return f"Support(generic family: {self.generic}, {table})" if self.generic else f"Support({table})"


class StandardizedTransformer(ValueHost, TransformersModel):
    """A transformers language model whose values have the standard names, on every family.

    Args:
        model: A hub id, a local directory (as ``save_pretrained`` writes it),
            or a loaded ``PreTrainedModel``.
        tokenizer: A tokenizer to use instead of the one saved with the model.
        processor: A multimodal checkpoint's processor, to use instead of
            the one saved with it. With one (passed or saved), the wrapper
            loads with its vision tower, and a trace takes the processor's
            output (or ``text=``, ``images=``) the way it takes a prompt;
            without, it loads for text, and its image values are unavailable.
        **kwargs: Passed on to ``from_pretrained`` (``attn_implementation``,
            ``dtype``, ``device_map``) and to nnsight (``dispatch``).

    The family is resolved from the config's ``model_type`` through the plugin
    registry before any weights load, and wraps the modules in its standard
    envoys: ``layers[i]`` is a ``Layer`` with ``self_attn`` or ``linear_attn``
    and ``mlp`` under it, whatever the checkpoint calls them.
    ``layers[i].self_attn.attention_probabilities`` reads the same thing on a
    Llama and a GPT-2.

    Raises:
        nnterp.registry.UnknownModelType: no installed plugin handles the
            model's ``model_type`` (the message names the distribution that
            does, when one is known).
        nnterp.registry.ForeignModel: the model was built from another
            package's classes registered for its type (flash-linear-attention's
            Mamba), which its family does not serve; the message says how to
            load transformers' own.
        ValueError: ``model`` is neither a local directory nor loadable.
    """

    def __init__(self, model: Any, tokenizer: Any = None, processor: Any = None, **kwargs: Any) -> None:
        config = load_config(model, kwargs)
        family = REGISTRY.family_for(model_type(config), config)
        register_causal_lm(family, config)
        kwargs["task"] = load_task(family, model, processor, kwargs)
        if kwargs["task"] == IMAGE_TEXT_TO_TEXT:
            if processor is None and not isinstance(model, torch.nn.Module):
                from transformers import AutoProcessor

                processor = AutoProcessor.from_pretrained(os.fspath(model))
            # The tokenizer is the processor's.
            kwargs["processor"] = processor
        elif tokenizer is None and not isinstance(model, torch.nn.Module):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(os.fspath(model))
        if "device_map" in kwargs:
            # nnsight then loads the weights itself and wraps them, where the pipeline's placement is ours.
            kwargs.setdefault("config", config)
        envoys, rename = family_tables(family, config)
        kwargs.setdefault("rename", rename)
        if wants_tensor_parallel(model, kwargs):
            shim_nnsight(kwargs.get("distributed_config"))
            # nnsight's envoys for the split Linear and Embedding modules, beside the family's standard ones.
            envoys = {**tp_envoys(), **envoys}
        kwargs.setdefault("envoys", envoys)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NNsightDeprecationWarning)
            super().__init__(model, tokenizer=tokenizer, **kwargs)
        object.__setattr__(self, "family", family)
        check_family_modules(family, kwargs["envoys"], self._module)
        if declared(family).ROOT_SCATTER:
            # The images are scattered in the root's own forward, read after the tower's values inside it.
            self.source

    def _update(self, module: torch.nn.Module) -> None:
        super()._update(module)
        # called while nnsight builds the model too, before the family is set
        family = self.__dict__.get("family")
        if family is not None and declared(family).ROOT_SCATTER:
            self.source

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            family = self.__dict__.get("family")
            if name in VISION_NAMES and family is not None and vision_family(family):
                raise missing_tower(self, name) from None
            raise

    def _batch(self, invokes: list, fn: Any) -> Any:
        batched = super()._batch(invokes, fn)
        if vision_family(self.family):
            check_images(self._module.config, batched)
        return batched

    def _load(self, *args: Any, **kwargs: Any) -> torch.nn.Module:
        structure = self.__dict__.get("_module")  # the meta model, when nnsight loads the weights lazily
        if structure is not None:
            check_device_map(structure, kwargs.get("device_map"))
        return super()._load(*args, **kwargs)

    def _wrap(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        with pipeline_placement(module):
            return super()._wrap(module, *args, **kwargs)

    @property
    def device(self) -> torch.device | None:
        """Where inputs go: the device the input embedding runs on.

        Its weight's device, or, on a model placed by accelerate (a
        ``device_map``, ``cpu_offload``), its hook's execution device: an
        offloaded embedding stores its weight on the meta device.
        """
        if next(self._module.parameters(), None) is None:
            return None
        return input_device(self._module)

    def _remoteable_class(self) -> type:
        """A remote request names the plain checkpoint's deployment: nnsight's ``TransformersModel`` (see ``nnterp.remote``)."""
        return TransformersModel

    def _remoteable_model_key(self) -> str:
        if os.path.isdir(self.repo_id):
            # No hub to canonicalize a local directory against: the server has the same one.
            return json.dumps({"repo_id": os.path.abspath(self.repo_id), "revision": self.revision})
        return super()._remoteable_model_key()

    def _remote_backend(self, *args: Any, **kwargs: Any) -> Any:
        exclude_from_nnsight_by_value()
        if by_value(self.family):
            self.__dict__["_shipped_archive"] = archive(self.family.__name__.partition(".")[0])
        else:
            self.__dict__.pop("_shipped_archive", None)
        return super()._remote_backend(*args, **kwargs)

    def __reduce_ex__(self, protocol: Any) -> tuple:
        # A request that carries nnterp by value unpickles this model first: through ``shipped``, which serves
        # the archive's modules before the classes the rest of the request names are looked up (nnterp.remote).
        reduced = super().__reduce_ex__(protocol)
        shipped_archive = self.__dict__.get("_shipped_archive")
        if shipped_archive is None:
            return reduced
        state = {name: value for name, value in reduced[2].items() if name != "_shipped_archive"}
        kind = type(self)
        return (carried(shipped), (shipped_archive, kind.__module__, kind.__qualname__), state, *reduced[3:])

    family: ModuleType
    """The family module of this model (``nnterp.families.llama``, or a generic family with ``GENERIC``)."""

    @property
    def generic(self) -> str | None:
        """The block layout a generic family recognized this model by, or ``None`` when a family names its type.

        A model type no installed plugin names is served by a generic family
        when a plugin recognizes its blocks (``nnterp_generic_family``): its
        values are the standard ones, keyed on the layout read off the
        block's forward, and ``nnterp coverage --check`` is how they were
        verified on that model type.
        """
        return declared(self.family).GENERIC

    def __repr__(self) -> str:
        family = self.family
        served = (
            f"generic family of {family.MODEL_TYPES[0]!r}: {self.generic}"
            if self.generic
            else f"family {family_name(family)}"
        )
        return f"StandardizedTransformer ({served})\n{super().__repr__()}"

    # -- standard values of the whole model --------------------------------------

    @EProperty("output", select="logits")
    def logits(self, value: Any) -> Logits:
        """The model's logits, [batch, seq, vocab_size]: its output's, after whatever follows the head.

        Read where the model returns them, so a family that scales or
        soft-caps the head's output (Gemma-2's final soft-capping, Granite's
        logits scaling, Cohere's logit scale) serves what generation samples
        from. Assign or edit in place.
        """
        return value

    def _next_token_probs(self) -> Probabilities:
        """The next token's distribution at the last position, [batch, vocab_size]; derived, read-only."""
        return torch.softmax(self.logits[:, -1].float(), dim=-1)

    next_token_probs = DerivedEProperty(_next_token_probs)

    # -- sizes --------------------------------------------------------------------

    @property
    def text_config(self) -> Any:
        """The config of the language model (a multimodal wrapper's ``text_config``)."""
        config = self._module.config
        return getattr(config, "text_config", None) or config

    @property
    def hidden_size(self) -> int:
        """Width of the residual stream."""
        return self.text_config.hidden_size

    @property
    def num_layers(self) -> int:
        """Number of decoder blocks."""
        return len(self.layers)

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary the head predicts over."""
        return self.text_config.vocab_size

    @property
    def num_heads(self) -> int | None:
        """Attention heads per softmax-attention block, per the config (``None`` on a model without attention)."""
        config = self.text_config
        return getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)

    @property
    def num_kv_heads(self) -> int | None:
        """Key/value heads per softmax-attention block, per the config."""
        return getattr(self.text_config, "num_key_value_heads", None) or self.num_heads

    @property
    def head_dim(self) -> int | None:
        """Width of one attention head, per the config."""
        config = self.text_config
        head_dim = getattr(config, "head_dim", None)
        if head_dim is None and self.num_heads:
            head_dim = self.hidden_size // self.num_heads
        return head_dim

    @property
    def intermediate_size(self) -> int | None:
        """Width of the feed-forward's hidden layer, per the config (``None`` on a model without one)."""
        config = self.text_config
        return getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)

    # -- what this model has ----------------------------------------------------

    def support(self, layer: int | None = None) -> Support:
        """Which standard values this model has.

        Without ``layer``: every block value by dotted name
        (``"layer_output"``, ``"self_attn.attention_probabilities"``) ->
        ``None`` when every block has it, else ``{layer: reason}`` for the
        blocks that do not. With ``layer``: that block's values -> reason or
        ``None``. Nothing runs; the reasons are what a read would raise as
        :class:`~nnterp.Unavailable`. The table's ``generic`` is the block
        layout a generic family served the model by (``None`` when a family
        names its type), and its repr says so.

        Raises:
            IndexError: ``layer`` is outside the model's blocks; negative
                indices count from the end, as in Python.
        """
        blocks = list(self.layers)
        if layer is not None and not -len(blocks) <= layer < len(blocks):
            raise IndexError(
                f"support(layer={layer!r}): this model has {len(blocks)} layers; layer must be in "
                f"range(-{len(blocks)}, {len(blocks)}), from 0 to {len(blocks) - 1} or -{len(blocks)} to -1 from the end"
            )
        return Support(blocks_support(blocks, layer), generic=self.generic)
