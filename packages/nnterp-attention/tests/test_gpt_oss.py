import torch

from nnterp.testing import family_suite, tiny_standardized


class TestGptOss(family_suite("gpt_oss")):
    @classmethod
    def build_model(cls):
        model = tiny_standardized(cls.family, **cls.load)
        # The sinks are initialized near zero, where their logit is as large as a random-weight score: give each head
        # its own, so that a pattern computed without them, or with another head's, is told apart.
        with torch.no_grad():
            for layer in model.layers:
                layer.self_attn.sink_logits.copy_(torch.randn_like(layer.self_attn.sink_logits))
        return model
