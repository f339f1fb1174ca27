"""Tiny multimodal models, their processors and images, built locally, and the suite a vision family mixes in.

A vision family module carries, beside ``MODEL_TYPES``, ``ENVOYS``, ``RENAME``
and ``TINY_CONFIG`` (with its ``text_config`` and ``vision_config``):

- ``IMAGE_TOKENS``: the special tokens its processor writes, added to the
  local tokenizer in order, so they take ids 75, 76, ... (the local
  tokenizer's 75 symbols come first); ``TINY_CONFIG`` names those ids.
- ``IMAGE_PROMPT``: what marks one image in a prompt, which the processor
  expands into the image's tokens.
- ``tiny_processor(tokenizer)``: the family's processor over that tokenizer,
  built from its defaults with a pillow image processor.
- ``PROCESSOR_NEEDS_TORCHVISION = True``, where ``AutoProcessor`` rebuilds the
  family's saved processor only with torchvision's image processor: a load by
  path is then given the processor.
- ``NO_IMAGES``, where the installed transformers cannot run the wrapper on
  images: the reason (the vision suite skips with it).
- ``tiny_weights(model)``, optional: random values for what the wrapper
  initializes to a constant (Gemma-3's projection is zero, which would zero
  every image feature).
"""

from __future__ import annotations

import os
import tempfile
import unittest
from types import ModuleType
from typing import Any, ClassVar

import torch

from ..availability import Unavailable
from ..family import declared
from ..order import OrderError
from ..transformer import StandardizedTransformer
from .models import _family, tiny_config
from .suites import Suite, close, raises
from .tokenizer import local_tokenizer


def vision_tokenizer(family: str | ModuleType) -> Any:
    """The local tokenizer with the family's image tokens added after its characters."""
    family = _family(family)
    text = family.TINY_CONFIG["text_config"]
    tokenizer = local_tokenizer(text["vocab_size"])
    tokenizer.add_special_tokens({"additional_special_tokens": list(family.IMAGE_TOKENS)})
    return tokenizer


def tiny_processor(family: str | ModuleType) -> Any:
    """The family's processor over the local tokenizer with its image tokens."""
    family = _family(family)
    return family.tiny_processor(vision_tokenizer(family))


def tiny_vision_model(family: str | ModuleType, attn_implementation: str = "eager", seed: int = 0) -> Any:
    """A random-weight multimodal wrapper of the family from its tiny config, its image token the tokenizer's."""
    from transformers import AutoModelForImageTextToText

    family = _family(family)
    image_token_id = vision_tokenizer(family).convert_tokens_to_ids(family.IMAGE_TOKENS[0])
    torch.manual_seed(seed)
    config = tiny_config(family, **{"image_token_id": image_token_id, **family.TINY_CONFIG})
    model = AutoModelForImageTextToText.from_config(config, attn_implementation=attn_implementation).eval()
    tiny_weights = declared(family).tiny_weights
    if tiny_weights is not None:
        tiny_weights(model)
    return model


def tiny_vision_standardized(family: str | ModuleType, **kwargs: Any) -> StandardizedTransformer:
    """A tiny multimodal model of the family under the standard names, loaded with its processor."""
    return StandardizedTransformer(tiny_vision_model(family, **kwargs), processor=tiny_processor(family))


def save_tiny_vision(family: str | ModuleType, directory: str | os.PathLike, **kwargs: Any) -> str:
    """Save a tiny multimodal model of the family with its processor to ``directory``; returns it."""
    tiny_vision_model(family, **kwargs).save_pretrained(directory)
    tiny_processor(family).save_pretrained(directory)
    return os.fspath(directory)


def tiny_images(*sizes: tuple[int, int], seed: int = 0) -> list[Any]:
    """Random RGB images of the given (height, width), as pillow images."""
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    return [
        Image.fromarray(torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8).numpy())
        for height, width in sizes
    ]


def _missing_torchvision(error: BaseException | None) -> bool:
    """Whether ``error``, or an error it was raised from, is torchvision's absence (transformers re-raises it)."""
    while error is not None:
        if isinstance(error, ModuleNotFoundError) and error.name == "torchvision":
            return True
        error = error.__cause__ or error.__context__
    return False


class VisionSuite(Suite):
    """A vision tower and where its images meet the text model: identities, writes that reach the text, the processor's split.

    ``SIZES`` are the (height, width) of the images a test prompt carries; the
    family's ``IMAGE_PROMPT`` marks each in the prompt.
    """

    #: Two images of different sizes, as one prompt carries them.
    SIZES: ClassVar[tuple[tuple[int, int], ...]] = ((40, 50), (30, 60))

    @classmethod
    def setup_class(cls) -> None:
        reason = declared(_family(cls.family)).NO_IMAGES
        if reason is not None:
            raise unittest.SkipTest(reason)
        try:
            super().setup_class()
        except ModuleNotFoundError as error:
            if not _missing_torchvision(error):
                raise
            raise unittest.SkipTest(
                f"this transformers builds {cls.family}'s processor only with torchvision, which is not installed"
            ) from error

    @classmethod
    def build_model(cls) -> StandardizedTransformer:
        return tiny_vision_standardized(cls.family, **cls.load)

    @classmethod
    def load_saved(cls, directory: str) -> StandardizedTransformer:
        needs_torchvision = declared(_family(cls.family)).PROCESSOR_NEEDS_TORCHVISION
        processor = tiny_processor(cls.family) if needs_torchvision else None
        return StandardizedTransformer(directory, processor=processor, **cls.load)

    @classmethod
    def save_model(cls, directory: str) -> None:
        save_tiny_vision(cls.family, directory, **cls.load)

    @classmethod
    def same_model(cls, loaded: StandardizedTransformer) -> StandardizedTransformer:
        return StandardizedTransformer(tiny_vision_model(cls.family, **cls.load), processor=loaded.processor)

    def prompt(self, count: int = 2) -> str:
        """A prompt marking ``count`` images."""
        return "hi " + " and ".join([self.model.family.IMAGE_PROMPT] * count) + " there"

    def encoding(self, count: int = 2) -> Any:
        """The processor's output for a prompt carrying the first ``count`` of ``SIZES``."""
        return self.model.processor(
            text=self.prompt(count), images=tiny_images(*self.SIZES[:count]), return_tensors="pt"
        )

    def expected_patches(self, encoding: Any) -> tuple[int, int]:
        """The (images, patches) axes of ``patch_embeddings`` the processor's output implies.

        A packed tower: one row of every image's patches (``patches_per_image``).
        A tower its processor hands patches, ``[images, patches, patch_pixels]``
        (Gemma-4's, each image padded to a patch budget): one row per image of
        those patches. A fixed-resolution tower: one row per image (or tile),
        the square grid of its configured image size.
        """
        vision = self.model.vision
        if hasattr(type(vision), "patches_per_image"):
            return 1, sum(vision.patches_per_image(encoding))
        pixels = encoding["pixel_values"]
        if pixels.dim() == 3:
            return tuple(pixels.shape[:2])
        # Tiles (LLaVA-NeXT's anyres), [images, tiles, 3, H, W], padded with zero tiles the tower does not run on.
        rows = int((pixels.flatten(2) != 0).any(-1).sum()) if pixels.dim() == 5 else pixels.shape[0]
        return rows, (vision.image_size // vision.patch_size) ** 2

    # -- the tower --------------------------------------------------------------------------

    def test_tower_blocks_add_up(self) -> None:
        streams: list[tuple] = []
        with self.model.trace(self.encoding()):
            for layer in self.model.vision.layers:
                streams.append(
                    (layer.layer_input.save(), layer.self_attn.attention_output.save(), layer.layer_mid.save())
                    + (layer.mlp_norm_output.save(), layer.mlp.mlp_output.save(), layer.layer_output.save())
                )
        for i, (entering, attention, mid, normed, mlp, leaving) in enumerate(streams):
            close(entering + attention, mid, what=f"vision.layers[{i}].layer_mid")
            close(mid + mlp, leaving, what=f"vision.layers[{i}]: layer_mid + mlp_output")
            assert not torch.allclose(normed, mid), f"vision.layers[{i}].mlp_norm_output is the unnormed stream"
        assert not torch.equal(streams[-1][0], streams[-1][-1]), "the last block leaves its stream unchanged"

    def test_patches_match_the_processor(self) -> None:
        encoding = self.encoding()
        with self.model.trace(encoding):
            patches = self.model.vision.patch_embeddings.save()
        assert patches.shape[:2] == self.expected_patches(encoding), (
            f"patch_embeddings is {tuple(patches.shape)}; the processor's output implies "
            f"{self.expected_patches(encoding)} images x patches"
        )
        assert patches.shape[2] == self.model.vision.vision_hidden_size

    def test_tower_attention_pattern_is_recomputed_from_its_queries_and_keys(self) -> None:
        attention = self.model.vision.layers[0].self_attn
        if attention.support()["attention_probabilities"] is not None:
            return
        with self.model.trace(self.encoding()):
            queries = attention.attention_queries.save()
            keys = attention.attention_keys.save()
            pattern = attention.attention_probabilities.save()
        # the module's own scale where it states one (Gemma-4's tower scales by one: its queries and keys are normed)
        scores = queries @ keys.transpose(-1, -2) * getattr(attention._module, "scaling", queries.shape[-1] ** -0.5)
        # A packed tower masks other images' patches out; its pattern is zero there.
        masked = pattern == 0
        expected = torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1)
        close(pattern, expected, what="vision.layers[0].self_attn.attention_probabilities")

    # -- where the images meet the text ---------------------------------------------------------

    def test_image_features_are_the_text_input_at_image_tokens(self) -> None:
        encoding = self.encoding()
        with self.model.trace(encoding):
            features = self.model.vision.image_features.save()
            mask = self.model.vision.image_token_mask.save()
            entering = self.model.layers[0].layer_input.save()
        assert mask.dtype == torch.bool and mask.shape == encoding["input_ids"].shape
        assert int(mask.sum()) == features.shape[0] > 0
        entering = entering[mask]
        if entering.dim() > features.dim():  # several residual streams, each starting as the embeddings
            features = features.unsqueeze(-2).expand_as(entering)
        close(entering, features.to(entering.dtype), what="each stream of layers[0].layer_input[image_token_mask]")

    def test_writing_image_features_changes_the_text_from_the_first_image_token(self) -> None:
        encoding = self.encoding()
        with self.model.trace(encoding):
            clean = self.model.logits.save()
        with self.model.trace(encoding):
            self.model.vision.image_features = torch.zeros_like(self.model.vision.image_features)
            mask = self.model.vision.image_token_mask.save()
            written = self.model.logits.save()
        first = int(mask[0].nonzero()[0])
        close(written[:, :first], clean[:, :first], what="logits before the first image token")
        assert not torch.allclose(written[:, first:], clean[:, first:]), "the write never reached the text model"

    def test_writing_patch_embeddings_changes_image_features(self) -> None:
        # A fresh load's first trace: the scatter is served after a tower value with nothing instrumented before.
        model = self.build_model()
        encoding = self.encoding()
        with model.trace(encoding):
            model.vision.patch_embeddings[:] = 0
            written = model.vision.image_features.save()
        with model.trace(encoding):
            clean = model.vision.image_features.save()
        assert not torch.allclose(written, clean), "zeroed patch embeddings did not reach image_features"

    def test_a_wrong_sized_image_features_write_is_refused(self) -> None:
        with raises(ValueError, "image_features.*nothing was written"):
            with self.model.trace(self.encoding()):
                self.model.vision.image_features = torch.zeros(1, self.model.hidden_size)

    def test_one_image_and_two_images_of_different_sizes(self) -> None:
        features = []
        for count in (1, 2):
            with self.model.trace(self.encoding(count)):
                features.append(self.model.vision.image_features.save())
        counts = [len(rows) for rows in features]
        assert counts[1] > counts[0] > 0, f"image tokens for one image, two images: {counts}"

    def test_a_trace_takes_text_and_images_by_keyword_as_the_processor_output(self) -> None:
        with self.model.trace(self.encoding()):
            expected = self.model.logits.save()
        with self.model.trace(text=self.prompt(), images=tiny_images(*self.SIZES)):
            logits = self.model.logits.save()
        close(logits, expected, what="logits of trace(text=, images=) vs trace(processor output)")

    def test_generate_sees_the_images_and_serves_their_features_on_the_prompt_step(self) -> None:
        encoding = self.encoding()
        with self.model.generate(encoding, max_new_tokens=3, do_sample=False) as tracer:
            features = self.model.vision.image_features.save()
            ids = tracer.result.save()
        expected = self.model._module.generate(**encoding, max_new_tokens=3, do_sample=False)
        assert torch.equal(ids, expected), f"generated {ids.tolist()}, transformers generates {expected.tolist()}"
        assert features.shape[0] == int((encoding["input_ids"] == self.model.vision.image_token_id).sum())

    def test_a_text_only_prompt_runs_and_serves_no_image_features(self) -> None:
        with self.model.trace("hi there"):
            logits = self.model.logits.save()
        assert logits.shape[:2] == (1, len("hi there"))
        with raises(OrderError, "only in a run whose input carries images"):
            with self.model.trace("hi there"):
                self.model.vision.image_features.save()

    def test_image_tokens_without_an_image_are_refused_before_the_model_runs(self) -> None:
        encoding = self.encoding(1)
        text_only = {name: encoding[name] for name in ("input_ids", "attention_mask")}
        with raises(ValueError, "image token.*but no image"):
            with self.model.trace(text_only):
                self.model.layers[0].layer_input.save()

    # -- what this load has -------------------------------------------------------------------------

    def test_support_lists_the_tower_values(self) -> None:
        support = self.model.vision.support()
        for name in ("patch_embeddings", "tower_output", "image_features", "image_token_mask", "layer_output"):
            assert support[name] is None, f"{name}: {support[name]}"
        block = self.model.vision.support(layer=0)
        assert set(block) >= {"layer_output", "self_attn.attention_output", "mlp.mlp_neurons"}
        missing = {name: reason for name, reason in block.items() if name.startswith("mlp.") and reason is not None}
        assert not missing, f"the tower's MLP values a family's RENAME should reach: {missing}"

    def test_saved_with_its_processor_it_loads_back_by_path_with_its_images(self) -> None:
        encoding = self.encoding()
        with self.model.trace(encoding):
            expected = self.model.vision.image_features.save()
        with tempfile.TemporaryDirectory() as directory:
            self.save_model(directory)
            model = self.load_saved(directory)
            with model.trace(encoding):
                features = model.vision.image_features.save()
        close(features, expected, what="image_features after a save and a load by path")

    def test_a_load_without_a_processor_serves_no_images(self) -> None:
        model = StandardizedTransformer(tiny_vision_model(self.family), tokenizer=vision_tokenizer(self.family))
        vision = getattr(model, "vision", None)
        if vision is None:
            with raises(AttributeError, "no vision tower"):
                model.vision
            return
        assert vision.support() == {}
        for read in (lambda: vision.image_features, lambda: vision.layers[0].self_attn.attention_output):
            with raises(Unavailable, "no image reaches this model"):
                with model.trace("hi there"):
                    read().save()
