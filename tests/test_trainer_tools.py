"""One table of the torch-side tools (tuiapp/core/common/trainer_tools.py): every entry is a module with a
main, found without importing it (no torch), and no other file of tuiapp/ writes a trainer module's
dotted name in its code (docstrings and comments may name them)."""

import ast
import importlib.util
import re
from pathlib import Path

from tests.source_tree import parsed, tuiapp_files
from tuiapp.core.common import trainer_tools

ROOT = Path(__file__).resolve().parents[1]
DOTTED = re.compile(r"\btuiapp\.trainer\.\w")
TABLE = ROOT / "tuiapp" / "core" / "common" / "trainer_tools.py"


def test_every_tool_is_a_module_with_a_main():
    for name, module in trainer_tools.TOOLS.items():
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, f"{name}: no module {module}"
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert "main" in functions, f"{name}: {module} has no main()"
        assert "__main__" in Path(spec.origin).read_text(encoding="utf-8"), f"{name}: {module} runs nothing with -m"
    assert importlib.util.find_spec(trainer_tools.RANK + ".__main__") is not None


def test_argv_runs_the_module():
    assert trainer_tools.argv("dry", ["a"], python="py") == ["py", "-m", trainer_tools.TOOLS["dry"], "a"]


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def test_no_dotted_trainer_module_name_outside_the_table():
    found = []
    for path in tuiapp_files():
        if path == TABLE:
            continue
        tree = parsed(path)
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                    and DOTTED.search(node.value)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
    assert not found, "name the tool in tuiapp/core/common/trainer_tools.py and use its name:\n" + "\n".join(found)
