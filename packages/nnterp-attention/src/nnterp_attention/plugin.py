"""The nnterp-attention plugin: softmax attention, its families, and the suite ``nnterp check`` runs on them."""

import nnterp
from nnterp.registry import installed_families
from nnterp.testing import AttentionSuite

from .attention import Attention
from .families import (
    bert,
    bert_generation,
    big_bird,
    bloom,
    camembert,
    cpmant,
    data2vec_text,
    dbrx,
    deepseek_v3,
    deepseek_v4,
    doge,
    electra,
    ernie,
    falcon,
    gemma2,
    gemma3,
    gemma3_text,
    gemma3n_text,
    gemma4,
    gemma4_text,
    gemma4_unified,
    gemma4_unified_text,
    git,
    gpt2,
    gpt_neo,
    gpt_neox,
    gpt_neox_japanese,
    gpt_oss,
    granitemoe,
    hy_v4,
    llama,
    llama4,
    llama4_text,
    llava,
    llava_next,
    longcat_flash,
    megatron_bert,
    mimo_v2_flash,
    mistral,
    mistral3,
    mixtral,
    modernbert_decoder,
    mpt,
    olmo2,
    olmoe,
    openai_gpt,
    opt,
    phi3,
    qwen2,
    qwen2_5_vl,
    qwen2_moe,
    qwen2_vl,
    qwen3,
    qwen3_moe,
    qwen3_vl,
    rembert,
    roberta,
    roberta_prelayernorm,
    roc_bert,
    roformer,
    xlm_roberta,
    xlm_roberta_xl,
    xmod,
    zaya,
)
from .generic import generic_family
from .own_arithmetic import OwnArithmeticAttention
from .qwen_vision import QwenVisionAttention
from .sink import SinkAttention


@nnterp.hookimpl
def nnterp_families():
    return [
        *(llama, mistral, qwen2, qwen3, gemma2, gemma3_text, olmo2, phi3, gpt2, gpt_neox, bloom, mpt, falcon, gpt_oss),
        *(mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3, mimo_v2_flash, granitemoe, hy_v4),
        deepseek_v4,
        *(dbrx, llama4_text),
        *(llava, llava_next, gemma3, mistral3, llama4),
        *(qwen2_vl, qwen2_5_vl, qwen3_vl),
        gemma4_text,
        *(gemma4, gemma4_unified_text, gemma4_unified),
        *(bert, bert_generation, camembert, data2vec_text, electra, ernie, roberta, roc_bert, xlm_roberta),
        *(big_bird, git, rembert, megatron_bert, roberta_prelayernorm, xlm_roberta_xl),
        roformer,
        opt,
        gpt_neo,
        openai_gpt,
        doge,
        gpt_neox_japanese,
        modernbert_decoder,
        xmod,
        gemma3n_text,
        zaya,
        cpmant,
        longcat_flash,
        # Beam ships from transformers 5.23
        *installed_families("nnterp_attention.families.beam"),
    ]


@nnterp.hookimpl
def nnterp_suites():
    from .testing import AlibiAttentionSuite, Gemma3nLayerSuite, QwenVisionSuite, SinkAttentionSuite

    # The subclass's suite first: `nnterp check` combines the suites of every base, most derived first.
    return {
        QwenVisionAttention: QwenVisionSuite,
        gemma3n_text.Gemma3nLayer: Gemma3nLayerSuite,
        SinkAttention: SinkAttentionSuite,
        OwnArithmeticAttention: AlibiAttentionSuite,
        Attention: AttentionSuite,
    }


@nnterp.hookimpl
def nnterp_generic_family(config):
    return generic_family(config)
