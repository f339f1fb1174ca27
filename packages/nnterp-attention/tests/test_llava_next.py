import torch
from transformers.image_processing_utils import select_best_resolution

from nnterp.testing import family_suite
from nnterp.testing.suites import close


def runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """The (start, end) of each run of True in a 1-D mask."""
    edges = torch.diff(mask.int(), prepend=torch.zeros(1, dtype=torch.int), append=torch.zeros(1, dtype=torch.int))
    return list(zip((edges == 1).nonzero().flatten().tolist(), (edges == -1).nonzero().flatten().tolist(), strict=True))


class TestLlavaNext(family_suite("llava_next")):
    #: A tall image, resized into the 2 x 2 tile grid with padding columns that unpadding cuts, and a wide one in 1 x 2.
    SIZES = ((60, 20), (30, 60))

    def tile_grid(self, image_size: list[int]) -> tuple[int, int]:
        """The (rows, columns) of tiles the processor cuts an image of ``image_size`` into, besides its base tile."""
        tile = self.model.vision.image_size
        height, width = select_best_resolution(image_size, self.model.processor.image_processor.image_grid_pinpoints)
        return height // tile, width // tile

    def kept_patches(self, image_size: list[int]) -> tuple[slice, slice]:
        """The rows and columns of an image's stitched patch grid that unpadding keeps: the image, not its padding."""
        side = self.model.vision.image_size // self.model.vision.patch_size
        rows, columns = (count * side for count in self.tile_grid(image_size))
        height, width = image_size
        if width / height > columns / rows:
            padding = (rows - int(round(height * columns / width, 7))) // 2
            return slice(padding, rows - padding), slice(0, columns)
        padding = (columns - int(round(width * rows / height, 7))) // 2
        return slice(0, rows), slice(padding, columns - padding)

    def expected_patches(self, encoding) -> tuple[int, int]:
        """One row per tile the processor made: its non-padding tiles, as many as each image's size implies."""
        pixels = encoding["pixel_values"]
        tiles = (pixels.flatten(2) != 0).any(-1).sum(-1).tolist()
        implied = [rows * columns + 1 for rows, columns in map(self.tile_grid, encoding["image_sizes"].tolist())]
        assert tiles == implied, f"tiles per image in pixel_values {tiles}, implied by image_sizes {implied}"
        return sum(tiles), (self.model.vision.image_size // self.model.vision.patch_size) ** 2

    def test_the_projector_takes_the_second_to_last_block_without_its_cls_token(self) -> None:
        with self.model.trace(self.encoding()):
            stream = self.model.vision.layers[-2].layer_output.save()
            entering = self.model.projector.input.save()
        close(entering, stream[:, 1:], what="projector.input vs vision.layers[-2].layer_output[:, 1:]")

    def test_each_image_gets_the_tokens_its_size_implies(self) -> None:
        encoding = self.encoding()
        with self.model.trace(encoding):
            mask = self.model.vision.image_token_mask.save()
        base = (self.model.vision.image_size // self.model.vision.patch_size) ** 2
        expected = []
        for image_size in encoding["image_sizes"].tolist():
            rows, columns = self.kept_patches(image_size)
            expected.append(base + (rows.stop - rows.start) * (columns.stop - columns.start + 1))
        assert [end - start for start, end in runs(mask[0])] == expected
        tall = encoding["image_sizes"][0].tolist()
        columns = self.kept_patches(tall)[1]
        side = self.model.vision.image_size // self.model.vision.patch_size
        assert columns.stop - columns.start < self.tile_grid(tall)[1] * side, "the tall image lost no padding column"

    def test_image_features_are_the_base_tile_then_the_unpadded_grid_row_by_row_with_newlines(self) -> None:
        encoding = self.encoding()
        with self.model.trace(encoding):
            tiles = self.model.projector.output.save()
            features = self.model.vision.image_features.save()
            mask = self.model.vision.image_token_mask.save()
        side = self.model.vision.image_size // self.model.vision.patch_size
        newline = self.model._module.model.image_newline.detach()
        first, expected = 0, []
        for image_size in encoding["image_sizes"].tolist():
            rows, columns = self.tile_grid(image_size)
            grid = tiles[first + 1 : first + 1 + rows * columns].reshape(rows, columns, side, side, -1)
            grid = grid.permute(0, 2, 1, 3, 4).reshape(rows * side, columns * side, -1)[self.kept_patches(image_size)]
            grid = torch.cat([grid, newline.expand(grid.shape[0], 1, -1)], dim=1)
            expected += [tiles[first], grid.flatten(0, 1)]
            first += 1 + rows * columns
        assert first == tiles.shape[0]
        assert len(runs(mask[0])) == len(self.SIZES)
        close(features, torch.cat(expected), what="image_features vs base tile + unpadded grid rows + newlines")
