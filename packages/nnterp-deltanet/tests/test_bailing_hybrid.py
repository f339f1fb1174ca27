import pytest

pytest.importorskip("transformers.models.bailing_hybrid", reason="Bailing-Hybrid ships from transformers 5.20")

from nnterp.testing import (
    draw_selection_bias,  # noqa: E402
    family_suite,  # noqa: E402
)


class TestBailingHybrid(family_suite("bailing_hybrid")):
    @classmethod
    def build_model(cls):
        # A checkpoint's selection bias is learned; the tiny model's zeros would leave the scoring's bias unchecked.
        return draw_selection_bias(super().build_model(), 0.02)
