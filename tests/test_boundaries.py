"""The CLI and core never import torch, transformers, deepspeed or textual."""

import ast
import subprocess
import sys
from pathlib import Path

from tests.source_tree import parsed, tuiapp_files

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = ["torch", "transformers", "deepspeed", "textual", "peft", "datasets"]
# every command group of the CLI package: what the bare `llmtui` must not load
SUBCOMMAND_MODULES = sorted(f"tuiapp.cli.{path.stem}" for path in (ROOT / "tuiapp" / "cli").glob("*.py")
                            if not path.stem.startswith("__"))


def imported_of(modules: list[str], unwanted: list[str]) -> list[str]:
    """Which of `unwanted` a fresh interpreter has loaded after importing `modules`."""
    code = f"import sys, {', '.join(modules)}; print([m for m in {unwanted!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return ast.literal_eval(out.stdout.strip())


def test_core_and_cli_import_no_heavy_modules():
    modules = [*SUBCOMMAND_MODULES, "tuiapp.core.prelaunch.door", "tuiapp.core.lifecycle.supervisor", "tuiapp.core.plan.launcher"]
    assert imported_of(modules, FORBIDDEN) == []


def test_ui_imports_no_torch():
    assert imported_of(["tuiapp.ui.app"], ["torch", "transformers", "deepspeed", "tuiapp.trainer"]) == []


def test_import_contracts_hold():
    """pyproject's import-linter contracts: core layers without cycles, pure core, UI without torch."""
    linter = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(linter), "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_the_tui_starts_without_the_schema_or_the_subcommands():
    """The bare `llmtui` imports what the history's first rows need: not pydantic (the recipe
    schema, ~0.2 s), the subcommands, sweeps or numpy (bench/bench_ui.py's start-up)."""
    modules = ["tuiapp.cli.__main__", "tuiapp.ui.launch", "tuiapp.core.store.runs", "tuiapp.core.common.errors", "tuiapp.ui.app"]
    unwanted = ["pydantic", "tuiapp.core.config.recipe", *SUBCOMMAND_MODULES, "tuiapp.core.config.sweep", "numpy", "torch"]
    assert "tuiapp.cli.main" in SUBCOMMAND_MODULES and "tuiapp.cli.runs" in SUBCOMMAND_MODULES
    assert imported_of(modules, unwanted) == []


def test_a_run_or_compare_opens_without_the_schema():
    """The run view and compare import no pydantic either (the recipe schema took ~0.5 s the first
    time one of them opened)."""
    modules = ["tuiapp.ui.screens.compare", "tuiapp.ui.screens.run_view"]
    assert imported_of(modules, ["pydantic", "tuiapp.core.config.recipe", "tuiapp.cli"]) == []


def test_the_history_reads_sweeps_without_the_schema(tmp_path):
    """The history's worker reads the sweeps' records before its first summaries: without the
    recipe schema (importing core.config.sweep there cost ~0.3 s of them on a loaded machine)."""
    (tmp_path / ".groups").mkdir()
    (tmp_path / ".groups" / "sweep-1.json").write_text('{"id": "sweep-1", "name": "lr", "runs": []}')
    code = ("import sys; from pathlib import Path; from tuiapp.ui.groups import read_groups; "
            f"print(list(read_groups(Path({str(tmp_path)!r}))), [m for m in ('pydantic', 'tuiapp.core.config.sweep') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split("\n")[0] == "['sweep-1'] []"


def test_the_bare_command_is_told_from_subcommands():
    from tuiapp.cli.__main__ import tui_runs_dir

    assert tui_runs_dir([]) == (True, None)
    assert tui_runs_dir(["--runs-dir", "r"]) == (True, "r")
    assert tui_runs_dir(["--runs-dir=r"]) == (True, "r")
    for argv in (["run", "x.toml"], ["--help"], ["--runs-dir", "r", "ls"], ["--runs-dir"], ["--runs-dir="], ["-h"]):
        assert tui_runs_dir(argv) == (False, None), argv


def import_graph() -> dict[str, set[str]]:
    """tuiapp's modules -> the tuiapp modules each imports, imports inside functions included."""
    modules = {}
    for path in tuiapp_files():
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in modules:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    graph[name].add(full if full in modules else node.module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found


def test_no_import_cycle_anywhere_in_tuiapp():
    """Not even through an import inside a function: every module has a place in one order."""
    graph = import_graph()
    assert len(graph) > 100 and "tuiapp.trainer.dataset.data" in graph["tuiapp.trainer.dataset.streaming"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles(graph) == []


# file names joined with a folder outside core/run_folder that are not a run folder's: the files of
# a model folder (Hugging Face's), of an export folder and of the demo benchmark's cache folder
FOREIGN_FILES = {"config.json", "adapter_config.json", "bottleneck_config.json", "tokenizer_config.json",
                 "tokenizer.json", "gguf-convert.log", "facts_mc.jsonl"}
# a run-folder name spelled outside core/run_folder on purpose: (path, name) → why
SPELLED_ELSEWHERE = {
    ("tuiapp/core/data/cache_entry.py", "llmtui.json"): "a tokenize-cache entry's info file, not a run's",
    ("tuiapp/core/data/bench_tasks.py", "bench"): "the demo benchmark's folder in the cache, not a run's",
}
RUN_FILE_SUFFIXES = (".json", ".jsonl", ".log", ".toml", ".lock", ".txt")
# modules that speak the chat server's stdout protocol ({"event": "token"} ...), not events.jsonl
CHAT_PROTOCOL = {"tuiapp/trainer/tools/serve.py", "tuiapp/core/after/chat.py", "tuiapp/cli/after.py",
                 "tuiapp/ui/screens/chat.py", "tuiapp/core/after/judging.py"}


def _modules_outside_run_folder():
    for path in tuiapp_files():
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith("tuiapp/core/run_folder/"):
            yield rel, parsed(path)


def _run_root_names() -> tuple[set[str], set[str]]:
    """(every name rundir gives a run's file or folder, the identifiers of those in the run's root:
    rundir's constants and the aliases other modules keep of them)."""
    from tuiapp.core.run_folder import rundir

    constants = {k: v for k, v in vars(rundir).items() if k.isupper() and isinstance(v, str)}
    root = Path("/run")
    folder = rundir.RunDir(root)
    at_root = {getattr(folder, name).name for name in dir(rundir.RunDir)
               if isinstance(getattr(rundir.RunDir, name), property) and getattr(folder, name).parent == root}
    identifiers = {k for k, v in constants.items() if v in at_root}
    for _, tree in _modules_outside_run_folder():  # NAME = rundir.X or NAME = X: an alias
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = node.value
                source = value.attr if isinstance(value, ast.Attribute) else getattr(value, "id", None)
                if source in identifiers:
                    identifiers.add(node.targets[0].id)
    return set(constants.values()), identifiers


def test_the_run_folder_names_are_spelled_in_rundir_only():
    """A run folder's file and folder names are spelled in core/run_folder/rundir.py only, and no
    module outside core/run_folder joins a folder with one (a string, or a name of rundir's for a file
    in the run's root): they take the path from RunDir, so a rename is one line."""
    names, identifiers = _run_root_names()
    assert {"run.json", "events.jsonl", "meta.json", "serve.json", "probe.json", "vllm-server.log", "notify.log",
            "llmtui.json", "ranks", "nodes", "final"} <= names
    assert {"RUN_JSON", "EVENTS_JSONL", "META_NAME", "LOG_NAME", "PROBE_FILE", "TOOL_ERRORS_FILE"} <= identifiers
    found = []
    for rel, tree in _modules_outside_run_folder():
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', '?')}"
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value
                    and node.value in names and (rel, node.value) not in SPELLED_ELSEWHERE):
                found.append(f"{where}: {node.value!r} spelled (take it from rundir)")
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
                continue
            right = node.right
            if isinstance(right, ast.Constant) and isinstance(right.value, str):
                value = right.value
                if (value in names or value.endswith(RUN_FILE_SUFFIXES)) and value not in FOREIGN_FILES \
                        and (rel, value) not in SPELLED_ELSEWHERE:
                    found.append(f"{where}: / {value!r} (a RunDir attribute)")
            name = right.attr if isinstance(right, ast.Attribute) else getattr(right, "id", None)
            parent = node.left
            relative = isinstance(parent, ast.Call) and [getattr(a, "value", None) for a in parent.args] == [".."]
            if name in identifiers and not relative:
                found.append(f"{where}: / {name} (a RunDir attribute)")
    assert not found, "\n".join(found)


def test_events_are_named_in_the_events_vocabulary():
    """Every kind written to or read from events.jsonl outside core/run_folder is a constant of
    core/run_folder/events.py, and every kind there is written by someone."""
    from tuiapp.core.run_folder import events

    found, written = [], set()
    for rel, tree in _modules_outside_run_folder():
        if rel in CHAT_PROTOCOL:
            continue
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == events.KEY:
                        if isinstance(value, ast.Constant):
                            found.append(f"{where}: event {value.value!r} spelled (use events.py's constant)")
                        elif isinstance(value, ast.Attribute):
                            written.add(getattr(events, value.attr))
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) and node.left.args \
                    and getattr(node.left.args[0], "value", None) == events.KEY:
                for other in node.comparators:
                    if isinstance(other, ast.Constant):
                        found.append(f"{where}: event {other.value!r} compared (use events.py's constant)")
    assert not found, "\n".join(found)
    assert events.KINDS - set(events.OUTCOMES) - written == set(), "kinds nobody writes"
    assert set(events.OUTCOMES) <= events.KINDS


LONGEST_FUNCTION = 60  # lines, decorators excluded: a longer one is split into named steps


def test_no_function_in_tuiapp_is_longer_than_a_screen():
    long = []
    for path in tuiapp_files():
        for node in ast.walk(parsed(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"functions over {LONGEST_FUNCTION} lines (split them into named steps):\n" + "\n".join(long)
