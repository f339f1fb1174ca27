"""The nnterp-attention plugin: softmax attention, its families, and the suite ``nnterp check`` runs on them."""

import nnterp
from nnterp.testing import AttentionSuite

from .attention import Attention
from .families import gemma2, gemma3_text, gpt2, gpt_neox, llama, mistral, olmo2, phi3, qwen2, qwen3


@nnterp.hookimpl
def nnterp_families():
    return [llama, mistral, qwen2, qwen3, gemma2, gemma3_text, olmo2, phi3, gpt2, gpt_neox]


@nnterp.hookimpl
def nnterp_suites():
    return {Attention: AttentionSuite}
