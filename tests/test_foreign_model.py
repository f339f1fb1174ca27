"""A model of a type a family serves, built from another package's classes, is refused before any weights load.

flash-linear-attention registers its own Mamba and Mamba-2 in transformers' Auto classes (``exist_ok=True``) when it
is imported, and transformers imports it as soon as it looks for fla's kernels: on a GPU with fla installed,
``AutoModelForCausalLM`` then builds fla's Mamba for a ``mamba`` checkpoint (seen on an H200 with fla 0.6.0 and
transformers 5.25). None of its modules is one the mamba family serves; without the check every mixer value would be
silently missing. Here a stand-in package registers a GPT-2 under the ``mamba`` type.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from nnterp import ForeignModel, StandardizedTransformer
from nnterp.testing import local_tokenizer, save_tiny


class ForeignMambaConfig(GPT2Config):
    model_type = "mamba"

    def __init__(self, n_head: int = 2, **kwargs) -> None:
        super().__init__(n_head=n_head, **kwargs)


class ForeignMamba(GPT2LMHeadModel):
    config_class = ForeignMambaConfig


@contextmanager
def registered_over_transformers():
    """The stand-in registered for ``mamba`` as fla registers its own, and transformers' own restored after."""
    AutoConfig.register("mamba", ForeignMambaConfig, exist_ok=True)
    AutoModelForCausalLM.register(ForeignMambaConfig, ForeignMamba, exist_ok=True)
    try:
        yield
    finally:
        CONFIG_MAPPING._extra_content.pop("mamba", None)
        AutoModelForCausalLM._model_mapping._extra_content.pop(ForeignMambaConfig, None)


def test_a_foreign_model_of_a_served_type_is_refused_with_the_fix():
    module = ForeignMamba(ForeignMambaConfig(vocab_size=64, n_embd=16, n_layer=2, n_head=2))
    with pytest.raises(ForeignModel) as refused:
        StandardizedTransformer(module, tokenizer=local_tokenizer(64))
    message = str(refused.value)
    assert "ForeignMamba" in message and "the mamba family does not serve" in message, message
    assert "from transformers.models.mamba import MambaForCausalLM" in message, message


def test_a_checkpoint_loading_as_a_registered_foreign_class_is_refused(tmp_path):
    path = save_tiny("mamba", tmp_path / "mamba")
    with registered_over_transformers(), pytest.raises(ForeignModel, match="registered its own 'mamba' model"):
        StandardizedTransformer(path)


def test_transformers_own_class_loads_beside_the_registration(tmp_path):
    """The fix the message gives: transformers' own class, whatever the Auto classes map the type to."""
    from transformers.models.mamba import MambaForCausalLM

    path = save_tiny("mamba", tmp_path / "mamba")
    with registered_over_transformers():
        model = StandardizedTransformer(MambaForCausalLM.from_pretrained(path), tokenizer=local_tokenizer(64))
    assert model.support(layer=0)["linear_attn.state_trajectory"] is None
    with model.trace("hello"):
        states = model.layers[0].linear_attn.state_trajectory.save()
    assert states.shape[1] == len(model.tokenizer("hello").input_ids)
