"""A model loaded with another attention implementation: the interior is unavailable, the contribution is not."""

import pytest

from nnterp import Unavailable
from nnterp.testing import PROMPT, close, tiny_standardized
from nnterp_attention import NOT_EAGER

INTERFACE_VALUES = (
    "attention_queries",
    "attention_keys",
    "attention_values",
    "attention_scores",
    "attention_probabilities",
    "attention_head_outputs",
)


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def family(request):
    return request.param


def test_sdpa_reports_and_raises_the_eager_reason(family):
    model = tiny_standardized(family, attn_implementation="sdpa")
    reason = NOT_EAGER.format(implementation="sdpa")
    support = model.support()
    for name in INTERFACE_VALUES:
        assert support[f"self_attn.{name}"] == {layer: reason for layer in range(model.num_layers)}, name
    with pytest.raises(Unavailable) as raised:
        with model.trace(PROMPT):
            model.layers[0].self_attn.attention_probabilities.save()
    assert reason in str(raised.value)


def test_sdpa_attention_output_is_the_eager_one(family):
    sdpa = tiny_standardized(family, attn_implementation="sdpa")
    eager = tiny_standardized(family)
    assert sdpa.support()["self_attn.attention_output"] is None
    outputs = []
    for model in (sdpa, eager):
        with model.trace(PROMPT):
            outputs.append(model.layers[-1].self_attn.attention_output.save())
    close(outputs[0], outputs[1], atol=1e-5, what="attention_output under sdpa vs eager")
