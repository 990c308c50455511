"""The serving layer sits above the models. Nothing in pipeline/ and nothing under models/ outside
models/serving/ imports models.serving, except each model's server (models/<model>/server.py), which
imports of it only its floor, the request policy (models/serving/request_policy.py); the request policy
imports nothing of models/. So the model packages, training and evaluation never load serving, the
servers sit between the request policy and the pyfunc model, and serving reaches a server, and training
the pyfunc logger, only by a registry name (common/catalog.py `ModelEntry.server`, `PYFUNC_LOGGER`)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

SERVING = "models.serving"
FLOOR = "models.serving.request_policy"  # what a model's server may import of serving


def serving_imports(path: Path, root: Path) -> list[str]:
    """`file:line: module` for each import of the serving layer in `path` (a file under `root`):
    `import`, `from ... import` (relative ones resolved) and a call whose first argument names it
    (`importlib.import_module("models.serving...")`, `catalog.resolve("models.serving...:name")`)."""
    relative = path.relative_to(root)
    package = list(relative.parent.parts)
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ([*package[: len(package) - node.level + 1]] if node.level else []) + (
                node.module.split(".") if node.module else []
            )
            names = [".".join(base)] + [".".join([*base, alias.name]) for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            names = [str(node.args[0].value).split(":")[0]]
        else:
            continue
        found = [n for n in names if n == SERVING or n.startswith(SERVING + ".")]
        hits += [f"{relative}:{node.lineno}: {found[0]}"] if found else []
    return hits


def test_no_model_package_nor_the_pipeline_imports_serving():
    servers = sorted((ROOT / "models").glob("*/server.py"))
    files = [p for p in (ROOT / "models").rglob("*.py") if p.relative_to(ROOT / "models").parts[0] != "serving"]
    files += list((ROOT / "pipeline").rglob("*.py"))
    assert len(files) > 50 and ROOT / "models" / "asr" / "server.py" in servers
    hits = [hit for path in files if path not in servers for hit in serving_imports(path, ROOT)]
    assert not hits, "imports of the serving layer from below it:\n" + "\n".join(hits)


def test_a_model_server_imports_of_serving_only_the_request_policy():
    servers = sorted((ROOT / "models").glob("*/server.py"))
    assert {p.parent.name for p in servers} >= {"asr", "tts"}
    hits = [hit for path in servers for hit in serving_imports(path, ROOT) if not hit.endswith(": " + FLOOR)]
    assert not hits, "a model's server imports serving above its request policy:\n" + "\n".join(hits)
    assert all(serving_imports(path, ROOT) for path in servers), "a server that reads no request policy"


def test_the_request_policy_imports_nothing_of_models():
    policy = ROOT / "models" / "serving" / "request_policy.py"
    tree = ast.parse(policy.read_text(encoding="utf-8"))
    modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    modules += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert "mlflow.exceptions" in modules  # the check reads its imports
    assert not [m for m in modules if m == "models" or m.startswith("models.")], modules


def test_the_check_sees_every_form_of_import(tmp_path):
    module = tmp_path / "models" / "asr" / "x.py"
    module.parent.mkdir(parents=True)
    caught = [
        "import models.serving",
        "import models.serving.pyfunc as p",
        "from models.serving import pyfunc",
        "from models import serving",
        "from models.serving.pyfunc import SpeechModel",
        "from ..serving import pyfunc",
        "from .. import serving",
        "def f():\n    from models.serving.request_policy import RequestError",
        "importlib.import_module('models.serving.pyfunc')",
        "catalog.resolve('models.serving.pyfunc:log_model')",
    ]
    for line in caught:
        module.write_text(line + "\n")
        assert serving_imports(module, tmp_path), line
    for line in [
        "from models import trained_model",
        "import models.serving_extra",
        "from . import server",
        "x = 'models'",
    ]:
        module.write_text(line + "\n")
        assert not serving_imports(module, tmp_path), line
