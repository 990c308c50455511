"""The protocols hold: mypy checks that every registered model's task, evaluation and server and
every strategy implements its models/interfaces.py protocol (tests/typecheck/registered.py), no
registry entry escapes that module, and the check fails on a task whose `loss` lost a parameter."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess

from tests.conftest import PYTHON, ROOT, quiet_env
from tests.test_extension import EXTENSIONS

REGISTERED = ROOT / "tests" / "typecheck" / "registered.py"

# What each registry field's object is checked as in registered.py: (the variable's protocol, the
# helper that makes the instance; None: the object itself).
TASK = ("Task", "instance")
EVALUATION = ("Evaluation", None)
SERVER = ("Server", "server_instance")
STRATEGY = ("Strategy", "strategy_instance")


def registries() -> dict:
    """common/catalog.py's entries with the test extensions loaded (in a child process: loading them
    here would register them for every test that runs after in this process)."""
    code = """
import json
from common import catalog
print(json.dumps({
    "models": {n: [e.task, e.evaluation, e.server] for n, e in catalog.models().items()},
    "strategies": {n: e.strategy for n, e in catalog.strategies().items()},
}))
"""
    proc = subprocess.run(
        [PYTHON, "-c", code],
        cwd=ROOT,
        env=quiet_env(SPEECHFLOW_EXTENSIONS=EXTENSIONS),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def checked(source: str) -> dict[tuple[str, str | None, str], str]:
    """registered.py's checks: (protocol, helper, "module:attribute" of the object) -> the name the
    module gives the object, from its imports and its annotated module-level assignments."""
    tree = ast.parse(source)
    imported = {
        alias.asname or alias.name: f"{node.module}:{alias.name}"
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    checks = {}
    for node in tree.body:
        if not isinstance(node, ast.AnnAssign) or node.value is None:
            continue
        value, helper = node.value, None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and len(value.args) == 1:
            value, helper = value.args[0], value.func.id
        if isinstance(value, ast.Name) and value.id in imported:
            checks[ast.unparse(node.annotation), helper, imported[value.id]] = value.id
    return checks


def mypy(tmp_path, *files: str) -> subprocess.CompletedProcess:
    """mypy as `make typecheck` runs it (pyproject.toml's [tool.mypy]), on `files` if given; a cache
    of its own (the default one is shared by every run in this tree)."""
    return subprocess.run(
        [PYTHON, "-m", "mypy", "--config-file", "pyproject.toml", "--cache-dir", str(tmp_path / "cache"), *files],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_registered_model_and_strategy_is_type_checked():
    known = registries()
    assert {"speaker_id"} <= set(known["models"]) and {"local_sgd"} <= set(known["strategies"])
    wanted = {
        (*kind, target)
        for task, evaluation, server in known["models"].values()
        for kind, target in ((TASK, task), (EVALUATION, evaluation), (SERVER, server))
    }
    wanted |= {(*STRATEGY, target) for target in known["strategies"].values()}
    missing = sorted(wanted - set(checked(REGISTERED.read_text())))
    assert not missing, (
        f"{REGISTERED.relative_to(ROOT)} does not check these registered objects (protocol, helper, target): "
        f"{missing}; add a line for each beside the others"
    )


def test_the_registered_classes_implement_their_protocols(tmp_path):
    proc = mypy(tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "Success: no issues found in 2 source files" in proc.stdout


def test_the_check_fails_on_a_wrong_signature_and_sees_every_registered_object(tmp_path):
    """A copy of registered.py with a task whose `loss` lacks `seed` (its override error silenced,
    so only the protocol can catch it), and each checked object assigned to `int`: mypy must fail
    on each of those lines and no other; an object mypy could not read (Any) would pass as `int`."""
    source = REGISTERED.read_text()
    names = sorted(set(checked(source).values()))
    lines = source.splitlines()
    lines += [
        "",
        "",
        "class LossWithoutSeed(TtsTask):",
        "    def loss(self, model, batch, training: bool): ...  # type: ignore[override]",
        "",
        "",
        "loss_without_seed: Task = instance(LossWithoutSeed)",
    ]
    broken = len(lines)
    lines += [f"_{name}_is_read: int = {name}" for name in names]
    copy = tmp_path / "registered_broken.py"
    copy.write_text("\n".join(lines) + "\n")

    proc = mypy(tmp_path, str(copy))
    out = proc.stdout
    assert proc.returncode == 1, out[-6000:] + proc.stderr[-3000:]
    failing = {int(n) for n in re.findall(rf"^{re.escape(str(copy))}:(\d+): error:", out, re.M)}
    assert failing == {broken, *range(broken + 1, broken + 1 + len(names))}, out[-6000:]
    assert f'{copy}:{broken}: error: Incompatible types in assignment (expression has type "LossWithoutSeed"' in out
    assert "def loss(self, model: Any, batch: Any, training: bool) -> Any" in out  # the member at fault, as got
