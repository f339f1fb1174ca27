"""A forward's source, read once: what each of its operations is, under the label nnsight gives it.

nnsight addresses an operation inside a forward by a label, the called name or
the bound variable with an occurrence number (``torch_chunk_gated_delta_rule_0``,
``last_recurrent_state_3``). The numbers move whenever a transformers release
adds a line, so nnterp never writes one down: a declaration says what an
operation is (the call of ``torch_chunk_gated_delta_rule``, the binding of
``last_recurrent_state`` inside the token loop) and :class:`ForwardSource`
answers which label that is in the installed forward. It numbers operations
with nnsight's own rewriter, so its labels are the ones a trace serves, and it
also records where each one sits: on which arm of which ``if``, inside which
loop.

The other questions nnterp asks of transformers' source live here too:

- what a name a forward calls is bound to (:func:`callee`): a plain
  function, transformers' hub dispatcher around a pure-torch kernel, a hub
  function module (``kernels``' ``use_kernel_forward_from_hub`` on a function,
  transformers 5.25 on), or a method attribute of the module;
- which hub kernels a modeling module declares (:func:`hub_kernels`);
- what a model's forward calls on ``self`` after its loop over the blocks
  (:meth:`ForwardSource.called_after_loop`).

A question the installed source cannot answer (no call of the declared
function, two where one was declared) raises :class:`NotInForward`, which
says what was expected and what was found; the envoys turn it into a reason
their values are unavailable.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import re
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from nnsight.intervention.source import BIND, Instrument, SourceNotAvailable, decorator_chain, source_tree


class NotInForward(LookupError):
    """A forward does not hold the operation a declaration names: what was expected, and what was found."""


@dataclass(frozen=True)
class Arm:
    """One side of a condition: the condition's source and whether this is its body (``True``) or its else."""

    test: str
    taken: bool

    def __str__(self) -> str:
        return f"if {self.test}" if self.taken else f"else of `if {self.test}`"


@dataclass(frozen=True)
class Loop:
    """A loop an operation sits in: its header's source and the labels of the operations in its iterable."""

    header: str
    iterable: tuple[str, ...]


@dataclass(frozen=True)
class Operation:
    """One operation of a forward: a call or a binding, with nnsight's label for it and where it sits."""

    label: str  #: nnsight's label: ``torch_chunk_gated_delta_rule_0``
    called: str | None  #: a call's dotted callee: ``torch_chunk_gated_delta_rule``, ``self.norm``, ``state.copy_``
    bound: str | None  #: a binding's dotted target: ``last_recurrent_state``
    line: int  #: the line in the forward's own source, 1 for its ``def``
    arms: tuple[Arm, ...]  #: the conditions it sits under, outermost first
    loops: tuple[Loop, ...]  #: the loops it sits in, outermost first
    within: str | None = None  #: the dotted callee of the call whose arguments it is computed in, if any

    def on(self, arm: Arm) -> bool:
        """Whether the operation runs only on ``arm`` of its condition."""
        return arm in self.arms


class Recorder(Instrument):
    """nnsight's rewriter, recording each operation it labels and the conditions and loops around it.

    Subclassing the rewriter rather than copying its rules keeps the labels
    nnsight's: a call's arguments are numbered before the call, an
    assignment's value before its target.
    """

    def __init__(self) -> None:
        super().__init__()
        self.operations: list[Operation] = []
        self._arms: list[Arm] = []
        self._loops: list[Loop] = []
        self._calls: list[str] = []
        self._target: ast.expr | None = None

    def wrap(self, name: str, fn: ast.expr, args: list, keywords: list, node: ast.AST) -> ast.Call:
        wrapped = super().wrap(name, fn, args, keywords, node)
        binding = isinstance(fn, ast.Name) and fn.id == BIND
        dotted = ".".join(self.dotted(self._target if binding else fn)[0]) if binding or name != "call" else None
        # a call is on top of the stack of calls being visited; what encloses it is below
        enclosing = self._calls if binding else self._calls[:-1]
        self.operations.append(
            Operation(
                label=self.names[-1],
                called=None if binding else dotted,
                bound=dotted if binding else None,
                line=self.lines[self.names[-1]],
                arms=tuple(self._arms),
                loops=tuple(self._loops),
                within=enclosing[-1] if enclosing else None,
            )
        )
        return wrapped

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self._calls.append(".".join(self.dotted(node.func)[0]))
        try:
            return super().visit_Call(node)
        finally:
            self._calls.pop()

    def bound(self, target: ast.expr, value: ast.expr, node: ast.AST) -> ast.expr:
        if isinstance(target, (ast.Tuple, ast.List)):
            return super().bound(target, value, node)
        self._target = target
        return super().bound(target, value, node)

    # -- where an operation sits: each field visited in the order generic_visit visits it -----------------

    def _field(self, node: ast.AST, field: str) -> None:
        old = getattr(node, field, None)
        if isinstance(old, list):
            new: list = []
            for item in old:
                if isinstance(item, ast.AST):
                    item = self.visit(item)
                    if item is None:
                        continue
                    if not isinstance(item, ast.AST):
                        new.extend(item)
                        continue
                new.append(item)
            old[:] = new
        elif isinstance(old, ast.AST):
            setattr(node, field, self.visit(old))

    @contextmanager
    def _inside(self, stack: list, where: Arm | Loop) -> Iterator[None]:
        stack.append(where)
        try:
            yield
        finally:
            stack.pop()

    def _conditional(self, node: ast.If | ast.IfExp) -> ast.AST:
        test = ast.unparse(node.test)
        self._field(node, "test")
        with self._inside(self._arms, Arm(test, True)):
            self._field(node, "body")
        with self._inside(self._arms, Arm(test, False)):
            self._field(node, "orelse")
        return node

    visit_If = visit_IfExp = _conditional

    def visit_For(self, node: ast.For) -> ast.AST:
        header = f"for {ast.unparse(node.target)} in {ast.unparse(node.iter)}"
        self._field(node, "target")
        before = len(self.names)
        self._field(node, "iter")
        with self._inside(self._loops, Loop(header, tuple(self.names[before:]))):
            self._field(node, "body")
        self._field(node, "orelse")
        return node

    def visit_While(self, node: ast.While) -> ast.AST:
        self._field(node, "test")
        with self._inside(self._loops, Loop(f"while {ast.unparse(node.test)}", ())):
            self._field(node, "body")
        self._field(node, "orelse")
        return node


class ForwardSource:
    """A function's source, read once: its operations by what they are, and the labels nnsight gives them.

    ``ForwardSource.of(function)`` peels the decorators nnsight peels
    (``decorator_chain``) and reads the function they wrap, so its labels are
    the ones ``envoy.source`` serves for that function.
    """

    def __init__(self, function: Callable) -> None:
        self.function = function
        tree, _, self.text = source_tree(function.__code__)
        definition = tree.body[0]
        if not isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise SourceNotAvailable(f"{function!r} is not a plain function")
        definition.decorator_list = []
        #: The function's definition as written, decorators dropped (a copy: the labelling rewrites its own).
        self.definition: ast.FunctionDef = copy.deepcopy(definition)
        recorder = Recorder()
        recorder.visit(tree)
        self.operations: tuple[Operation, ...] = tuple(recorder.operations)
        self._by_label = {operation.label: operation for operation in self.operations}

    @classmethod
    def of(cls, function: Callable) -> "ForwardSource":
        """The source of ``function`` under its decorators (cached per function)."""
        return _read(innermost(function))

    @property
    def name(self) -> str:
        return self.function.__qualname__

    def __getitem__(self, label: str) -> Operation:
        return self._by_label[label]

    def __contains__(self, label: str) -> bool:
        return label in self._by_label

    # -- the operations, by what they are ----------------------------------------------------------

    def calls(self, name: str) -> tuple[Operation, ...]:
        """The calls of the dotted ``name`` (``torch.cat``, ``self.norm``, ``state.copy_``), in running order."""
        return tuple(operation for operation in self.operations if operation.called == name)

    def bindings(self, name: str) -> tuple[Operation, ...]:
        """The bindings of ``name``, in running order."""
        return tuple(operation for operation in self.operations if operation.bound == name)

    def calls_to(self, target: Any, instance: Any = None) -> tuple[Operation, ...]:
        """The calls whose callee is ``target``, found by what each called name is bound to (:func:`callee`).

        A bare name is looked up in the function's closure and globals, ``self.<attribute>`` on ``instance``.
        ``target`` may be the name's binding itself or what it wraps (a hub function module's function).
        """
        found = []
        for operation in self.operations:
            if operation.called is None:
                continue
            bound = self.resolve(operation.called, instance)
            if bound is not None and (bound is target or callee(bound).function is callee(target).function):
                found.append(operation)
        return tuple(found)

    def resolve(self, dotted: str, instance: Any = None) -> Any:
        """What the dotted name ``dotted`` is bound to where the function runs; ``None`` if it is not a plain name."""
        parts = dotted.split(".")
        if parts[0] == "self" and len(parts) == 2:
            return None if instance is None else getattr(instance, parts[1], None)
        if len(parts) != 1:
            return None
        closure = inspect.getclosurevars(self.function)
        for scope in (closure.nonlocals, self.function.__globals__, closure.builtins):
            if dotted in scope:
                return scope[dotted]
        return None

    def nonlocal_names(self) -> frozenset[str]:
        """The names the function reads from the function that built it (its closure)."""
        return frozenset(self.function.__code__.co_freevars)

    def called_after_loop(self, attribute: str) -> tuple[str, ...] | None:
        """The attributes of ``self`` the function calls after its loop over ``self.<attribute>``, in running order.

        ``None`` when no loop iterates over it.
        """
        loops = [
            node
            for node in ast.walk(self.definition)
            if isinstance(node, ast.For) and any(_on_self(inner, attribute) for inner in ast.walk(node.iter))
        ]
        if not loops:
            return None
        end = max(loop.end_lineno or loop.lineno for loop in loops)
        after = [
            operation
            for operation in self.operations
            if operation.line > end and operation.called and operation.called.count(".") == 1
        ]
        return tuple(dict.fromkeys(op.called.split(".")[1] for op in after if op.called.startswith("self.")))

    def reads(self, text: str) -> bool:
        """Whether ``text`` appears in the function's source (for a forward that names a value, not calls it)."""
        return text in self.text

    # -- a declared operation, found ---------------------------------------------------------------

    def find(self, spec: "Binding | Call") -> Operation:
        """The one operation ``spec`` names, or :class:`NotInForward` saying what was expected and found."""
        return spec.find(self)


#: Each function's innermost one, under its decorators; weak, since instrumented forwards come and go with modules.
_INNERMOST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def innermost(function: Callable) -> Callable:
    """``function`` under its decorators (cached: peeling reads each decorator's source, and places are resolved at
    every read of a value, on every trace)."""
    found = _INNERMOST.get(function)
    if found is None:
        found = _INNERMOST[function] = decorator_chain(function)[0]
    return found


@functools.cache
def _read(function: Callable) -> ForwardSource:
    return ForwardSource(function)


def _on_self(node: ast.AST, attribute: str | None = None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and attribute in (None, node.attr)
    )


# -- declarations of an operation by what it is --------------------------------------------------------


def _narrowed(operations: tuple[Operation, ...], under: str | None, loop: bool) -> tuple[Operation, ...]:
    if under is not None:
        operations = tuple(
            operation for operation in operations if any(under in arm.test and arm.taken for arm in operation.arms)
        )
    if loop:
        operations = tuple(operation for operation in operations if operation.loops)
    return operations


def _where(under: str | None, loop: bool) -> str:
    return "".join((f" on the arm of a condition reading `{under}`" if under else "", " inside a loop" if loop else ""))


@dataclass(frozen=True)
class Binding:
    """The binding of a variable, found by its name: the last one (the value the name ends up holding), narrowed to
    those inside a loop (``loop=True``: the state a token loop carries) or on the arm of a condition whose test reads
    ``under`` (``"D is not None"``); with ``first=True`` the first one instead, where the forward takes a value it
    rebinds on another arm later (Zamba's ``recurrent_state``, read from the cache, then ``None`` on an else arm).
    """

    name: str
    loop: bool = False
    under: str | None = None
    first: bool = False

    def find(self, source: ForwardSource) -> Operation:
        candidates = _narrowed(source.bindings(self.name), self.under, self.loop)
        if not candidates:
            found = source.bindings(self.name)
            seen = ", ".join(f"line {op.line}" for op in found) or "none"
            raise NotInForward(f"a {self._which()} in {source.name}; its bindings of `{self.name}`: {seen}")
        return candidates[0] if self.first else candidates[-1]

    def _which(self) -> str:
        return f"{'first ' if self.first else ''}binding of `{self.name}`{_where(self.under, self.loop)}"

    def __str__(self) -> str:
        return f"the {self._which()}"


@dataclass(frozen=True)
class Call:
    """A call, found by its dotted callee: the only one, or the only one on the arm of a condition whose test reads
    ``under``, or computed in the arguments of a call of ``within`` (``state.copy_``)."""

    name: str
    under: str | None = None
    within: str | None = None

    def find(self, source: ForwardSource) -> Operation:
        candidates = _narrowed(source.calls(self.name), self.under, False)
        if self.within is not None:
            candidates = tuple(operation for operation in candidates if operation.within == self.within)
        if len(candidates) != 1:
            lines = ", ".join(f"line {op.line}" for op in candidates) or "none"
            raise NotInForward(f"one call of `{self.name}`{self._where()} in {source.name}; found: {lines}")
        return candidates[0]

    def _where(self) -> str:
        return _where(self.under, False) + (f" in the arguments of `{self.within}`" if self.within else "")

    def __str__(self) -> str:
        return f"the call of `{self.name}`{self._where()}"


@dataclass(frozen=True)
class Place:
    """A value's place, for an ``EProperty`` key: the operation ``spec`` names in the forward of the host envoy's module
    (``module=".."``: its parent's), served at ``attribute``.

    Called with the envoy it gives ``source.<label>.<attribute>`` (``../source...`` for the parent), the label found
    in the installed forward; ``reason(envoy)`` says, instead of raising, when that forward holds no such operation.
    """

    spec: Binding | Call
    attribute: str = "output"
    module: str = ""

    def _host(self, envoy: Any) -> tuple[Any, str]:
        if self.module == "..":
            return envoy.parent, "../"
        return envoy, ""

    def __call__(self, envoy: Any) -> str:
        host, prefix = self._host(envoy)
        return f"{prefix}source.{_found(self.spec, type(host._module)).label}.{self.attribute}"

    def reason(self, envoy: Any) -> str | None:
        host, _ = self._host(envoy)
        try:
            _found(self.spec, type(host._module))
        except NotInForward as error:
            return f"{type(host._module).__name__}'s forward in this transformers does not hold it: expected {error}"
        return None


@functools.cache
def _found(spec: Binding | Call, module_class: type) -> Operation:
    return spec.find(ForwardSource.of(module_class.forward))


# -- what a called name is bound to ----------------------------------------------------------------------

#: How a forward reaches a kernel: ``function`` (a plain function, or transformers' hub dispatcher around one),
#: ``hub module`` (a ``kernels`` function module: transformers 5.25 on), ``attribute`` (a module attribute bound to one).
FUNCTION, HUB_MODULE = "function", "hub module"


class Callee(NamedTuple):
    """What a called name is bound to, unwrapped down to the Python function that computes it."""

    how: str  #: ``FUNCTION`` or ``HUB_MODULE``
    function: Callable  #: the Python function a call runs when no hub kernel replaces it (a dispatcher, or the body)
    torch_function: Callable  #: the pure-torch body, with Python source
    implementation: Callable  #: what the dispatcher calls: the pure-torch body, or an optimized package's kernel
    package: str | None  #: the package the optimized kernel comes from (``fla``, ``mamba_ssm``), if any


@functools.cache
def _dispatcher(function: Callable) -> tuple[Callable, Callable, str | None]:
    try:
        nonlocals = inspect.getclosurevars(function).nonlocals
    except TypeError:
        return function, function, None
    if "torch_function" not in nonlocals:
        return function, function, None
    pure = nonlocals["torch_function"]
    return pure, nonlocals.get("implementation", pure), nonlocals.get("package")


def hub_module_function(bound: Any) -> Callable | None:
    """The function a ``kernels`` hub function module wraps (what its forward calls), or ``None`` for anything else.

    ``kernels.use_kernel_forward_from_hub`` turns a decorated function into an
    instance of a one-off ``nn.Module`` class whose ``forward`` calls the
    function it closes over, unless ``kernels.kernelize`` replaced that forward
    with a hub kernel's.
    """
    if not hasattr(type(bound), "kernel_layer_name") or not callable(bound):
        return None
    try:
        wrapped = inspect.getclosurevars(type(bound).forward).nonlocals.get("func")
    except TypeError:
        return None
    return wrapped if callable(wrapped) else None


def callee(bound: Any) -> Callee:
    """What ``bound``, a name's binding, computes with: its hub function module and dispatcher unwrapped.

    transformers binds a kernel's name to its hub dispatcher
    (``use_kernel_func_from_hub_with_fallback``, closing over ``torch_function``
    and ``implementation``), and from 5.25 wraps that in a ``kernels`` hub
    function module; a plain function is its own body.
    """
    how = FUNCTION
    function = hub_module_function(bound)
    if function is None:
        function = bound
    else:
        how = HUB_MODULE
    pure, implementation, package = _dispatcher(function)
    return Callee(how, function, pure, implementation, package)


def hub_kernel_replacing(owner: Any, bound: Any) -> str | None:
    """The hub kernel ``kernels.kernelize`` put in place of the function module ``bound`` for ``owner``, or ``None``.

    A module class decorated with ``kernels.use_kernelized_func`` gives each
    instance its own copy of each function module it calls
    (``owner._kernel_funcs``, an instance of the module-level one's class);
    kernelizing the model replaces that copy's ``forward`` with the hub
    kernel's, which has no Python source here, and notes the repository it
    came from. ``None`` too when ``bound`` is no function module (a plain or
    routed function).
    """
    if hub_module_function(bound) is None:
        return None
    copies = getattr(owner, "__dict__", {}).get("_kernel_funcs", {}).values()
    copy_for_owner = next((copy for copy in copies if type(copy) is type(bound)), None)
    if copy_for_owner is None or "forward" not in copy_for_owner.__dict__:
        return None
    repository = copy_for_owner.__dict__.get("_kernel_repo")
    for attribute in ("repo_id", "_repo_id"):
        if isinstance(getattr(repository, attribute, None), str):
            return getattr(repository, attribute)
    replacement = copy_for_owner.__dict__["forward"]
    layer = getattr(replacement, "__func__", replacement)
    return getattr(layer, "__qualname__", None) or "a hub kernel"


# -- what a modeling module declares ---------------------------------------------------------------------

#: transformers' decorator declaring a kernel it may take from a package or the hub: ``(kernel name, package)``.
HUB_FALLBACK = "use_kernel_func_from_hub_with_fallback"


@functools.cache
def _declared(path: Path) -> tuple[tuple[str, str, str], ...]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            if (
                isinstance(decorator, ast.Call)
                and ast.unparse(decorator.func).split(".")[-1] == HUB_FALLBACK
                and len(decorator.args) >= 2
                and all(isinstance(arg, ast.Constant) and isinstance(arg.value, str) for arg in decorator.args[:2])
            ):
                found.append((node.name, decorator.args[0].value, decorator.args[1].value))
    return tuple(found)


def hub_kernels(module: ModuleType | Path) -> tuple[tuple[str, str, str], ...]:
    """The kernels a modeling module (or file) declares it takes from a package: ``(function, kernel, package)``.

    Read from its source, without importing anything a kernel needs.
    """
    path = module if isinstance(module, Path) else Path(inspect.getfile(module))
    return _declared(path)


def occurrence(label: str) -> tuple[str, int]:
    """A label's name and occurrence: ``torch_cat_1`` -> ``("torch_cat", 1)``."""
    match = re.fullmatch(r"(.*)_(\d+)", label)
    if match is None:
        raise ValueError(f"{label!r} is not an operation label")
    return match.group(1), int(match.group(2))
