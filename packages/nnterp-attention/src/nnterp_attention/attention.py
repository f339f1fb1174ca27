"""Attention: a softmax-attention module, its contribution and its interior."""

from __future__ import annotations

from typing import Any

from nnterp import EProperty, Sublayer, contribution
from nnterp.analysis import Heads, selected_mixing
from nnterp.layouts import HeadOutputs, Keys, Pattern, Queries, Residual, Values
from nnterp.positions import Positions

NOT_EAGER = (
    "read inside transformers' eager attention, which this model does not run: it was loaded with "
    "attn_implementation={implementation!r}; load it with attn_implementation='eager'"
)


def interface_reason(envoy: Attention) -> str | None:
    """Why a value read inside the eager attention function is unavailable on ``envoy``, or ``None``.

    The values' ``unavailable=``: it calls the envoy's ``off_interface`` at each
    check, so a family's override decides. Naming the method in the class body
    instead would bind the base class's and ignore every override.
    """
    return envoy.off_interface()


def _interface(attribute: str):
    return lambda envoy: f"source.{envoy.INTERFACE}.{attribute}"


def _inside_interface(operation: str, attribute: str):
    return lambda envoy: f"source.{envoy.INTERFACE}.source.{getattr(envoy, operation)}.{attribute}"


#: What the output projection is called, on the families that spell it each way.
OUTPUT_PROJECTIONS = ("o_proj", "dense", "c_proj", "out_proj")


class Attention(Sublayer):
    """A softmax-attention module: what it adds to the residual stream, its pattern, and its interior.

    ``attention_output`` is the module's output. Everything else is read inside
    transformers' eager attention function, at the call the module makes to
    its attention interface (``INTERFACE``): the queries, keys and values it
    receives, the scores entering its softmax, the pattern leaving it, and the
    per-head outputs it returns. They exist only when the model runs that
    function: load with ``attn_implementation="eager"``, or they are
    unavailable with that reason (``off_interface`` decides, and a family with
    another reason overrides it).

    Its sizes (``num_heads``, ``num_kv_heads``, ``head_dim``, ``qk_head_dim``)
    are this module's, read off it, so they hold on a model whose blocks differ.
    """

    #: The operation in the module's forward that calls the attention interface.
    INTERFACE = "attention_interface_1"
    #: Inside the eager function: the softmax whose input is the scores.
    SOFTMAX = "nn_functional_softmax_0"
    #: Inside the eager function: the dropout after the softmax, whose output the values are mixed with.
    DROPOUT = "nn_functional_dropout_0"

    def off_interface(self) -> str | None:
        """Why the eager attention interface does not run on this module, or ``None``."""
        config = getattr(self._module, "config", None)
        implementation = getattr(config, "_attn_implementation", None)
        if implementation not in (None, "eager"):
            return NOT_EAGER.format(implementation=implementation)
        return None

    # -- sizes ---------------------------------------------------------------------

    @property
    def num_heads(self) -> int:
        """Query heads: the module's own count, else the output projection's input width over ``head_dim``."""
        module = self._module
        for name in ("num_heads", "num_attention_heads", "n_heads", "n_head"):
            value = getattr(module, name, None)
            if isinstance(value, int):
                return value
        projection = next((getattr(module, name) for name in OUTPUT_PROJECTIONS if hasattr(module, name)), None)
        head_dim = self._own_head_dim()
        if projection is None or head_dim is None:
            return module.config.num_attention_heads
        # A Linear is [out, in] and says so; GPT-2's Conv1D weight is [in, out].
        width = getattr(projection, "in_features", None) or projection.weight.shape[0]
        return width // head_dim

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads as projected: the module's count, else ``num_heads`` over its ``num_key_value_groups``."""
        module = self._module
        for name in ("num_key_value_heads", "num_kv_heads", "kv_heads"):
            value = getattr(module, name, None)
            if isinstance(value, int):
                return value
        groups = getattr(module, "num_key_value_groups", None)
        return self.num_heads // groups if groups else self.num_heads

    @property
    def head_dim(self) -> int:
        """Width of one head's values and outputs: the module's own, else hidden_size over ``num_heads``.

        The module's own is its ``v_head_dim`` (latent attention), ``head_dim``, ``head_size`` or
        ``attention_head_size`` (BERT's).
        """
        head_dim = self._own_head_dim()
        return head_dim if head_dim is not None else self._module.config.hidden_size // self.num_heads

    def _own_head_dim(self) -> int | None:
        for name in ("v_head_dim", "head_dim", "head_size", "attention_head_size"):
            value = getattr(self._module, name, None)
            if isinstance(value, int):
                return value
        return None

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's queries and keys (differs from ``head_dim`` under latent attention)."""
        value = getattr(self._module, "qk_head_dim", None)
        return value if isinstance(value, int) else self.head_dim

    # -- values ------------------------------------------------------------------

    @EProperty(contribution)
    def attention_output(self, value: Any) -> Residual:
        """What the attention adds to the residual stream, [batch, seq, hidden_size].

        The module's output, after the output projection, or where the block
        changes it on the way in (``CONTRIBUTION``). Assign or edit in place.
        """
        return value

    @EProperty(_interface("inputs"), select=1, unavailable=interface_reason)
    def attention_queries(self, value: Any) -> Queries:
        """The queries the attention interface receives, [batch, num_heads, seq, qk_head_dim].

        After the query projection and, on a family with rotary embeddings,
        after they are applied. Assign to replace them. In-place edits reach
        the model where torch allows them: it refuses them on a view of a
        fused projection's ``split`` or ``chunk`` (GPT-2's queries; see the
        family), so assign there.
        """
        return value

    @EProperty(_interface("inputs"), select=2, unavailable=interface_reason)
    def attention_keys(self, value: Any) -> Keys:
        """The keys the attention interface receives, [batch, num_kv_heads, seq, qk_head_dim].

        Before they are repeated for grouped-query attention, so the head axis
        is ``num_kv_heads`` wide. Assign, or edit in place where torch allows
        it (see ``attention_queries``).
        """
        return value

    @EProperty(_interface("inputs"), select=3, unavailable=interface_reason)
    def attention_values(self, value: Any) -> Values:
        """The values the attention interface receives, [batch, num_kv_heads, seq, head_dim].

        Before they are repeated, like the keys. Assign, or edit in place
        where torch allows it (see ``attention_queries``).
        """
        return value

    @EProperty(_inside_interface("SOFTMAX", "input"), unavailable=interface_reason)
    def attention_scores(self, value: Any) -> Pattern:
        """The scaled, masked scores entering the softmax, [batch, num_heads, query, key].

        ``softmax(attention_scores)`` is ``attention_probabilities`` up to the
        dtype cast. Assign or edit in place.
        """
        return value

    @EProperty(_inside_interface("DROPOUT", "output"), unavailable=interface_reason)
    def attention_probabilities(self, value: Any) -> Pattern:
        """The attention pattern, [batch, num_heads, query, key].

        The post-softmax probabilities the values are mixed with, in the
        model's dtype; each row sums to one. Read it, edit it in place, or
        assign a tensor of the same shape::

            with model.trace(prompt):
                pattern = model.layers[3].self_attn.attention_probabilities.save()
                model.layers[3].self_attn.attention_probabilities[:, :, -1] = 0
        """
        return value

    def token_mixing(self, positions: Positions = None, heads: Heads = None) -> Pattern:
        """How each query row mixes the values of every token, [batch, num_heads, query, key]: the attention pattern.

        ``attention_probabilities`` under the name every recurrent mixer serves
        its exact token-to-token matrix by, so one analysis runs over every block
        of a hybrid. ``positions`` picks query rows and ``heads`` heads, as on a
        recurrent mixer (an int drops the axis). Read it where
        ``attention_probabilities`` can be read.
        """
        return selected_mixing(self.attention_probabilities, positions, heads)

    @EProperty(_interface("output"), select=0, unavailable=interface_reason)
    def attention_head_outputs(self, value: Any) -> HeadOutputs:
        """Each head's output before the heads are concatenated and projected, [batch, seq, num_heads, head_dim].

        What the attention interface returns; the module reshapes it to
        [batch, seq, hidden_size] and projects it into ``attention_output``.
        Assign or edit in place.
        """
        return value
