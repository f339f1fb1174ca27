"""TokenMixingSuite: a recurrent mixer's token mixing is the exact linear map from its values to its head outputs.

``token_mixing`` and ``mixing_offset`` are computed from the kernel call's
arguments; the head outputs are what the kernel itself returned. The suite checks
``mixed(token_mixing, attention_values) + mixing_offset == attention_head_outputs``
on a prompt, a left-padded batch, every decode step of ``generate``, in bfloat16,
and with the values replaced by random ones, which a matrix fitted to one set of
values could not follow. ``RecurrentMixerSuite`` carries it, so every recurrent
family runs it with its own helpers (``recurrent_layers``, ``mixer``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..analysis.mixing import mixed
from .models import tiny_standardized
from .suites import BATCH, PROMPT

#: How far ``mixed(M, values) + offset`` may be from the head outputs, relative to their largest entry (float32).
MIXING_TOLERANCE = 1e-5
#: The same in bfloat16, where the kernel rounds its output once and the mixing is float32 from rounded arguments.
BFLOAT16_MIXING_TOLERANCE = 2e-2


def reconstruction_error(
    matrix: torch.Tensor, offset: torch.Tensor, values: torch.Tensor, outputs: torch.Tensor
) -> float:
    """``mixed(matrix, values) + offset`` against ``outputs``: the largest difference over ``outputs``' largest entry."""
    rebuilt = mixed(matrix.float(), values.float()) + offset.float()
    assert rebuilt.shape == outputs.shape, f"rebuilt {tuple(rebuilt.shape)} != head outputs {tuple(outputs.shape)}"
    return ((rebuilt - outputs.float()).abs().max() / outputs.float().abs().max()).item()


class TokenMixingSuite:
    """``token_mixing`` rebuilds every head output of every recurrent mixer from its values, exactly."""

    @staticmethod
    def read_mixing(mixer: Any) -> tuple[Any, ...]:
        """Inside a trace: (values, matrix, offset, head outputs) of ``mixer``'s call, saved, in the forward's order."""
        values = mixer.attention_values.save()
        matrix = mixer.token_mixing().save()
        offset = mixer.mixing_offset().save()
        return values, matrix, offset, mixer.attention_head_outputs.save()

    def check_reconstruction(self, read: list[tuple[Any, ...]], what: str, tolerance: float = MIXING_TOLERANCE) -> None:
        assert read, f"{what}: nothing was read"
        for layer, (values, matrix, offset, outputs) in read:
            seq = values.shape[1]
            assert matrix.shape[-2:] == (outputs.shape[1], seq), f"{what}: layers[{layer}] matrix {tuple(matrix.shape)}"
            error = reconstruction_error(matrix, offset, values, outputs)
            assert error <= tolerance, f"{what}: layers[{layer}] mixed(M, values) + offset is {error:.2e} off"

    def test_token_mixing_rebuilds_the_head_outputs(self) -> None:
        read: list[tuple[int, tuple[Any, ...]]] = []
        with self.model.trace(PROMPT):
            read.extend((layer, self.read_mixing(self.mixer(layer))) for layer in self.recurrent_layers())
        self.check_reconstruction(read, "a prompt")
        for layer, (_, matrix, _, _) in read:
            future = torch.ones(matrix.shape[-2:], dtype=torch.bool).triu(1)
            assert not matrix[..., future].any(), f"layers[{layer}]: a token mixes a later token's value"

    def test_token_mixing_follows_values_it_never_saw(self) -> None:
        """With the values replaced, the same matrix mixes the new ones: it is the map, not a fit to one input."""
        layer = self.recurrent_layers()[0]
        mixer = self.mixer(layer)
        read: list[tuple[int, tuple[Any, ...]]] = []
        with self.model.trace(PROMPT):
            original = mixer.attention_values.save()
            replaced = torch.randn_like(original) * original.abs().max()
            mixer.attention_values = replaced
            values, matrix, offset, outputs = self.read_mixing(mixer)
            read.append((layer, (values, matrix, offset, outputs)))
        assert not torch.equal(values, original), "the assignment did not replace the values"
        self.check_reconstruction(read, "replaced values")

    def test_token_mixing_in_a_left_padded_batch(self) -> None:
        tokenizer = self.model.tokenizer
        side, tokenizer.padding_side = tokenizer.padding_side, "left"
        read: list[tuple[int, tuple[Any, ...]]] = []
        try:
            with self.model.trace(list(BATCH)):
                read.extend((layer, self.read_mixing(self.mixer(layer))) for layer in self.recurrent_layers())
        finally:
            tokenizer.padding_side = side
        self.check_reconstruction(read, "a left-padded batch")

    def test_token_mixing_on_decode_steps_reads_the_cached_state_through_the_offset(self) -> None:
        steps = 3
        layer = self.recurrent_layers()[0]
        read: list[tuple[int, tuple[Any, ...]]] = []
        with self.model.generate(PROMPT, max_new_tokens=steps, min_new_tokens=steps, do_sample=False) as tracer:
            for _ in tracer.iter[:steps]:
                read.append((layer, self.read_mixing(self.mixer(layer))))
        assert len(read) == steps
        self.check_reconstruction(read, "decode steps")
        prompt_matrix, decode_matrix = read[0][1][1], read[1][1][1]
        assert prompt_matrix.shape[-2] > 1 and decode_matrix.shape[-2:] == (1, 1), "a decode step mixes one token"

    def test_token_mixing_in_bfloat16(self) -> None:
        model = tiny_standardized(self.family, dtype=torch.bfloat16, **self.load)
        layer = self.recurrent_layers()[0]
        read: list[tuple[int, tuple[Any, ...]]] = []
        with model.trace(PROMPT):
            read.append((layer, self.read_mixing(model.layers[layer].linear_attn)))
        assert read[0][1][1].dtype == torch.float32, "token_mixing is float32"
        self.check_reconstruction(read, "bfloat16", BFLOAT16_MIXING_TOLERANCE)

    def test_read_state_of_the_state_after_a_token_is_its_head_output(self) -> None:
        """The mixer's readout: each token's output is what its query reads from the state after it."""
        mixer = self.mixer(self.recurrent_layers()[0])
        read: list[Any] = []
        with self.model.trace(PROMPT):
            states = mixer.state_trajectory.save()
            read.append(mixer.attention_head_outputs.save())
            read.extend(mixer.read_state(states[:, t], positions=t).save() for t in range(states.shape[1]))
        outputs, answers = read[0], torch.stack(read[1:], dim=1)
        assert answers.shape == outputs.shape, f"read_state: {tuple(answers.shape)} != {tuple(outputs.shape)}"
        torch.testing.assert_close(answers, outputs.float(), rtol=1e-4, atol=1e-5)
        with self.model.trace(PROMPT):
            states = mixer.state_trajectory.save()
            read.append(mixer.read_state(torch.zeros_like(states[:, -1]), positions=[0, -1]).save())
        # a random Mamba's state adds little next to its skip term, but not nothing
        assert (read[-1] - answers[:, [0, -1]]).abs().max() > 0, "read_state answered without reading the state"

    def test_token_mixing_selections_are_slices_of_the_full_matrix(self) -> None:
        mixer = self.mixer(self.recurrent_layers()[0])
        selections = ({"positions": [-1, 2]}, {"positions": 3, "heads": 0}, {"heads": slice(1, None)})
        read: list[Any] = []
        with self.model.trace(PROMPT):
            full = mixer.token_mixing().save()
            offset = mixer.mixing_offset().save()
            read.extend(
                (mixer.token_mixing(**chosen).save(), mixer.mixing_offset(**chosen).save()) for chosen in selections
            )
        expected = (
            (full[:, :, [-1, 2]], offset[:, [-1, 2]]),
            (full[:, 0, 3], offset[:, 3, 0]),
            (full[:, 1:], offset[:, :, 1:]),
        )
        for chosen, (matrix, rest), (want, want_rest) in zip(selections, read, expected, strict=True):
            assert matrix.shape == want.shape and rest.shape == want_rest.shape, f"{chosen}: shapes"
            torch.testing.assert_close(matrix, want, rtol=1e-5, atol=1e-6, msg=f"{chosen}: matrix")
            torch.testing.assert_close(rest, want_rest, rtol=1e-5, atol=1e-6, msg=f"{chosen}: offset")
