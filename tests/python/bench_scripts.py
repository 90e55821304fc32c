"""The scripts under bench/ and scripts/ are not a package: their tests load them by path."""
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_bench_script(name: str, folder: str = "bench") -> ModuleType:
    """<folder>/<name>.py as a fresh module (registered under ``name``: a dataclass looks its module up)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
