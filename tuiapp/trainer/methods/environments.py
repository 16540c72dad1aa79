"""The built-in offline environments of agentic GRPO (`[method.environment] builtin = ...`) and the
loading of a user's tools and environment class, for TRL's GRPOTrainer (`tools=`, `environment_factory=`).

calculator  one tool, calculate(expression): + - * / and parentheses over numbers. demo:arith's answer
            column makes its reward verifiable (kind = 'answer').
kv_search   one tool, search(key): the value of a key of a local JSON object file (case-insensitive),
            or the keys that contain it. Rows whose answer column is the value make it verifiable.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from tuiapp.core.config import tools as core_tools
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.prelaunch.rl import function_path


def import_user_file(path: Path, prefix: str):
    """A user's FILE.py imported as module PREFIX + a hash of its path (in the ranks only; pre-flight
    checked it in a subprocess). Used for tools, environment classes and reward functions."""
    module_name = prefix + hashlib.sha1(str(path).encode()).hexdigest()[:8]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_user_object(reference: str, base_dir: Path):
    """NAME of FILE.py (imported here, in the ranks only; pre-flight checked it in a subprocess)."""
    path, name = function_path(reference, base_dir)
    found = getattr(import_user_file(path, "llmtui_tools_"), name, None)
    if not callable(found):
        raise RuntimeError(f"{path} has no function or class '{name}'")
    return found


class CalculatorEnv:
    """Arithmetic on demand: the model writes an expression, the environment computes it."""

    def reset(self, **row) -> None:
        self.calls = 0
        return None

    def calculate(self, expression: str) -> str:
        """Compute an arithmetic expression.

        Args:
            expression: Numbers with + - * / and parentheses, e.g. "12 * (3 + 4)".
        """
        self.calls = getattr(self, "calls", 0) + 1
        return core_tools.number_text(core_tools.calculate(expression))


class KvSearchEnv:
    """A small key-value store read from a local JSON file."""

    table: dict[str, str] = {}

    def reset(self, **row) -> None:
        return None

    def search(self, key: str) -> str:
        """Look a key up in the store.

        Args:
            key: The key to look up (case-insensitive).
        """
        wanted = str(key).strip().lower()
        if wanted in self.table:
            return self.table[wanted]
        close = [k for k in self.table if wanted and wanted in k][:5]
        return "not found" + (f"; keys like it: {', '.join(close)}" if close else "")


def kv_search_class(path: Path):
    table = core_tools.load_kv_file(path)
    return type("KvSearchEnv", (KvSearchEnv,), {"table": table})


def environment_class(recipe: Recipe, base_dir: Path):
    """The recipe's environment class (built-in or the user's), or None."""
    spec = recipe.method.environment
    if spec is None:
        return None
    if spec.builtin == "calculator":
        return CalculatorEnv
    if spec.builtin == "kv_search":
        path = Path(spec.file).expanduser()
        return kv_search_class(path if path.is_absolute() else base_dir / path)
    return load_user_object(spec.class_, base_dir)


def tool_functions(recipe: Recipe, base_dir: Path) -> list:
    return [load_user_object(spec.function, base_dir) for spec in recipe.method.tools]


def trainer_kwargs(recipe: Recipe, base_dir: Path, guard) -> dict:
    """`tools=` and `environment_factory=` for GRPOTrainer, every tool guarded; {} without either."""
    method = recipe.method
    out: dict = {}
    if getattr(method, "tools", None):
        out["tools"] = [guard.wrap(func) for func in tool_functions(recipe, base_dir)]
    cls = environment_class(recipe, base_dir) if getattr(method, "environment", None) else None
    if cls is not None:
        out["environment_factory"] = guard.wrap_class(cls)  # TRL calls it once per rollout slot
    return out
