"""The layering docs/architecture.md describes: envs -> rollout -> algorithms -> monitoring -> the
trainer and its config. No module imports a higher layer (at import time or inside a function)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = {"envs": 0, "starpo_trl.rollout": 1, "starpo_trl.algorithms": 2, "starpo_trl.monitoring": 3}
TOP = 4  # the other starpo_trl modules: config, trainer, models, warm_start, tiny, offline_model, trl_private


def layer(module: str) -> int | None:
    for prefix, level in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return level
    return TOP if module == "starpo_trl" or module.startswith("starpo_trl.") else None


def imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_no_module_imports_a_higher_layer():
    checked, wrong = 0, []
    for path in sorted((ROOT / "starpo_trl").rglob("*.py")) + sorted((ROOT / "envs").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        own = layer(module)
        if module == "starpo_trl":  # the package's public face re-exports the top layer
            continue
        for name in imports(path):
            other = layer(name)
            if other is not None and other > own:
                wrong.append(f"{module} (layer {own}) imports {name} (layer {other})")
        checked += 1
    assert checked > 30 and not wrong, wrong


def test_no_long_function_without_a_reason():
    """No function over 60 lines unless its docstring says why ("Longer than ... on purpose")."""
    long = []
    files = sorted((ROOT / "starpo_trl").rglob("*.py")) + sorted((ROOT / "envs").rglob("*.py"))
    for path in files + [ROOT / "train.py", ROOT / "evaluate.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                if "on purpose" not in (ast.get_docstring(node) or ""):
                    long.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
                    )
    assert not long, long


def test_the_trainer_stays_thin():
    """The trainer only orchestrates (docs/architecture.md): at most 380 lines (676 before the layers)."""
    assert len((ROOT / "starpo_trl" / "trainer.py").read_text().splitlines()) <= 380
