"""Reading a decoder block's layout off its forward's source: which child mixes, which feeds forward, and how.

The generic family serves a model no plugin names when its blocks follow a
layout this module recognizes. It does not guess from names: it evaluates the
block's ``forward`` symbolically, statement by statement, tracking what each
variable holds in terms of the block's input and its children's outputs, and
reads the layout off the expression the block returns. A pre-norm block
returns ``x + attn(norm1(x)) + mlp(norm2(x + attn(norm1(x))))``; a parallel
one ``x + attn(norm1(x)) + mlp(norm2(x))``; a block that normalizes each
sublayer's output before adding it wraps each contribution in a post-norm.

Conditions on the module's own attributes or config (``if
self.use_parallel_residual``, or Moshi's ``a if not self.use_flexible_linear
else b``) are evaluated against the module, so the layout
is the one this checkpoint's config selects. Anything the evaluator cannot
follow (a loop, a scaled residual, a branch it cannot decide that changes the
stream) makes the block unrecognized, with the reason.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from nnterp.forward_source import ForwardSource
from nnterp.registry import Unrecognized

#: A term: ("input",), ("out", child, term), ("sum", terms...), ("tuple", terms...), ("scaled", term, attribute)
#: (a term times a number the module holds), ("opaque", why).
Term = tuple
INPUT: Term = ("input",)
#: Methods that change a tensor's dtype or memory layout and nothing it holds.
DTYPE_CASTS = ("to", "float", "contiguous")
#: Methods that give a tensor a shape: transparent when the shape is another tensor's (``x.view(residual.shape)``).
RESHAPES = ("view", "reshape")


@dataclass(frozen=True)
class BlockLayout:
    """A recognized block: its children by role, and how they meet the residual stream.

    ``attention_norm`` and ``mlp_norm`` are the pre-norms in front of the
    sublayers (``None`` where a sublayer reads the stream itself);
    ``attention_post_norm`` and ``mlp_post_norm`` the norms after them
    (``None`` where the sublayer's output is added as it is); ``parallel``
    says both sublayers read the block's input; ``returned`` how many
    elements the block returns in a tuple (0: the hidden states alone);
    ``attention_scale`` and ``mlp_scale`` the block's attributes a
    contribution is multiplied by before it is added (Granite's
    ``residual_multiplier``), ``None`` where it is added as it is. An MLP
    the block spells out in its own children (BART's ``fc1``,
    ``activation_fn``, ``fc2``) is ``mlp``, its last projection, with
    ``mlp_entry`` its first and ``mlp_activation`` the activation between.
    ``attention_stream_norm`` and ``mlp_stream_norm`` are a post-norm
    block's norms of the stream right after each addition (BART's
    ``self_attn_layer_norm`` and ``final_layer_norm``).
    """

    attention: str
    mlp: str
    attention_norm: str | None
    mlp_norm: str | None
    attention_post_norm: str | None
    mlp_post_norm: str | None
    parallel: bool
    returned: int = 0
    attention_scale: str | None = None
    mlp_scale: str | None = None
    mlp_entry: str | None = None
    mlp_activation: str | None = None
    attention_stream_norm: str | None = None
    mlp_stream_norm: str | None = None


def opaque(why: str) -> Term:
    return ("opaque", why)


def is_opaque(term: Term) -> bool:
    return term[0] == "opaque" or any(isinstance(part, tuple) and is_opaque(part) for part in term[1:])


def add(*terms: Term) -> Term:
    """The sum of ``terms``, flattened and in a canonical order, so that ``a + b`` and ``b + a`` are one term."""
    parts: list[Term] = []
    for term in terms:
        parts.extend(term[1:] if term[0] == "sum" else [term])
    return ("sum", *sorted(parts, key=repr))


class ForwardReader:
    """Evaluates one block's forward over terms, against the module instance its conditions read."""

    def __init__(self, block: torch.nn.Module) -> None:
        self.block = block
        self.children = dict(block.named_children())
        function = type(block).forward
        self.function = ForwardSource.of(function).definition
        arguments = [argument.arg for argument in self.function.args.args]
        if len(arguments) < 2:
            raise Unrecognized(f"{type(block).__name__}.forward takes no hidden states")
        self.env: dict[str, Term] = {arguments[1]: INPUT}
        # A decoder-only model leaves the arguments that default to None (encoder states, attention outputs) unset.
        self.defaults = {
            name: parameter.default
            for name, parameter in inspect.signature(function).parameters.items()
            if parameter.default in (None, False)
        }
        self.scope = {"self": block, **self.defaults}

    def returned(self) -> tuple[Term, int]:
        """The term the forward returns as the block's output, and the length of the tuple it returns it in (or 0)."""
        result = self.run(self.function.body, self.env)
        if result is None:
            raise Unrecognized("the forward never returns")
        if result[0] != "tuple":
            return result, 0
        if len(result) < 2 or result[1][0] == "tuple":
            raise Unrecognized(f"it returns a nested or empty tuple: {describe(result)}")
        return result[1], len(result) - 1

    # -- statements ----------------------------------------------------------------

    def run(self, body: list[ast.stmt], env: dict[str, Term]) -> Term | None:
        for statement in body:
            if isinstance(statement, ast.Return):
                return self.value(statement.value, env) if statement.value is not None else None
            if isinstance(statement, ast.If):
                result = self.branch(statement, env)
                if result is not None:
                    return result
            elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                value = self.value(statement.value, env) if statement.value is not None else opaque("annotation")
                for target in targets:
                    self.bind(target, value, env)
            elif isinstance(statement, ast.AugAssign):
                current = self.value(statement.target, env)
                change = self.value(statement.value, env)
                combined = add(current, change) if isinstance(statement.op, ast.Add) else opaque("augmented")
                self.bind(statement.target, combined, env)
            elif isinstance(statement, (ast.For, ast.While, ast.With, ast.Try)):
                for name in assigned_names(statement):
                    env[name] = opaque(f"assigned in a {type(statement).__name__.lower()} statement")
        return None

    def branch(self, statement: ast.If, env: dict[str, Term]) -> Term | None:
        decided = self.condition(statement.test)
        if decided is not None:
            return self.run(statement.body if decided else statement.orelse, env)
        taken, skipped = dict(env), dict(env)
        returned = (self.run(statement.body, taken), self.run(statement.orelse, skipped))
        if returned != (None, None):
            raise Unrecognized(f"it returns from inside a condition it cannot decide: {ast.unparse(statement.test)}")
        for name in set(taken) | set(skipped):
            if taken.get(name) == skipped.get(name):
                env[name] = taken[name]
            else:
                env[name] = opaque(f"set differently on each side of `if {ast.unparse(statement.test)}`")
        return None

    def condition(self, test: ast.expr) -> bool | None:
        """The condition's value when it reads only constants, the module and defaulted arguments, else ``None``."""
        names = {node.id for node in ast.walk(test) if isinstance(node, ast.Name)}
        if not names <= {"self", *self.defaults}:
            return None
        try:
            return bool(eval(compile(ast.Expression(test), "<condition>", "eval"), {"__builtins__": {}}, self.scope))  # noqa: S307
        except Exception:
            return None

    def number_attribute(self, node: ast.expr) -> str | None:
        """``name`` when ``node`` is ``self.name`` and the module holds a number there (a residual multiplier)."""
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            value = getattr(self.block, node.attr, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return node.attr
        return None

    def bind(self, target: ast.expr, value: Term, env: dict[str, Term]) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            for index, element in enumerate(target.elts):
                self.bind(element, item(value, index), env)

    # -- expressions ---------------------------------------------------------------

    def value(self, node: ast.expr, env: dict[str, Term]) -> Term:
        if isinstance(node, ast.Name):
            return env.get(node.id, opaque(f"`{node.id}`"))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.value(node.left, env), self.value(node.right, env)
            if left[0] == "tuple":
                return left
            return add(left, right)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for term, factor in ((node.left, node.right), (node.right, node.left)):
                attribute = self.number_attribute(factor)
                if attribute is not None:
                    return ("scaled", self.value(term, env), attribute)
        if isinstance(node, ast.IfExp):
            decided = self.condition(node.test)
            if decided is None:
                return opaque(f"a value chosen by a condition it cannot decide: {ast.unparse(node.test)}")
            return self.value(node.body if decided else node.orelse, env)
        if isinstance(node, ast.Tuple):
            return ("tuple", *(self.value(element, env) for element in node.elts))
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            return item(self.value(node.value, env), node.slice.value)
        if isinstance(node, ast.Call):
            return self.call(node, env)
        return opaque(ast.unparse(node))

    def call(self, node: ast.Call, env: dict[str, Term]) -> Term:
        stream = node.args[0] if node.args else keyword(node, "hidden_states") or keyword(node, "x")
        function = node.func
        if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name):
            if function.value.id == "self" and function.attr in self.children:
                child = self.children[function.attr]
                argument = self.value(stream, env) if stream is not None else opaque("no stream argument")
                if isinstance(child, torch.nn.Dropout):
                    return argument
                return ("out", function.attr, argument)
        if ast.unparse(function).endswith("functional.dropout") and stream is not None:
            return self.value(stream, env)
        if isinstance(function, ast.Attribute) and function.attr in DTYPE_CASTS:
            return self.value(function.value, env)
        if isinstance(function, ast.Attribute) and function.attr in RESHAPES and restores_a_shape(node):
            return self.value(function.value, env)
        return opaque(ast.unparse(node)[:80])


def restores_a_shape(node: ast.Call) -> bool:
    """Whether a reshape's one argument is a tensor's ``.shape``: Llama-4's MoE output back in the stream's shape.

    Only then is it the same value; ``reshape(-1, hidden)`` (OPT's flattened
    tokens) is another layout, which a value read there would have.
    """
    return len(node.args) == 1 and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "shape"


def keyword(node: ast.Call, name: str) -> ast.expr | None:
    return next((argument.value for argument in node.keywords if argument.arg == name), None)


def item(term: Term, index: Any) -> Term:
    """Element ``index`` of ``term``: a tuple literal's element; a module's first output is the module's output."""
    if term[0] == "tuple" and isinstance(index, int) and -len(term) < index + 1 <= len(term) - 1:
        return term[1 + index]
    if term[0] == "out" and index == 0:
        return term
    return opaque(f"element {index!r} of a value")


def assigned_names(statement: ast.stmt) -> set[str]:
    return {node.id for node in ast.walk(statement) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}


# -- the layout ---------------------------------------------------------------------


def read_layout(block: torch.nn.Module) -> BlockLayout:
    """The layout of ``block``, read off its forward; raises :class:`Unrecognized` saying why when there is none."""
    output, returned = ForwardReader(block).returned()
    children = dict(block.named_children())
    if is_opaque(output):
        raise Unrecognized(f"its output is not its input plus its sublayers' outputs: {describe(output)}")
    if renormalized(output, children):
        first, second, stream_norms = post_norm_chains(output, children)
        parallel = False
    else:
        if output[0] != "sum" or INPUT not in output[1:]:
            raise Unrecognized(f"its output is not its input plus its sublayers' outputs: {describe(output)}")
        contributions = [part for part in output[1:] if part != INPUT]
        if len(contributions) != 2:
            raise Unrecognized(f"it adds {len(contributions)} contributions to its input, not an attention and an MLP")
        first, second = (chain(part, children) for part in contributions)
        if first.stream != INPUT:
            first, second = second, first
        stream_norms = (None, None)
        parallel = second.stream == INPUT
        if not parallel and second.stream != add(INPUT, first.term):
            raise Unrecognized(f"its second sublayer reads {describe(second.stream)}, not the stream after the first")
        if parallel:
            first, second = sorted((first, second), key=lambda part: not is_attention(part.module))
            if first.pre_norm is None or second.pre_norm is None:
                raise Unrecognized("a parallel block whose sublayers read its input without a norm")
    attention = children[first.module]
    if first.entry is not None:
        raise Unrecognized(f"its first sublayer is spelled out in several modules: {describe(first.term)}")
    if not is_attention(first.module) and "att" not in type(attention).__name__.lower():
        raise Unrecognized(
            f"its first sublayer, {first.module} ({type(attention).__name__}), is not an attention; "
            f"a recurrent or convolutional mixer needs a family that knows its state"
        )
    return BlockLayout(
        first.module,
        second.module,
        first.pre_norm,
        second.pre_norm,
        first.post_norm,
        second.post_norm,
        parallel,
        returned,
        first.scale,
        second.scale,
        second.entry,
        second.activation,
        *stream_norms,
    )


def renormalized(term: Term, children: dict[str, torch.nn.Module]) -> bool:
    """Whether ``term`` is a norm of a sum: a post-norm block's stream right after an addition."""
    return term[0] == "out" and term[1] in children and is_norm(children[term[1]]) and term[2][0] == "sum"


def post_norm_chains(output: Term, children: dict[str, torch.nn.Module]) -> tuple[Chain, Chain, tuple[str, str]]:
    """The sublayers of a post-norm block, ``norm2(norm1(x + attn(x)) + mlp(norm1(...)))``, and its two norms."""
    total = output[2]
    middles = [part for part in total[1:] if renormalized(part, children) and INPUT in part[2][1:]]
    if len(middles) != 1 or len(total) != 3 or len(middles[0][2]) != 3:
        raise Unrecognized(f"its output is not a post-norm block's, norm(norm(x + attn) + mlp): {describe(output)}")
    middle = middles[0]
    attention = next(part for part in middle[2][1:] if part != INPUT)
    mlp = next(part for part in total[1:] if part != middle)
    first = chain(attention, children)
    # The MLP reads the normalized stream: its chain runs through the first norm to the sum under it.
    second = chain(mlp, children)
    if first.stream != INPUT or second.pre_norm != middle[1] or second.stream != middle[2]:
        raise Unrecognized(f"its sublayers do not read the post-norm block's streams: {describe(output)}")
    return (
        first,
        Chain(mlp, second.module, None, second.post_norm, middle, second.scale, second.entry, second.activation),
        (
            middle[1],
            output[1],
        ),
    )


@dataclass(frozen=True)
class Chain:
    """One contribution: ``post_norm(module(pre_norm(stream))) * scale``, either norm and the scale absent.

    An MLP a block spells out in its own children (``fc2(activation_fn(fc1(x)))``)
    has ``module`` its last projection, ``entry`` its first and ``activation``
    the one between.
    """

    term: Term
    module: str
    pre_norm: str | None
    post_norm: str | None
    stream: Term
    scale: str | None = None
    entry: str | None = None
    activation: str | None = None


def chain(contribution: Term, children: dict[str, torch.nn.Module]) -> Chain:
    """The modules a contribution passes through, outermost first, split into the sublayer and its norms."""
    scale = None
    if contribution[0] == "scaled":
        scale = contribution[2]
    names, term = [], contribution[1] if scale else contribution
    while term[0] == "out":
        names.append(term[1])
        term = term[2]
    if term != INPUT and term[0] != "sum":
        raise Unrecognized(f"a contribution does not start from the residual stream: {describe(contribution)}")
    sublayers = [index for index, name in enumerate(names) if not is_norm(children[name])]
    if not sublayers or sublayers != list(range(sublayers[0], sublayers[-1] + 1)):
        raise Unrecognized(f"a contribution is not one sublayer between norms: {describe(contribution)}")
    first, last = sublayers[0], sublayers[-1]
    if first > 1 or len(names) - last > 2 or last - first > 2:
        raise Unrecognized(
            f"a contribution is not one sublayer (or projection, activation, projection) between at most two norms: "
            f"{describe(contribution)}"
        )
    return Chain(
        contribution,
        names[first],
        names[last + 1] if last + 1 < len(names) else None,
        names[0] if first == 1 else None,
        term,
        scale,
        names[last] if last > first else None,
        names[first + 1] if last - first == 2 else None,
    )


def is_norm(module: torch.nn.Module) -> bool:
    """A normalization layer, by torch's classes or a class named for one (``LlamaRMSNorm``)."""
    return isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)) or "norm" in type(module).__name__.lower()


def is_attention(name: str) -> bool:
    return "att" in name.lower()


def describe(term: Term) -> str:
    """A term as the expression it stands for: ``x + self_attn(input_layernorm(x))``."""
    kind = term[0]
    if kind == "input":
        return "x"
    if kind == "out":
        return f"{term[1]}({describe(term[2])})"
    if kind == "sum":
        return " + ".join(describe(part) for part in term[1:])
    if kind == "tuple":
        return "(" + ", ".join(describe(part) for part in term[1:]) + ")"
    if kind == "scaled":
        return f"{describe(term[1])} * {term[2]}"
    return f"<{term[1]}>"


def describe_layout(layout: BlockLayout) -> str:
    """A layout as the expression its block computes: ``x + self_attn(n1(x)) + mlp(n2(...))`` in its own names."""

    def contribution(modules: list, pre: str | None, post: str | None, scale: str | None, stream: str) -> str:
        term = f"{pre}({stream})" if pre else stream
        for module in reversed([name for name in modules if name]):
            term = f"{module}({term})"
        term = f"{post}({term})" if post else term
        return f"{term} * {scale}" if scale else term

    attention = contribution(
        [layout.attention], layout.attention_norm, layout.attention_post_norm, layout.attention_scale, "x"
    )
    stream = "x" if layout.parallel else "x + attn"
    mlp_modules = [layout.mlp, layout.mlp_activation, layout.mlp_entry]
    mlp = contribution(mlp_modules, layout.mlp_norm, layout.mlp_post_norm, layout.mlp_scale, stream)
    if layout.parallel:
        return f"parallel block, x + {attention} + {mlp}"
    if layout.attention_stream_norm:
        mlp = contribution(mlp_modules, None, layout.mlp_post_norm, layout.mlp_scale, "mid")
        return (
            f"post-norm block, mid = {layout.attention_stream_norm}(x + {attention}), "
            f"then {layout.mlp_stream_norm}(mid + {mlp})"
        )
    return f"sequential block, attn = {attention}, then x + attn + {mlp}"
