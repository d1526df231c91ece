"""The hand-written stubs (_moe_engine.pyi) declare exactly what the compiled module has: the
same names, and the same parameters (names, keyword-only split, which have defaults) for every
function and method. When a binding changes, this says which line of the stub to update."""

import ast
import re
from pathlib import Path

import moe_engine
from moe_engine import _moe_engine

STUB = Path(moe_engine.__file__).with_name("_moe_engine.pyi")


def parameters(function):
    """(positional names, keyword-only names, number of defaults, has **kwargs) of a def."""
    args = function.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    defaults = len(args.defaults) + sum(d is not None for d in args.kw_defaults)
    return positional, [a.arg for a in args.kwonlyargs], defaults, args.kwarg is not None


def runtime_parameters(function, name):
    # nanobind's signature text, e.g. "def f(x: object, *, k: int = \0) -> object", with
    # defaults as \0, \1, ...: replaced by ... it parses as Python.
    text = function.__nb_signature__[0][0]
    text = re.sub(r"\\\d+", "...", text).replace("def (", f"def {name}(", 1)
    return parameters(ast.parse(text + ": ...").body[0])


def stub_module():
    return ast.parse(STUB.read_text())


def public_names(node_body):
    names = {}
    for node in node_body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign):
            names[node.target.id] = node
    return names


def test_module_names_match():
    declared = {n for n in public_names(stub_module().body)}
    actual = {n for n in vars(_moe_engine) if not n.startswith("_")} | {"__version__"}
    assert declared == actual
    assert set(moe_engine.__all__) == actual


def test_function_parameters_match():
    for name, node in public_names(stub_module().body).items():
        if isinstance(node, ast.FunctionDef):
            assert parameters(node) == runtime_parameters(getattr(_moe_engine, name), name), name


def test_class_members_match():
    for class_name, node in public_names(stub_module().body).items():
        if not isinstance(node, ast.ClassDef) or class_name == "MoeError":
            continue
        cls = getattr(_moe_engine, class_name)
        declared = public_names(node.body)
        actual = {n: v for n, v in vars(cls).items() if not n.startswith("_")}
        assert set(declared) == set(actual), class_name
        for name, member in declared.items():
            decorators = {d.id for d in member.decorator_list if isinstance(d, ast.Name)}
            where = f"{class_name}.{name}"
            assert ("property" in decorators) == isinstance(actual[name], property), where
            if "property" not in decorators:
                assert parameters(member) == runtime_parameters(actual[name], name), where
