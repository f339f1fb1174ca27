import torch

from nnterp import Unavailable
from nnterp.testing import family_suite
from nnterp.testing.suites import close, raises


class TestMistral3(family_suite("mistral3")):
    def test_each_image_is_its_own_grid_of_the_padded_convolution(self) -> None:
        encoding = self.encoding()
        patch = self.model.vision.patch_size
        with self.model.trace(encoding):
            grids = self.model.vision.patch_conv.output.save()
            packed = self.model.vision.patch_embeddings.save()
        assert grids.shape[0] == len(self.SIZES), "the convolution runs on the padded batch, one grid per image"
        pieces = packed[0].split(self.model.vision.patches_per_image(encoding))
        for i, (piece, (height, width)) in enumerate(zip(pieces, encoding["image_sizes"], strict=True)):
            grid = grids[i][:, : height // patch, : width // patch]
            close(piece, grid.flatten(1).T, what=f"image {i}'s patches in the packed row vs its cropped grid")

    def test_the_tower_attends_within_each_image_only(self) -> None:
        encoding = self.encoding()
        sizes = self.model.vision.patches_per_image(encoding)
        patterns = []
        with self.model.trace(encoding):
            for layer in self.model.vision.layers:
                patterns.append(layer.self_attn.attention_probabilities.save())
        same_image = torch.block_diag(*[torch.ones(size, size, dtype=torch.bool) for size in sizes])
        for i, pattern in enumerate(patterns):
            assert pattern.shape == (1, self.model.vision.num_heads, sum(sizes), sum(sizes))
            assert torch.all(pattern[..., ~same_image] == 0), f"vision.layers[{i}] attends across images"
            assert torch.all(pattern[..., same_image] > 0), f"vision.layers[{i}] masks patches of one image"
            for j, rows in enumerate(pattern[0].split(sizes, dim=-2)):
                start = sum(sizes[:j])
                close(rows[..., start : start + sizes[j]].sum(-1), torch.ones(rows.shape[:-1]), what=f"image {j}")

    def test_one_image_token_per_merged_square_and_the_projector_takes_the_tower_output(self) -> None:
        encoding = self.encoding()
        side = self.model.vision.patch_size * self.model._module.config.spatial_merge_size
        with self.model.trace(encoding):
            tower = self.model.vision.tower_output.save()
            entering = self.model.projector.input.save()
            features = self.model.vision.image_features.save()
        close(entering, tower[0], what="projector.input vs vision.tower_output")
        squares = sum(int(height // side) * int(width // side) for height, width in encoding["image_sizes"])
        assert features.shape[0] == squares, f"{features.shape[0]} image tokens for {squares} merged squares"

    def test_image_size_is_unavailable(self) -> None:
        with raises(Unavailable, "any resolution"):
            self.model.vision.image_size
