import math

import pytest
import torch

from nnterp.testing import PROMPT, close, family_suite, tiny_standardized


class TestGemma3nText(family_suite("gemma3n_text")):
    def test_a_block_whose_keys_are_reused_refuses_to_be_skipped(self) -> None:
        with pytest.raises(ValueError, match=r"blocks \[3\] attend over its keys"), self.model.trace(PROMPT):
            self.model.layers[2].skip(self.model.layers[2].layer_input)

    def test_the_reusing_block_attends_over_the_keys_and_values_of_the_block_it_reuses(self) -> None:
        saved: list[torch.Tensor] = []  # bound outside: a name first bound inside a trace does not survive it
        with self.model.trace(PROMPT):
            for layer in (2, 3):
                attention = self.model.layers[layer].self_attn
                saved.extend((attention.attention_keys.save(), attention.attention_values.save()))
        close(saved[2], saved[0], what="layers[3]'s keys vs layers[2]'s")
        close(saved[3], saved[1], what="layers[3]'s values vs layers[2]'s")

    def test_an_in_place_key_edit_reaches_the_reusing_block_and_an_assignment_does_not(self) -> None:
        saved: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            saved.append(self.model.layers[3].self_attn.attention_keys.save())
        with self.model.trace(PROMPT):
            self.model.layers[2].self_attn.attention_keys = torch.zeros_like(
                self.model.layers[2].self_attn.attention_keys
            )
            saved.append(self.model.layers[3].self_attn.attention_keys.save())
        with self.model.trace(PROMPT):
            self.model.layers[2].self_attn.attention_keys[:] = 0
            saved.append(self.model.layers[3].self_attn.attention_keys.save())
        clean, assigned, edited = saved
        close(assigned, clean, what="layers[3]'s keys after assigning layers[2]'s")
        close(edited, torch.zeros_like(clean), what="layers[3]'s keys after zeroing layers[2]'s in place")

    def test_the_per_layer_input_reaches_every_stream_but_the_first(self) -> None:
        with self.model.trace(PROMPT):
            clean = self.model.layers[0].layer_output.save()
        with self.model.trace(PROMPT):
            self.model.layers[0].ple.per_layer_output += 1
            moved = self.model.layers[0].layer_output.save()
        close(moved[..., 0, :], clean[..., 0, :], what="stream 0 after adding one to the per-layer output")
        close(moved[..., 1:, :], clean[..., 1:, :] + 1, what="streams 1: after adding one to the per-layer output")

    def test_laurel_output_enters_layer_mid_scaled_by_the_root_of_two(self) -> None:
        with self.model.trace(PROMPT):
            clean = self.model.layers[1].layer_mid.save()
        with self.model.trace(PROMPT):
            self.model.layers[1].laurel.laurel_output += 1
            moved = self.model.layers[1].layer_mid.save()
        close(moved, clean + 1 / math.sqrt(2), what="layers[1].layer_mid after adding one to laurel_output")

    def test_a_predicted_stream_write_changes_only_that_stream_and_the_active_one_downstream(self) -> None:
        """AltUp corrects each stream from its own prediction: a write to a carried stream's prediction moves it alone."""
        block = self.model.layers[0]
        clean: list[torch.Tensor] = []
        moved: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            clean.extend((block.active_output.save(), block.layer_output.save()))
        with self.model.trace(PROMPT):
            block.predicted_streams[..., 2, :] += 1
            moved.extend((block.active_output.save(), block.layer_output.save()))
        close(moved[0], clean[0], what="active_output after moving a carried stream's prediction")
        close(moved[1][..., :2, :], clean[1][..., :2, :], what="streams 0 and 1 after moving stream 2's prediction")
        close(moved[1][..., 2, :], clean[1][..., 2, :] + 1, what="stream 2 after moving its prediction")


def test_a_stream_value_in_a_trace_of_several_invokes_raises_saying_to_use_one():
    model = tiny_standardized("gemma3n_text")
    for value in ("layer_input", "predicted_streams", "layer_output"):
        with pytest.raises(ValueError, match=r"streams-first.*in a trace with one invoke"):
            with model.trace() as tracer:
                with tracer.invoke("Hello there"):
                    getattr(model.layers[0], value).save()
                with tracer.invoke("Hi you over there friend"):
                    getattr(model.layers[0], value).save()
    with model.trace(["Hello there", "Hi you over there friend"]):
        batched = model.layers[0].layer_input.save()
    assert batched.shape[0] == 2 and batched.shape[2] == model._module.config.altup_num_inputs
