"""The nnterp-attention plugin: softmax attention, its families, and the suite ``nnterp check`` runs on them."""

import nnterp
from nnterp.testing import AttentionSuite

from .attention import Attention
from .families import bloom, gemma2, gemma3_text, gpt2, gpt_neox, llama, mistral, mpt, olmo2, phi3, qwen2, qwen3
from .generic import generic_family
from .own_arithmetic import OwnArithmeticAttention


@nnterp.hookimpl
def nnterp_families():
    return [llama, mistral, qwen2, qwen3, gemma2, gemma3_text, olmo2, phi3, gpt2, gpt_neox, bloom, mpt]


@nnterp.hookimpl
def nnterp_suites():
    from .testing import AlibiAttentionSuite

    # The subclass's suite first: `nnterp check` combines the suites of every base, most derived first.
    return {OwnArithmeticAttention: AlibiAttentionSuite, Attention: AttentionSuite}


@nnterp.hookimpl
def nnterp_generic_family(config):
    return generic_family(config)
