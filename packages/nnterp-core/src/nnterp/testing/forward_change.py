"""ForwardChangeSuite: a transformers release that changes a recurrent mixer's forward gives a sentence, not a traceback.

Each test builds a copy of the family's modeling module with one change a
release could make, read off the mixer's own declaration: the prompt's kernel
renamed, the state the token loop binds renamed, the kernel's parameters in
another order (passed by keyword), or the prompt's kernel called twice. The
copy's classes are served by the family's envoys, as a new release's would be.
A change the declaration cannot follow makes every recurrent value
unavailable, before the model runs, with a reason naming the family, the
transformers version and what was expected; the model's other values keep
working. A change it can follow (the parameters' order) changes nothing.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import io
import itertools
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import ClassVar

import torch
import transformers

from ..availability import Unavailable
from ..cli import check_families
from ..components.declaration import forward_changes, modeling_module
from ..components.recurrent import RecurrentMixer
from ..forward_source import callee
from ..registry import REGISTRY
from ..transformer import StandardizedTransformer
from .suites import PROMPT, Suite, close, raises

_copies = itertools.count()


class _Renamed(ast.NodeTransformer):
    """Every name, parameter, attribute-free call and ``def`` spelled ``old`` spelled ``new`` (within ``scope``)."""

    def __init__(self, old: str, new: str, scope: str | None = None) -> None:
        self.old, self.new, self.scope = old, new, scope

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        if self.scope is not None and node.name != self.scope:
            return node
        if node.name == self.old:
            node.name = self.new
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == self.old:
            node.id = self.new
        return node


class _Reordered(ast.NodeTransformer):
    """``function``'s first three parameters in reverse order, and every call of it passing its arguments by keyword
    (``parameters``: the function's parameters as they were)."""

    def __init__(self, function: str, parameters: list[str]) -> None:
        self.function, self.parameters = function, parameters

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        if node.name == self.function:
            node.args.args[:3] = node.args.args[:3][::-1]
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == self.function:
            named = [
                ast.keyword(arg=name, value=value) for name, value in zip(self.parameters, node.args, strict=False)
            ]
            node.keywords = named + node.keywords
            node.args = node.args[len(named) :]
        return node


class _CalledTwice(ast.NodeTransformer):
    """The statement calling ``function`` made twice: the forward calls its prompt kernel two times."""

    def __init__(self, function: str) -> None:
        self.function = function

    def _twice(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out = []
        for statement in body:
            calls = [
                node
                for node in ast.walk(statement)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == self.function
            ]
            if calls and isinstance(statement, (ast.Assign, ast.Expr)):
                out.append(statement)
            out.append(statement)
        return out

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for field in ("body", "orelse"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, field, self._twice(value))
        return node


def copied_modeling(module: ModuleType, change: ast.NodeTransformer, what: str) -> ModuleType:
    """A copy of a modeling module with ``change`` applied to its source, imported from a file of its own.

    It sits in the module's package, so its relative imports resolve, and in
    ``sys.modules``, where nnterp looks a mixer's modeling module up.
    """
    tree = change.visit(ast.parse(Path(module.__file__).read_text()))
    name = f"{module.__name__}_{what}_{next(_copies)}"
    path = Path(tempfile.mkdtemp()) / f"{name.rsplit('.', 1)[-1]}.py"
    path.write_text(ast.unparse(ast.fix_missing_locations(tree)))
    spec = importlib.util.spec_from_file_location(name, path)
    copy = importlib.util.module_from_spec(spec)
    sys.modules[name] = copy
    spec.loader.exec_module(copy)
    return copy


class ForwardChangeSuite(Suite):
    """A changed forward is a sentence naming the family and the transformers version; the model's other values work."""

    conformance = False

    #: The recurrent values that must be unavailable with the reason, and a value of the block that must still work.
    RECURRENT: ClassVar[tuple[str, ...]] = ("attention_queries", "attention_head_outputs", "state_trajectory")

    @classmethod
    def mixers(cls) -> list[tuple[type, type[RecurrentMixer]]]:
        """The family's recurrent mixer module classes and their envoy classes."""
        envoys = REGISTRY.family(cls.family).ENVOYS
        return [
            (module_class, envoy)
            for module_class, envoy in envoys.items()
            if isinstance(module_class, type) and isinstance(envoy, type) and issubclass(envoy, RecurrentMixer)
        ]

    @contextmanager
    def changed(self, change: ast.NodeTransformer, what: str) -> Iterator[StandardizedTransformer]:
        """A tiny model of the family built from a changed copy of its modeling module, served by its envoys.

        The copy's classes join the family's envoys for the duration, as a
        new release's classes would be the family's.
        """
        module_class, _ = self.mixers()[0]
        modeling = modeling_module(module_class)
        copy = copied_modeling(modeling, change, what)
        family = REGISTRY.family(self.family)

        def copies(table: dict) -> dict:
            return {
                getattr(copy, original.__name__): value
                for original, value in table.items()
                if isinstance(original, type) and original.__module__ == modeling.__name__
            }

        added, renamed = copies(family.ENVOYS), copies(family.RENAME)
        family.ENVOYS.update(added)
        family.RENAME.update(renamed)
        try:
            original = self.model._module
            built = getattr(copy, type(original).__name__)(original.config).eval()
            built.load_state_dict(original.state_dict())
            yield StandardizedTransformer(built, tokenizer=self.model.tokenizer)
        finally:
            for added_class in added:
                del family.ENVOYS[added_class]
            for renamed_class in renamed:
                del family.RENAME[renamed_class]
            sys.modules.pop(copy.__name__, None)

    def _mixer_layer(self, model: StandardizedTransformer) -> int:
        return next(i for i, layer in enumerate(model.layers) if getattr(layer, "linear_attn", None) is not None)

    def _assert_named(self, model: StandardizedTransformer, expected: str) -> None:
        """Every recurrent value is unavailable with the sentence, before the model runs; the rest still works."""
        layer = self._mixer_layer(model)
        table = model.support(layer=layer)
        version = transformers.__version__
        for value in self.RECURRENT:
            reason = table[f"linear_attn.{value}"]
            assert isinstance(reason, str), f"linear_attn.{value}: available on a changed forward"
            for part in (f"changed in transformers {version}", self.family, expected, "needs an update"):
                assert part in reason, f"linear_attn.{value}: {part!r} not in {reason!r}"
        changes = forward_changes(REGISTRY.family(self.family))
        assert len(changes) == 1 and expected in changes[0], f"the family's forward changes: {changes}"
        report = io.StringIO()
        assert check_families(report, [REGISTRY.family(self.family)]) == 1
        assert f"FAILED: forward changed in transformers {version}" in report.getvalue(), report.getvalue()
        assert expected in report.getvalue() and "Traceback" not in report.getvalue(), report.getvalue()
        mixer = model.layers[layer].linear_attn
        with model.trace(PROMPT):
            with raises(Unavailable, f"changed in transformers {version}"):
                getattr(mixer, self.RECURRENT[0]).save()
        with model.trace(PROMPT):
            entering = model.layers[layer].layer_input.save()
            contribution = mixer.attention_output.save()
            leaving = model.layers[layer].layer_output.save()
            logits = model.logits.save()
        assert contribution.shape == entering.shape == leaving.shape and torch.isfinite(logits).all()

    def test_renamed_kernel_is_named(self) -> None:
        prompt = self.mixers()[0][1].PROMPT.function
        with self.changed(_Renamed(prompt, f"{prompt}_v2"), "renamed_kernel") as model:
            self._assert_named(model, prompt)

    def test_renamed_state_binding_is_named(self) -> None:
        """The state the token loop binds, renamed inside the kernel whose body holds it."""
        mixer = self.mixers()[0][1]
        holder = next(
            call
            for call in mixer.calls()
            if call.token_state is not None and mixer.PER_TOKEN.body_of(mixer, call) is call
        )
        name = holder.token_state.name
        with self.changed(_Renamed(name, f"{name}_v2", scope=holder.function), "renamed_state") as model:
            self._assert_named(model, name)

    def test_prompt_kernel_called_twice_is_named(self) -> None:
        with self.changed(_CalledTwice(self.mixers()[0][1].PROMPT.function), "called_twice") as model:
            self._assert_named(model, "found 2")

    def test_reordered_parameters_serve_the_same_values(self) -> None:
        """The kernel's parameters in another order, passed by keyword: found by its signature, the values are the same."""
        module_class, mixer = self.mixers()[0]
        kernel = callee(getattr(modeling_module(module_class), mixer.PROMPT.function)).torch_function
        parameters = list(inspect.signature(kernel).parameters)
        layer = self._mixer_layer(self.model)
        with self.model.trace(PROMPT):
            values = self.model.layers[layer].linear_attn.attention_values.save()
            outputs = self.model.layers[layer].linear_attn.attention_head_outputs.save()
        with self.changed(_Reordered(mixer.PROMPT.function, parameters), "reordered") as model:
            assert model.support(layer=layer)["linear_attn.attention_values"] is None
            with model.trace(PROMPT):
                reordered = model.layers[layer].linear_attn.attention_values.save()
                reordered_outputs = model.layers[layer].linear_attn.attention_head_outputs.save()
        close(reordered, values, what="attention_values")
        close(reordered_outputs, outputs, what="attention_head_outputs")
