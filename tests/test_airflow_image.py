"""The Airflow image of the cluster mode holds what its DAG imports: the plan runs from the files
docker/airflow.Dockerfile copies, and from nothing else of this repository."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "docker" / "airflow.Dockerfile"

# Run in a process that cannot see the repository: its editable install's finder is taken out, and
# the working directory and PYTHONPATH are the image's tree.
PLAN = """
import json, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
sys.path_hooks[:] = [h for h in sys.path_hooks if "editable" not in getattr(h, "__module__", "")]
sys.path_importer_cache.clear()
import importlib, pkgutil, workflow
from workflow import plan
for module in pkgutil.iter_modules(workflow.__path__):  # every module the DAG's tasks may import
    importlib.import_module(f"workflow.{module.name}")
made = plan.make_plan({"execution_mode": "kubernetes", "train_overrides": ["asr.targets=phones"]}, "d", "run-1")
print(json.dumps({
    "models": sorted(m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)
                     and m.__name__.split(".")[0] in ("models", "pipeline", "common", "workflow")),
    "heavy": [m for m in ("tensorflow", "numpy", "airflow") if m in sys.modules],
    "configs": sorted(made.configs),
}))
"""


def copies(dockerfile: str) -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY of the repository's files, continuation lines joined."""
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", dockerfile, re.M))
    out = []
    for line in dockerfile.replace("\\\n", " ").splitlines():
        if not line.startswith("COPY "):
            continue
        words = [w for w in line.split()[1:] if not w.startswith("--")]
        words = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], w) for w in words]
        out.append((words[:-1], words[-1]))
    return out


def build_tree(image: Path) -> None:
    """The image's files under `image` (its / ), as the Dockerfile's COPY lines lay them out."""
    for sources, dest in copies(DOCKERFILE.read_text()):
        for source in sources:
            src, target = ROOT / source, image / dest.lstrip("/")
            if src.is_dir():
                shutil.copytree(src, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target = target / src.name if dest.endswith("/") else target
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, target)


def test_the_plan_runs_in_cluster_mode_from_the_airflow_images_files(tmp_path):
    image = tmp_path / "image"
    build_tree(image)
    env_lines = re.findall(r"^ENV (\w+)=(\S+)", DOCKERFILE.read_text(), re.M)
    env = {name: value.replace("/opt/", f"{image}/opt/") for name, value in env_lines}
    env["HOME"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", PLAN], cwd=image, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["heavy"] == []
    assert all(path.startswith(str(image)) for path in seen["models"]), "imported from outside the image"
    assert f"{image}/opt/speechflow/models/training/config.py" in seen["models"]
    assert seen["configs"] == ["asr", "tts"]
