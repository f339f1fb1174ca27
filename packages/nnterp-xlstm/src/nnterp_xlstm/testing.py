"""MatrixMemorySuite: the properties of an mLSTM layer's values, checked on a family's tiny model.

Every check compares served values with an independent computation: the xLSTM
paper's recurrence (Beck et al. 2024) in float64 from the served inputs and
gates, transformers' own backend called on the served arguments, the next
call's state, or a changed output after a write.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F

from nnterp.analysis import knock_out
from nnterp.analysis.mixing import mixed
from nnterp.availability import Unavailable
from nnterp.order import OrderError
from nnterp.testing import PROMPT, Suite, blocks_with, check_patch_state_joins_the_prompts, close, tiny_standardized
from nnterp.testing.mixing import TokenMixingSuite
from nnterp.testing.order import TraceOrderSuite
from nnterp.testing.suites import BATCH, raises

#: Decode steps the generate checks take.
STEPS = 3
#: A prompt longer than two chunks of four tokens.
LONG_PROMPT = "Hello world, there you are"
#: Relative tolerance of float32 values against the float64 reference.
RTOL = 1e-4


def paper_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mLSTM of the xLSTM paper in float64, unstabilized, tokens-first: (memories, normalizers, head outputs).

    ``C_t = f_t C_{t-1} + i_t k_t v_t^T``, ``n_t = f_t n_{t-1} + i_t k_t`` with
    ``i_t = exp(i~_t)``, ``f_t = sigmoid(f~_t)``, and ``h_t = C_t^T q_t /
    max(|n_t . q_t|, 1)`` with ``q`` scaled by ``1 / sqrt(d)``. ``state`` is a
    stabilized (C, n, m) to start from, unscaled by ``exp(m)``. The memories
    and normalizers are unstabilized: the kernel's times ``exp(m_t)``.
    """
    q, k, v, i, f = (x.double() for x in (q, k, v, i, f))
    batch, seq, heads, key_dim = k.shape
    if state is None:
        memory = q.new_zeros(batch, heads, key_dim, v.shape[-1])
        normalizer = q.new_zeros(batch, heads, key_dim)
    else:
        scale = state[2].double().reshape(batch, heads).exp()
        memory, normalizer = state[0].double() * scale[..., None, None], state[1].double() * scale[..., None]
    memories, normalizers, outputs = [], [], []
    for t in range(seq):
        forget, write = torch.sigmoid(f[:, t]), torch.exp(i[:, t])
        memory = forget[..., None, None] * memory + write[..., None, None] * k[:, t, ..., None] * v[:, t, :, None, :]
        normalizer = forget[..., None] * normalizer + write[..., None] * k[:, t]
        query = q[:, t] / math.sqrt(key_dim)
        denominator = torch.clamp((normalizer * query).sum(-1).abs(), min=1.0)
        outputs.append(torch.einsum("bhk,bhkv->bhv", query, memory) / denominator[..., None])
        memories.append(memory)
        normalizers.append(normalizer)
    return torch.stack(memories, 1), torch.stack(normalizers, 1), torch.stack(outputs, 1)


def close_relative(actual: torch.Tensor, expected: torch.Tensor, what: str, rtol: float = RTOL) -> None:
    """``actual`` equals ``expected`` up to ``rtol`` of ``expected``'s largest entry."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    scale = expected.double().abs().max().item()
    difference = (actual.double() - expected.double()).abs().max().item()
    assert difference <= rtol * scale, f"{what}: differs by {difference:.3g} of {scale:.3g}"


def unstabilized(served: torch.Tensor, stabilizers: torch.Tensor) -> torch.Tensor:
    """A served memory or normalizer [batch, seq, heads, ...] times ``exp(m)`` [batch, seq, heads]."""
    scale = stabilizers.double().exp()
    return served.double() * scale.reshape(*scale.shape, *[1] * (served.dim() - 3))


def lively_gates(model: Any) -> None:
    """Give every mLSTM input gate a bias from -3 to 3 across heads and every forget gate a bias of 3.

    At initialization the input gates' bias is -10, so a stabilizer never
    takes the input gate's side of its max on a short prompt and a wrong max
    would go unseen; biases around zero take both sides. A forget gate of
    ``sigmoid(3) = 0.95`` keeps most of the memory from token to token, so a
    written state shows at later tokens.
    """
    for layer in blocks_with(model, "linear_attn"):
        module = model.layers[layer].linear_attn._module
        with torch.no_grad():
            if module.config.weight_mode == "single":
                module.igate_preact.bias.copy_(torch.linspace(-3, 3, module.config.num_heads))
                module.fgate_preact.bias.fill_(3.0)
            else:
                heads = module.config.num_heads
                module.ifgate_preact.bias[:heads].copy_(torch.linspace(-3, 3, heads))
                module.ifgate_preact.bias[heads:].fill_(3.0)


class MatrixMemorySuite(TokenMixingSuite, TraceOrderSuite, Suite):
    """The conformance suite of a family with an mLSTM ``MatrixMemory`` at ``linear_attn``."""

    @classmethod
    def build_model(cls) -> Any:
        """The tiny model, with gates that use the recurrence: ``lively_gates``."""
        model = super().build_model()
        lively_gates(model)
        return model

    def recurrent_layers(self) -> list[int]:
        return blocks_with(self.model, "linear_attn")

    def mixer(self, layer: int) -> Any:
        return self.model.layers[layer].linear_attn

    def order_layer(self) -> int:
        return self.recurrent_layers()[0]

    def per_token_states(self) -> Any:
        """The states are computed from the call's arguments: served as they are."""
        return nullcontext()

    def read_call(self, mix: Any) -> dict[str, torch.Tensor]:
        """Inside a trace: every value of one call of ``mix``, saved, in the forward's order."""
        read: dict[str, Any] = {}
        for name in ("attention_queries", "attention_keys", "attention_values", "input_gates", "forget_gates"):
            read[name] = getattr(mix, name).save()
        read["decays"] = mix.decays.save()
        read["state_input"] = mix.state_input.save()
        read["normalizer_input"] = mix.normalizer_input.save()
        read["stabilizer_input"] = mix.stabilizer_input.save()
        read["states"] = mix.states.save()
        read["normalizers"] = mix.normalizers.save()
        read["stabilizers"] = mix.stabilizers.save()
        read["attention_head_outputs"] = mix.attention_head_outputs.save()
        read["output_gates"] = mix.output_gates.save()
        read["state_output"] = mix.state_output.save()
        read["normalizer_output"] = mix.normalizer_output.save()
        read["stabilizer_output"] = mix.stabilizer_output.save()
        read["attention_output"] = mix.attention_output.save()
        return read

    def check_against_the_paper(self, read: dict[str, torch.Tensor], what: str) -> None:
        """The served states, normalizers and head outputs are the paper's recurrence from the served arguments."""
        entering = None
        if read["state_input"] is not None:
            entering = (read["state_input"], read["normalizer_input"], read["stabilizer_input"])
        memories, normalizers, outputs = paper_reference(
            read["attention_queries"],
            read["attention_keys"],
            read["attention_values"],
            read["input_gates"],
            read["forget_gates"],
            entering,
        )
        close_relative(unstabilized(read["states"], read["stabilizers"]), memories, f"{what}: states")
        close_relative(unstabilized(read["normalizers"], read["stabilizers"]), normalizers, f"{what}: normalizers")
        close_relative(read["attention_head_outputs"], outputs, f"{what}: head outputs")
        close_relative(read["states"][:, -1], read["state_output"], f"{what}: states[:, -1] vs state_output")
        close_relative(read["normalizers"][:, -1], read["normalizer_output"], f"{what}: last normalizer")
        close(read["stabilizers"][:, -1], read["stabilizer_output"], what=f"{what}: last stabilizer")
        close(read["decays"], F.logsigmoid(read["forget_gates"]), what=f"{what}: decays")

    # -- prompts -----------------------------------------------------------------------

    def test_states_and_head_outputs_are_the_papers_recurrence(self) -> None:
        reads = []
        with self.model.trace(PROMPT):
            for layer in self.recurrent_layers():
                reads.append(self.read_call(self.mixer(layer)))
        for layer, read in zip(self.recurrent_layers(), reads, strict=True):
            assert read["states"].shape[1] == read["attention_queries"].shape[1] > 1
            self.check_against_the_paper(read, f"layers[{layer}] on a prompt")

    def test_head_outputs_are_transformers_backend_on_the_served_arguments(self) -> None:
        """transformers' own backend, called on the served arguments outside any trace, returns the served results."""
        mix = self.mixer(self.recurrent_layers()[0])
        read: dict[str, Any] = {}
        with self.model.trace(PROMPT):
            read.update(self.read_call(mix))
        backend = mix._module.mlstm_backend
        with torch.no_grad():
            h, (memory, normalizer, stabilizer) = backend(
                query=read["attention_queries"].transpose(1, 2),
                key=read["attention_keys"].transpose(1, 2),
                value=read["attention_values"].transpose(1, 2),
                igate=read["input_gates"].transpose(1, 2),
                fgate=read["forget_gates"].transpose(1, 2),
                c_initial=read["state_input"],
                n_initial=read["normalizer_input"],
                m_initial=read["stabilizer_input"][..., None],
            )
        assert torch.equal(h.transpose(1, 2), read["attention_head_outputs"])
        assert torch.equal(memory, read["state_output"]) and torch.equal(stabilizer[..., 0], read["stabilizer_output"])
        assert torch.equal(normalizer, read["normalizer_output"])

    def test_head_outputs_through_the_layers_tail_are_its_output(self) -> None:
        """out_proj(output_gate * multihead_norm(h)) is the mixer's output: the served h is the one the layer uses."""
        mix = self.mixer(self.recurrent_layers()[0])
        read: dict[str, Any] = {}
        with self.model.trace(PROMPT):
            read.update(self.read_call(mix))
        module = mix._module
        with torch.no_grad():
            normed = module.multihead_norm(read["attention_head_outputs"])
            expected = module.out_proj(read["output_gates"].flatten(-2) * normed)
        close(read["attention_output"], expected, what="attention_output")

    def test_a_left_padded_batch_follows_the_recurrence(self) -> None:
        tokenizer = self.model.tokenizer
        side, tokenizer.padding_side = tokenizer.padding_side, "left"
        read: dict[str, Any] = {}
        try:
            with self.model.trace(list(BATCH)):
                read.update(self.read_call(self.mixer(self.recurrent_layers()[0])))
        finally:
            tokenizer.padding_side = side
        assert read["attention_queries"].shape[0] == len(BATCH)
        self.check_against_the_paper(read, "a left-padded batch")

    def test_token_mixing_times_the_denominators_is_the_numerators_mixing(self) -> None:
        """``mixed(M, v) * den`` is ``q_t C_t / sqrt(d)``, the numerator, from the paper's float64 memories."""
        mix = self.mixer(self.recurrent_layers()[0])
        read: dict[str, Any] = {}
        with self.model.trace(PROMPT):
            read.update(self.read_call(mix))
            matrix = mix.token_mixing().save()
            denominators = mix.readout_denominators().save()
        memories, _, _ = paper_reference(
            read["attention_queries"],
            read["attention_keys"],
            read["attention_values"],
            read["input_gates"],
            read["forget_gates"],
        )
        query = read["attention_queries"].double() / math.sqrt(read["attention_queries"].shape[-1])
        numerator = torch.einsum("bthk,bthkv->bthv", query, memories)
        stabilizer = read["stabilizers"].double().exp()[..., None]
        close_relative(mixed(matrix, read["attention_values"]) * denominators[..., None], numerator / stabilizer, "num")
        assert (denominators > 0).all()

    def test_a_prompt_through_the_chunkwise_kernel_is_the_same_recurrence(self) -> None:
        """With ``chunk_size=4`` the backend runs whole chunks through its chunkwise kernel, the rest token by token."""
        model = tiny_standardized(self.family, chunk_size=4, **self.load)
        mix = model.layers[self.recurrent_layers()[0]].linear_attn
        read: dict[str, Any] = {}
        with model.trace(LONG_PROMPT):
            read.update(self.read_call(mix))
            read["matrix"] = mix.token_mixing().save()
            read["offset"] = mix.mixing_offset().save()
        assert read["states"].shape[1] > 8, "the prompt does not span two chunks"
        self.check_against_the_paper(read, "a prompt through the chunkwise kernel")
        mixing = (read["attention_values"], read["matrix"], read["offset"], read["attention_head_outputs"])
        self.check_reconstruction([(0, mixing)], "a prompt through the chunkwise kernel")

    def test_a_knocked_out_token_writes_nothing_later_tokens_read(self) -> None:
        """``knock_out`` sets the token's input gate to -inf: the paper's recurrence without its write, exactly."""
        mix = self.mixer(self.recurrent_layers()[0])
        j = 2
        plain: dict[str, Any] = {}
        with self.model.trace(PROMPT):
            plain.update(self.read_call(mix))
        read: dict[str, Any] = {}
        with self.model.trace(PROMPT):
            knock_out(self.model, [j], layers=[self.recurrent_layers()[0]])
            read.update(self.read_call(mix))
            read["matrix"] = mix.token_mixing().save()
        assert torch.isinf(read["input_gates"][:, j]).all()
        self.check_against_the_paper(read, "a knocked-out token")
        close(read["attention_head_outputs"][:, :j], plain["attention_head_outputs"][:, :j], what="before the token")
        assert not read["matrix"][..., j].any(), "a later token still mixes the knocked-out value"
        assert not torch.equal(read["attention_head_outputs"][:, j:], plain["attention_head_outputs"][:, j:])

    # -- decode steps --------------------------------------------------------------------

    def test_decode_steps_continue_the_state_output(self) -> None:
        mix = self.mixer(self.recurrent_layers()[0])
        reads = []
        with self.model.generate(PROMPT, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False) as tracer:
            for _ in tracer.iter[:STEPS]:
                reads.append(self.read_call(mix))
        assert len(reads) == STEPS
        for step in range(1, STEPS):
            read, before = reads[step], reads[step - 1]
            assert read["attention_queries"].shape[1] == 1, "a decode step is one token"
            assert torch.equal(read["state_input"], before["state_output"]), f"step {step}: state_input"
            assert torch.equal(read["normalizer_input"], before["normalizer_output"])
            assert torch.equal(read["stabilizer_input"], before["stabilizer_output"])
            self.check_against_the_paper(read, f"decode step {step}")

    def test_a_written_state_output_is_the_next_steps_state_input(self) -> None:
        mix = self.mixer(self.recurrent_layers()[0])
        inputs = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for step in tracer.iter[:2]:
                if step == 0:
                    written = mix.state_output * 3.0 + 1.0
                    mix.state_output = written
                    inputs.append(written.save())
                else:
                    inputs.append(mix.state_input.save())
        assert torch.equal(inputs[1], inputs[0]), "the next step did not start from the written state"

    def test_state_input_written_on_a_decode_step_is_continued(self) -> None:
        mix = self.mixer(self.recurrent_layers()[0])
        reads = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[1:2]:
                mix.state_input = mix.state_input * 0.0
                reads.append(self.read_call(mix))
        read = reads[0]
        assert not read["state_input"].any(), "state_input did not read back as written"
        self.check_against_the_paper(read, "a decode step from a written state_input")

    # -- writes --------------------------------------------------------------------------

    def test_a_written_state_is_continued_by_later_tokens_only(self) -> None:
        mix = self.mixer(self.recurrent_layers()[0])
        t = 2
        plain: dict[str, Any] = {}
        with self.model.trace(PROMPT):
            plain.update(self.read_call(mix))
            plain["logits"] = self.model.logits.save()
        changed: dict[str, Any] = {}
        with self.model.trace(PROMPT):
            states = mix.states
            changed["written"] = (states[:, t] + torch.randn_like(states[:, t]) * states[:, t].abs().max() * 10).save()
            mix.set_state_after(t, changed["written"])
            changed["head_outputs"] = mix.attention_head_outputs.save()
            changed["final"] = mix.state_output.save()
            changed["logits"] = self.model.logits.save()
        written, head_outputs, final = changed["written"], changed["head_outputs"], changed["final"]
        logits, changed_logits = plain["logits"], changed["logits"]
        close(head_outputs[:, :t], plain["attention_head_outputs"][:, :t], what="tokens before the write")
        assert (head_outputs[:, t:] - plain["attention_head_outputs"][:, t:]).abs().amax(dim=(0, 2, 3)).min() > 0
        assert not torch.equal(changed_logits[:, t:], logits[:, t:])
        # the paper's recurrence from the written memory at t (the normalizer and stabilizer as the model had them)
        stabilizer = plain["stabilizers"][:, t]
        entering = (written, plain["normalizers"][:, t], stabilizer)
        tail = slice(t + 1, None)
        _, _, outputs = paper_reference(
            *(plain[name][:, tail] for name in ("attention_queries", "attention_keys", "attention_values")),
            plain["input_gates"][:, tail],
            plain["forget_gates"][:, tail],
            entering,
        )
        close_relative(head_outputs[:, tail], outputs, "head outputs after the written state")
        memories, _, _ = paper_reference(
            *(plain[name][:, tail] for name in ("attention_queries", "attention_keys", "attention_values")),
            plain["input_gates"][:, tail],
            plain["forget_gates"][:, tail],
            entering,
        )
        close_relative(unstabilized(final[:, None], plain["stabilizer_output"][:, None])[:, 0], memories[:, -1], "C")

    def test_a_state_written_on_a_decode_step_is_read_and_carried(self) -> None:
        """``set_state_after(0, C)`` on a decode step: the step's head output reads ``C``, the next step starts from it."""
        mix = self.mixer(self.recurrent_layers()[0])
        out: list[Any] = []
        with self.model.generate(PROMPT, max_new_tokens=3, min_new_tokens=3, do_sample=False) as tracer:
            for step in tracer.iter[:3]:
                if step == 1:
                    out.append(mix.attention_queries.save())
                    states = mix.states
                    written = states[:, 0] * 5.0 + 1.0
                    mix.set_state_after(0, written)
                    out.append(written.save())
                    out.append(mix.attention_head_outputs.save())
                    out.append(mix.normalizer_output.save())
                    out.append(mix.stabilizer_output.save())
                if step == 2:
                    out.append(mix.state_input.save())
        queries, written, head_outputs, normalizer, stabilizer, next_input = out
        close_relative(next_input, written, "the next step's state_input")
        query = queries[:, 0].double() / math.sqrt(queries.shape[-1])
        denominator = torch.maximum((query * normalizer.double()).sum(-1).abs(), torch.exp(-stabilizer.double()))
        expected = (
            torch.einsum("bhk,bhkv->bhv", query, written.double()) / (denominator + self.mixer_eps(mix))[..., None]
        )
        close_relative(head_outputs[:, 0], expected, "the step's head output from the written memory")

    @staticmethod
    def mixer_eps(mix: Any) -> float:
        return mix._module.config.eps

    def test_a_written_state_input_on_a_prompt_is_continued(self) -> None:
        mix = self.mixer(self.recurrent_layers()[0])
        read: dict[str, Any] = {}
        with self.model.trace(PROMPT):
            entering = mix.state_input
            mix.state_input = torch.randn_like(entering)
            read.update(self.read_call(mix))
        assert read["state_input"].any()
        self.check_against_the_paper(read, "a prompt from a written state_input")

    def test_wrong_writes_and_late_writes_are_refused(self) -> None:
        mix = self.mixer(self.recurrent_layers()[0])
        with raises(Unavailable, "partial"):
            with self.model.trace(PROMPT):
                mix.state.save()
        with raises(ValueError, "key_dim, value_dim"):
            with self.model.trace(PROMPT):
                mix.set_state_after(1, torch.zeros(1, 2, 3))
        with raises(OrderError, "passed token 1"):
            with self.model.trace(PROMPT):
                mix.attention_head_outputs.save()
                mix.set_state_after(1, torch.zeros(1))
        with raises(ValueError, "use_cache=False"):
            with self.model.trace(PROMPT, use_cache=False):
                mix.state_input = torch.zeros(1, 4, 16, 16)

    # -- the order suite's padded batch, on a model that reads no padding mask ---------------

    def test_two_invokes_of_a_padded_batch_keep_their_own_order(self) -> None:
        """Two invokes, one reading in the taught order and one reversed: each gets its own row's values.

        xLSTM reads no attention mask, so a padded row's pad tokens write into
        its state: each invoke is compared with its row of the same batch in
        one plain trace, not with its prompt alone.
        """
        mix = self.mixer(self.order_layer())
        whole: list[Any] = []
        with self.model.trace(list(BATCH)):
            whole.extend((mix.states.save(), mix.attention_head_outputs.save()))
        together: list[list[Any]] = [[], []]
        with self.model.trace() as tracer:
            with tracer.invoke(BATCH[0]):
                together[0].extend((mix.states.save(), mix.attention_head_outputs.save()))
            with tracer.invoke(BATCH[1]):
                heads = mix.attention_head_outputs.save()
                together[1].extend((mix.states.save(), heads))
        for row, values in enumerate(together):
            assert len(values) == 2, f"invoke {row}: the trace ended early"
            for name, value, expected in zip(("states", "attention_head_outputs"), values, whole, strict=True):
                torch.testing.assert_close(value, expected[row : row + 1], msg=f"invoke {row}: {name}")

    def test_patch_state_continues_from_everything_the_source_carried(self) -> None:
        """``patch_state`` at t in every block gives, after t, the logits of the source's tokens up to t followed by
        the target's after it: every block's memory, normalizer and stabilizer carried; before t the target's own."""
        # tight: the per-head norm after the readout hides most of a wrong normalizer
        check_patch_state_joins_the_prompts(self.model, tolerance=3e-6)
