from nnterp_deltanet.testing import Glm5NextVisionSuite


class TestGlm5NextVision(Glm5NextVisionSuite):
    family = "glm5_next"
