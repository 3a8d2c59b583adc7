"""The participant's parts share no hidden fields (issue 32 item 7), checked from the source.

:class:`fsmingle.protocol.participant.Participant` is built from parts (``Joining``, ``Leaving``,
``GenerationReader``, ``OutsideWorld`` and the driver itself) that share one object.  Their
shared state lives in typed objects (:mod:`fsmingle.protocol.parts_state`: the generation's view,
the seat -- the claim, the role and the placement --, the timers, the identity, the wiring, the
spare's standing), which each part declares in its class body (``view: GenView``), so a part's
inputs are read from its declaration rather than from five files.  This test computes, for each
part, the ``self.<field>`` it reads and the ones it assigns, with the standard library's
:mod:`ast` (nothing is imported), and fails if a part reads a data field that another part
assigns: methods do not count, nor do the fields *of* the typed state objects.  It also fails if
a part reads a data field that no part assigns (a field reached through ``Participant``'s
compatibility properties, which exist for the engine's other modules: rank 0, the member, the
queue), and if a part uses a state object it does not declare.
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "fsmingle" / "protocol"
PART_FILES = ("participant.py", "joining.py", "leaving.py", "genreader.py", "outside.py", "partition.py")
PARTS = ("Participant", "Joining", "Leaving", "GenerationReader", "OutsideWorld", "Rank0Shyness")
STATE_MODULE = ENGINE / "parts_state.py"

# Cross-part reads still to be folded into typed state (shrinking to empty is the goal): none.
ALLOWED: set[tuple[str, str]] = set()


class Part:
    """What one class's own source says: its methods, the self fields it reads and assigns, and
    the state objects it declares (``name: Type`` in its class body, no value)."""

    def __init__(self, cls: ast.ClassDef):
        self.name = cls.name
        self.methods: set[str] = set()
        self.declared: dict[str, str] = {}  # state object name -> its annotated type
        self.reads: dict[str, int] = {}  # field -> first line
        self.assigns: dict[str, int] = {}
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.methods.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if node.value is None:
                    self.declared[node.target.id] = ast.unparse(node.annotation)
                else:
                    self.assigns.setdefault(node.target.id, node.lineno)  # a class-level default
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.assigns.setdefault(t.id, node.lineno)
        for fn in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                    if isinstance(node.ctx, ast.Store):
                        self.assigns.setdefault(node.attr, node.lineno)
                    else:
                        self.reads.setdefault(node.attr, node.lineno)
                elif isinstance(node, ast.AugAssign) and _is_self_attr(node.target):
                    self.reads.setdefault(node.target.attr, node.lineno)  # x += 1 reads x too
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    # getattr(self, "x", ...), setattr(self, "x", ...), hasattr(self, "x")
                    args = node.args
                    if node.func.id in ("getattr", "setattr", "hasattr") and len(args) >= 2:
                        if isinstance(args[0], ast.Name) and args[0].id == "self" and isinstance(args[1], ast.Constant):
                            where = self.assigns if node.func.id == "setattr" else self.reads
                            where.setdefault(str(args[1].value), node.lineno)


def _is_self_attr(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _parts(files=PART_FILES, names=PARTS, where: Path = ENGINE) -> dict[str, Part]:
    found: dict[str, Part] = {}
    for f in files:
        for node in ast.walk(ast.parse((where / f).read_text())):
            if isinstance(node, ast.ClassDef) and node.name in names:
                found[node.name] = Part(node)
    assert set(found) == set(names), f"parts not found: {set(names) - set(found)}"
    return found


def _state_types(module: Path = STATE_MODULE) -> set[str]:
    """The typed state objects' classes (every class of the state module)."""
    if not module.exists():
        return set()
    return {n.name for n in ast.walk(ast.parse(module.read_text())) if isinstance(n, ast.ClassDef)}


def problems(parts: dict[str, Part], state_types: set[str], allowed=frozenset()) -> list[str]:
    """Every read of another part's data field, every read of a data field nobody assigns, every
    state object used without being declared, and every one declared and never used (a part's
    declarations are its inputs: exactly what it acts on)."""
    methods = set().union(*(p.methods for p in parts.values()))
    holders = {
        name for p in parts.values() for name, ann in p.declared.items() if ann.split("|")[0].strip() in state_types
    }
    bad = []
    for p in parts.values():
        for field, line in sorted(p.reads.items()):
            if field in methods or field.startswith("__") or (p.name, field) in allowed:
                continue
            if field in holders:
                if field not in p.declared:
                    bad.append(f"{p.name}:{line} uses state object {field!r} without declaring it ({field}: ...)")
                continue
            others = sorted(q.name for q in parts.values() if q is not p and field in q.assigns)
            if others:
                bad.append(f"{p.name}:{line} reads self.{field}, which {', '.join(others)} assign(s)")
            elif field not in p.assigns:
                bad.append(f"{p.name}:{line} reads self.{field}, a data field no part assigns")
    for p in parts.values():
        bad.extend(
            f"{p.name} declares state object {name!r} but never uses it"
            for name in sorted(p.declared)
            if name not in p.reads and name not in p.assigns
        )
    return bad


def test_no_part_reads_a_field_another_part_assigns():
    bad = problems(_parts(), _state_types(), ALLOWED)
    assert not bad, (
        "the participant's parts share fields outside their typed state "
        "(fsmingle/protocol/parts_state.py):\n" + "\n".join(bad)
    )


def test_every_state_object_is_typed_and_assigned_once():
    # The holders of the shared state are made once, by the driver, from the state module's types.
    parts = _parts()
    types = _state_types()
    declared = {n: a for p in parts.values() for n, a in p.declared.items()}
    assert declared and all(a.split("|")[0].strip() in types for a in declared.values()), declared
    for name in declared:
        writers = [p.name for p in parts.values() if name in p.assigns]
        assert writers == ["Participant"], f"{name} is assigned by {writers}"


def test_the_checker_sees_a_shared_field(tmp_path):
    # The checker itself can fail: two parts that share a plain field, and one reaching a field
    # through a property it does not own, are both caught; a declared state object is not.
    (tmp_path / "s.py").write_text("class View:\n    pass\n")
    (tmp_path / "a.py").write_text(
        "class A:\n"
        "    view: View\n"
        "    def go(self):\n"
        "        self.gen = 1\n"
        "        self.view.x = 2\n"
        "class B:\n"
        "    view: View\n"
        "    def see(self):\n"
        "        return self.gen, self.view.x, self.go(), self.compat\n"
        "class C:\n"
        "    def peek(self):\n"
        "        return self.view\n"
        "class D:\n"
        "    view: View\n"
    )
    parts = _parts(("a.py",), ("A", "B", "C", "D"), tmp_path)
    bad = problems(parts, _state_types(tmp_path / "s.py"))
    assert len(bad) == 4, bad
    assert "D declares state object 'view' but never uses it" in bad
    assert "B:9 reads self.gen, which A assign(s)" in bad
    assert any("self.compat, a data field no part assigns" in b for b in bad)
    assert any("C:12 uses state object 'view' without declaring it" in b for b in bad)
