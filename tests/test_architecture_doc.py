"""docs/architecture.md's table of rooms is the code's: every package is a room of it, and no
module imports a room its room may not (read from the modules' own import statements)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
_ROW = re.compile(r"^\| `([a-z]+)/` \| .* \| (.*) \|$")


def allowed_imports() -> dict[str, set[str]]:
    """Room: the rooms it may import, from the table under "The house"."""
    rooms = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if match:
            rooms[match.group(1)] = set(re.findall(r"`([a-z]+)`", match.group(2)))
    return rooms


def imported_rooms(room: str, rooms: set[str]) -> dict[str, set[str]]:
    """Each room this room's modules import: the modules that do, by room."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / room).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in rooms and top != room:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_package_is_a_room_of_the_table() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert set(allowed_imports()) == packages


def test_no_room_imports_one_it_may_not() -> None:
    allowed = allowed_imports()
    wrong = {
        f"{room} imports {other}: {sorted(modules)}"
        for room in allowed
        for other, modules in imported_rooms(room, set(allowed)).items()
        if other not in allowed[room]
    }
    assert not wrong


def test_the_table_is_read_whole() -> None:
    """The check above reads a table that says something: the bottom rooms import nothing,
    transport may not import the commands, and nothing imports the benches."""
    allowed = allowed_imports()
    assert allowed["storage"] == allowed["providers"] == allowed["client"] == set()
    assert allowed["transport"] == {"actors", "storage", "providers"}
    assert "cli" not in set().union(*(allowed[room] for room in allowed if room != "bench"))
    assert "bench" not in set().union(*allowed.values())
