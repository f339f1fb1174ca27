import pytest
import torch

from nnterp.testing import PROMPT, close, family_suite


class TestHYV4(family_suite("hy_v4")):
    def test_the_final_norm_reads_the_streams_weighted_by_the_head(self) -> None:
        with self.model.trace(PROMPT):
            leaving = self.model.layers[-1].layer_output.save()
            final = self.model.ln_final.input.save()
        with torch.no_grad():
            collapsed = self.model._module.model.hc_head(leaving)
        close(final, collapsed, what="the final norm's input vs hc_head of the last block's streams")
        assert not torch.allclose(final, leaving.mean(dim=-2)), "hc_head weighs the streams equally"

    def test_a_block_whose_choices_the_next_shares_cannot_be_skipped(self) -> None:
        with pytest.raises(ValueError, match=r"cannot skip layers\[1\]: layers\[2\]'s indexer is shared"):
            with self.model.trace(PROMPT):
                self.model.layers[1].skip(self.model.layers[1].layer_input)
        with self.model.trace(PROMPT):
            self.model.layers[2].skip(self.model.layers[2].layer_input)
            skipped = self.model.logits.save()
        assert torch.isfinite(skipped).all()
