from nnterp.testing.vision import VisionSuite


class TestLlava(VisionSuite):
    family = "llava"
