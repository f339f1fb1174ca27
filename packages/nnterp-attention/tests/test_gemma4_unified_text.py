from nnterp import StandardizedTransformer
from nnterp.testing import PROMPT, close, family_suite, tiny_model, tiny_standardized
from nnterp_attention.testing import drawn_layer_scalars


class TestGemma4UnifiedText(family_suite("gemma4_unified_text")):
    @classmethod
    def build_model(cls):
        return drawn_layer_scalars(tiny_standardized(cls.family, **cls.load))

    def test_blocks_compute_what_gemma4_text_blocks_without_ple_or_experts_do(self) -> None:
        # The same weights in a gemma4_text model with neither per-layer input nor mixture of experts: every block
        # value and the logits agree, so the block is Gemma-4's and its values are read at the same places.
        # Without shared keys and values: gemma4_text (transformers 5.23 to 5.24) slices the per-layer inputs in front
        # of the first block that reuses them, and fails on a model that has none.
        unified = drawn_layer_scalars(tiny_standardized(self.family, num_kv_shared_layers=0))
        config = unified._module.config.to_dict()
        dense = {"enable_moe_block": False, "hidden_size_per_layer_input": 0}
        keep = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
        keep += ("num_key_value_heads", "head_dim", "sliding_window", "layer_types", "num_kv_shared_layers")
        keep += ("use_double_wide_mlp", "attention_k_eq_v")
        globals_ = {"global_head_dim": 32, "num_global_key_value_heads": 1}
        text = tiny_model("gemma4_text", **{name: config[name] for name in keep}, **dense, **globals_)
        missing, unexpected = text.load_state_dict(unified._module.state_dict(), strict=False)
        assert not unexpected and not [name for name in missing if "per_layer" not in name], (missing, unexpected)
        alone = StandardizedTransformer(text, tokenizer=unified.tokenizer)
        readings = []
        for model in (unified, alone):
            values: list = []
            with model.trace(PROMPT):
                for layer in model.layers:
                    values += [layer.self_attn.attention_output.save(), layer.mlp.mlp_output.save()]
                    values.append(layer.layer_output.save())
                values.append(model.logits.save())
            readings.append(values)
        for i, (mine, theirs) in enumerate(zip(*readings, strict=True)):
            close(mine, theirs, what=f"reading {i} of gemma4_unified_text vs gemma4_text on the same weights")
