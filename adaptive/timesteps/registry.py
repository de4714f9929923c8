"""Timestep methods by name: each method file registers its class (`@register`), whose `name`, `Options` (a small
frozen dataclass of `fields.setting`s: default, help, check) and `from_options` constructor are all the rest of the
project needs - the `--timestep_sampler` choices, the method's flags in `--help` (its own section), validation, the
saved config and the golden runs come from here. A user's method plugs in as `--timestep_sampler pkg.module:Class`.

The configuration reads the built-in methods from their files without importing them (`declared`): a method file
imports torch (~1 s), and `train_accelerate.py --help` or a config check does not need it. So a method's `Options` is
declarative - literals, `fields`' helpers and the module's literal constants - and its class says `name = "..."`
and `Options = ...` in its body (or inherits them from a method of the same file or the default); `register` checks,
when the file is imported for training, that the class it registers has exactly the declared options.

Option names are flag names (`adaptive_balance`, `speed_k`): unique across methods and the training config.
This module imports neither torch nor a method file.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import re
import typing
from pathlib import Path

from .. import fields
from ..errors import ConfigError
from ..fields import NoOptions, check_fields

METHODS: dict[str, type] = {}  # the built-in methods imported so far, in registration order (load_all: every one)
EXTERNAL = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # pkg.module:Class
NOT_METHOD_FILES = ("__init__", "base", "registry", "report")
BASE = (f"{__package__}.base", "TimestepSampler")  # the contract's class, named: this module does not import torch
DEFAULT_FILE = "uniform"  # the default method's file: its method is the first choice in --help


@dataclasses.dataclass(frozen=True)
class Declared:
    """A method as the configuration sees it: its `--timestep_sampler` value, name, Options and one-paragraph doc."""

    spec: str  # the name of a built-in method, or pkg.module:Class
    name: str
    Options: type
    doc: str
    module: str


# -- the built-in methods, read from their files --------------------------------------------------------------------
@functools.cache
def declared() -> dict[str, Declared]:
    """Name -> declaration of every built-in method, the default first, then by file name; no method file is
    imported."""
    files = sorted((p for p in Path(__file__).parent.glob("*.py") if p.stem not in NOT_METHOD_FILES),
                   key=lambda p: (p.stem != DEFAULT_FILE, p.stem))
    found: dict[str, Declared] = {}
    by_class: dict[str, Declared] = {}  # class name -> its declaration, for a method that inherits another's
    for path in files:
        for cls_name, decl in declarations_in(path, by_class):
            if decl.name in found:
                raise ValueError(f"timestep method {decl.name!r} declared twice ({found[decl.name].module}, "
                                 f"{decl.module})")
            found[decl.name] = by_class[cls_name] = decl
    names = [n for d in found.values() for n in option_names(d)]
    if len(set(names)) < len(names):
        raise ValueError(f"timestep methods share option names: {sorted({n for n in names if names.count(n) > 1})}")
    return found


def declarations_in(path: Path, by_class: dict[str, Declared]) -> list[tuple[str, Declared]]:
    """(class name, declaration) of each `@register` class of one method file, from its syntax tree."""
    tree = ast.parse(path.read_text(), str(path))
    module = f"{__package__}.{path.stem}"
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    out = []
    for node in classes.values():
        if not any(isinstance(d, ast.Name) and d.id == "register" for d in node.decorator_list):
            continue
        body = {t.id: s.value for s in node.body if isinstance(s, ast.Assign) for t in s.targets
                if isinstance(t, ast.Name)}
        parent = next((by_class[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in by_class), None)
        if "Options" in body:
            options = options_class(classes[body["Options"].id], path, module, literal_constants(tree))
        else:
            options = parent.Options if parent else NoOptions
        doc = ast.get_docstring(node) or ast.get_docstring(tree) or ""
        name = ast.literal_eval(body["name"])
        out.append((node.name, Declared(name, name, options, first_paragraph(doc), module)))
        by_class[node.name] = out[-1][1]
    return out


def literal_constants(tree: ast.Module) -> dict[str, typing.Any]:
    """The module's top-level `NAME = <literal>` assignments."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return out


def options_class(node: ast.ClassDef, path: Path, module: str, constants: dict) -> type:
    """Build a method's Options dataclass from its class statement alone (annotations evaluated here)."""
    helpers = {k: v for k, v in vars(fields).items() if not k.startswith("_")}
    namespace = {"__name__": module, "dataclass": dataclasses.dataclass, "Optional": typing.Optional, **helpers,
                 **constants}
    code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec", dont_inherit=True)
    try:
        exec(code, namespace)  # the class statement of the method's own file, nothing else
    except NameError as e:
        raise ValueError(f"{path.name}: {node.name} must use only literals, fields' helpers and the file's literal "
                         f"constants ({e})") from None
    return namespace[node.name]


def first_paragraph(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].split())


def load_all() -> dict[str, type]:
    """Import every built-in method (each registers itself): METHODS, complete."""
    for decl in declared().values():
        importlib.import_module(decl.module)
    return METHODS


# -- registration (when a method file is imported) ------------------------------------------------------------------
def register(cls: type) -> type:
    """Class decorator of a built-in method: makes `cls.name` a `--timestep_sampler` choice; its options must be the
    ones its file declares (see the module docstring)."""
    check_method(cls, cls.name)
    decl = declared().get(cls.name)
    if decl is None or decl.module != cls.__module__:
        raise ValueError(f"timestep method {cls.name!r} ({cls.__module__}) is not declared the way registry.py "
                         "reads it: `name = ...` in the body of a @register class of adaptive/timesteps/")
    if option_signature(cls.Options) != option_signature(decl.Options):
        raise ValueError(f"timestep method {cls.name!r}: its Options differ from the ones its file declares")
    if cls.name in METHODS and METHODS[cls.name] is not cls:
        raise ValueError(f"timestep method {cls.name!r} already registered")
    METHODS[cls.name] = cls
    return cls


def option_signature(options: type) -> list[tuple]:
    """Names, defaults, help, choices and sections of an Options dataclass (what the configuration uses)."""
    return [(f.name, f.default, *(f.metadata.get(k) for k in ("help", "choices", "section")))
            for f in dataclasses.fields(options)]


def check_method(cls, spec: str) -> None:
    """ConfigError unless `cls` is a usable method class (the contract in base.py)."""
    if not (isinstance(cls, type) and any((c.__module__, c.__qualname__) == BASE for c in cls.__mro__)):
        raise ConfigError(f"--timestep_sampler {spec}: not a TimestepSampler subclass (adaptive/timesteps/base.py)")
    opts = getattr(cls, "Options", None)
    if not (dataclasses.is_dataclass(opts) and opts.__dataclass_params__.frozen):
        raise ConfigError(f"--timestep_sampler {spec}: {cls.__name__}.Options must be a frozen dataclass")


# -- lookups --------------------------------------------------------------------------------------------------------
def declaration(spec: str) -> Declared:
    """What the configuration needs of a `--timestep_sampler` value: a built-in method's declaration (no import), or
    a user's `pkg.module:Class` (imported)."""
    if spec in declared():
        return declared()[spec]
    cls = external(spec)
    doc = cls.__doc__ or importlib.import_module(cls.__module__).__doc__ or ""
    return Declared(spec, cls.name, cls.Options, first_paragraph(doc), cls.__module__)


def method(spec: str) -> type:
    """The method class of a `--timestep_sampler` value (its file is imported: torch)."""
    if spec in declared():
        importlib.import_module(declared()[spec].module)  # registers it
        return METHODS[spec]
    return external(spec)


def external(spec: str) -> type:
    """A user's method class, `pkg.module:Class`; ConfigError for an unknown name or one that does not import."""
    if not EXTERNAL.match(spec):
        raise ConfigError(f"--timestep_sampler {spec!r} is not one of {', '.join(declared())} (or pkg.module:Class)")
    module, _, name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception as e:  # not found, or the user's module failed while importing (any error of its code)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"--timestep_sampler {spec}: cannot import it ({type(e).__name__}: {first})") from None
    check_method(cls, spec)
    clash = sorted(set(option_names(cls)) & {n for d in declared().values() for n in option_names(d)})
    if clash:
        raise ConfigError(f"--timestep_sampler {spec}: options {clash} are a built-in method's")
    return cls


def option_names(method_or_declared) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(method_or_declared.Options))


def options_from(method_or_declared, values: dict):
    """Its `Options` from a dict of (some of) its fields (lists become tuples); ConfigError on a bad value."""
    known = set(option_names(method_or_declared))
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in known}
    opts = method_or_declared.Options(**kwargs)
    check_fields(opts)
    return opts


def owner_of(option: str) -> typing.Optional[Declared]:
    """The built-in method whose option this is, or None."""
    return next((d for d in declared().values() if option in option_names(d)), None)
