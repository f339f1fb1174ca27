import torch

from nnterp.testing import family_suite
from nnterp.testing.suites import close
from nnterp_attention.testing import attend


class TestQwen2_5VL(family_suite("qwen2_5_vl")):
    def test_the_blocks_take_the_patch_embeddings_in_window_order(self) -> None:
        encoding = self.encoding()
        order, _ = self.windows(encoding)
        squares = self.model.vision.spatial_merge_size**2
        with self.model.trace(encoding):
            patches = self.model.vision.patch_embeddings.save()
            entering = self.model.vision.layers[0].layer_input.save()
        assert not torch.equal(order, order.sort().values), "the test images form one window each"
        windowed = patches.reshape(-1, squares, patches.shape[-1])[order].reshape(patches.shape)
        close(entering, windowed, what="vision.layers[0].layer_input vs patch_embeddings in window order")

    def test_a_windowed_block_attends_within_each_window(self) -> None:
        encoding = self.encoding()
        _, sizes = self.windows(encoding)
        attention = self.model.vision.layers[1].self_attn
        with self.model.trace(encoding):
            queries = attention.attention_queries.save()
            keys = attention.attention_keys.save()
            values = attention.attention_values.save()
            heads = attention.attention_head_outputs.save()
        assert len(sizes) > len(self.SIZES), f"windows of {sizes} patches: no image is split"
        pieces = zip(*(tensor.split(sizes, dim=2) for tensor in (queries, keys, values)), strict=True)
        close(heads, torch.cat([attend(*piece) for piece in pieces], dim=1), what="head outputs vs each window's")
