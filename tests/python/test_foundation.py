"""The package as a user meets it: import with and without torch, no CUDA
initialisation at import, the CLI, argument errors that name the argument,
and the README's examples."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hisparse

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, *, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter that imports the same hisparse."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=str(REPO.parent),  # not the repo root: the installed package, not python/hisparse
    )


def check_ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


# ---------------------------------------------------------------------- import

CORE_API = ("Config", "HostLayout", "HostPool", "STAT_NAMES", "check_host_memory", "ops", "plan_host_layout")


def test_import_without_torch_exposes_the_api():
    code = f"""
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
import numpy as np
import hisparse
from hisparse import ops

for name in hisparse.__all__ + {list(CORE_API)!r}:
    getattr(hisparse, name)
assert callable(ops.resolve_residency) and callable(ops.copy_bytes)
assert hisparse.__version__ == hisparse._C.version()

pool = hisparse.HostPool(1 << 16, register="never")
view = pool.view("int32", (4, 4), offset=64)
assert isinstance(view, np.ndarray) and view.shape == (4, 4) and view.dtype == np.int32
view[:] = 3
assert pool.view("uint8", (4,), offset=64).tolist() == [3, 0, 0, 0]
del view
pool.release()

layout = hisparse.plan_host_layout(4096, 64, 640, 12 * 4096)
assert layout.host_num_blocks == 12
hisparse.Config(row_bytes=656)

# The CPU backend runs on NumPy arrays.
src = np.arange(64, dtype=np.uint8)
dst = np.zeros(16, dtype=np.int32)
ops.copy_bytes(dst, src)
assert dst.tobytes() == src.tobytes()
print("no-torch OK")
"""
    assert "no-torch OK" in check_ok(run_python(code))


@pytest.mark.slow
def test_import_never_initialises_cuda():
    pytest.importorskip("torch")
    # torch present: importing hisparse must not initialise torch's CUDA.
    # LD_DEBUG=libs logs every library lookup, found or not, so any device
    # query through the CUDA runtime (which loads libcuda) shows up even on a
    # machine without a driver.
    code = """
import sys
import torch
print("<<import>>", file=sys.stderr, flush=True)
import hisparse
import hisparse.cli, hisparse.ops, hisparse.host_pool, hisparse.layout, hisparse.config
print("<<imported>>", file=sys.stderr, flush=True)
assert not torch.cuda.is_initialized(), "import hisparse initialised CUDA"
if hisparse._C.build_info()["cuda_compiled"]:
    hisparse._C.cuda_device_count()
print("<<queried>>", file=sys.stderr, flush=True)
print("cuda-compiled" if hisparse._C.build_info()["cuda_compiled"] else "cpu-only")
"""
    result = run_python(code, env={"LD_DEBUG": "libs"})
    stdout = check_ok(result)
    during_import = result.stderr.split("<<import>>", 1)[1].split("<<imported>>", 1)[0]
    assert "libcuda.so" not in during_import, "importing hisparse looked up the CUDA driver"
    before_import = result.stderr.split("<<import>>", 1)[0]
    if "cuda-compiled" in stdout and "libcuda.so" not in before_import:
        # The probe itself is visible, so the check above can fail. (Where
        # torch already loaded the driver, a second load is not logged.)
        after_query = result.stderr.split("<<imported>>", 1)[1].split("<<queried>>", 1)[0]
        assert "libcuda.so" in after_query


def test_import_without_torch_never_touches_the_driver():
    code = """
import sys
sys.modules["torch"] = None
print("<<import>>", file=sys.stderr, flush=True)
import hisparse
print("<<imported>>", file=sys.stderr, flush=True)
"""
    result = run_python(code, env={"LD_DEBUG": "libs"})
    check_ok(result)
    during_import = result.stderr.split("<<import>>", 1)[1].split("<<imported>>", 1)[0]
    assert "libcuda.so" not in during_import


def test_package_ships_stub_and_marker():
    package = Path(hisparse.__file__).parent
    assert (package / "py.typed").is_file()
    stub = package / "_C.pyi"
    assert stub.is_file()
    text = stub.read_text()
    for name in ("class HostPool", "def plan_host_layout", "def validate_config", "def copy_bytes",
                 "def gather_compact_group", "class KvCache", "def write_rows", "def read_rows",
                 "def update_residency", "def host_register"):
        assert name in text, f"{name} missing from the generated stub"


def test_version_is_consistent():
    header = (REPO / "cpp/include/hisparse/hisparse.h").read_text()
    version = re.search(r'#define HISPARSE_VERSION_STRING "([^"]+)"', header).group(1)
    assert hisparse.__version__ == version
    major, minor, patch = (int(x) for x in version.split("."))
    assert hisparse._C.version_code() == major * 10000 + minor * 100 + patch


# ---------------------------------------------------------------------- CLI


@pytest.mark.slow
def test_module_info_prints_the_version():
    result = subprocess.run(
        [sys.executable, "-m", "hisparse", "info"], capture_output=True, text=True, timeout=120, cwd=REPO.parent
    )
    stdout = check_ok(result)
    assert f"hisparse {hisparse.__version__}" in stdout
    assert "backends" in stdout and "host register" in stdout


def _console_script() -> str:
    found = shutil.which("hisparse")
    if found is None:
        candidate = Path(sys.executable).parent / "hisparse"
        found = str(candidate) if candidate.exists() else None
    if found is None:
        pytest.fail("the `hisparse` console script is not on PATH; `pip install .` installs it")
    return found


@pytest.mark.slow
def test_console_script_info_json():
    result = subprocess.run([_console_script(), "info", "--json"], capture_output=True, text=True, timeout=120)
    info = json.loads(check_ok(result))
    assert info["version"] == hisparse.__version__
    assert "cpu" in info["backends"]
    assert ("cuda" in info["backends"]) == info["build"]["cuda_compiled"]
    assert isinstance(info["cuda_devices"], list)
    assert isinstance(info["host_registration"]["works"], bool)
    if not info["host_registration"]["works"]:
        assert info["host_registration"]["reason"]
    assert info["available_host_memory_bytes"] > 0


@pytest.mark.slow
def test_console_script_plain_info():
    result = subprocess.run([_console_script(), "info"], capture_output=True, text=True, timeout=120)
    assert f"hisparse {hisparse.__version__}" in check_ok(result)


def test_cli_rejects_unknown_commands():
    result = subprocess.run(
        [sys.executable, "-m", "hisparse", "frobnicate"], capture_output=True, text=True, timeout=60, cwd=REPO.parent
    )
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


# ---------------------------------------------------------------------- errors name the argument


@pytest.mark.parametrize(
    "args, name",
    [
        ((4100, 64, 640, 1 << 30), "page_size_bytes"),
        ((0, 64, 640, 1 << 30), "page_size_bytes"),
        ((4096, 0, 640, 1 << 30), "block_size"),
        ((4096, 64, 0, 1 << 30), "max_model_len"),
        ((4096, 64, 640, -1), "host_budget_bytes"),
        ((4096, -1, 640, 1 << 30), "block_size"),
        ((4096, 64, 640, 1 << 70), "host_budget_bytes"),
    ],
)
def test_plan_host_layout_errors_name_the_argument(args, name):
    with pytest.raises(ValueError, match=name):
        hisparse.plan_host_layout(*args)


def test_plan_host_layout_seed_errors():
    with pytest.raises(ValueError, match="no allocatable host blocks"):
        hisparse.plan_host_layout(4096, 64, 640, 4095)
    with pytest.raises(ValueError, match=r"11 blocks but max_model_len=640 needs 12.*host_budget_bytes"):
        hisparse.plan_host_layout(4096, 64, 640, 12 * 4096 - 1)
    layout = hisparse.plan_host_layout(4096, 64, 640, 12 * 4096)
    assert layout == hisparse.HostLayout(host_num_blocks=12, host_block_stride=4096, min_host_blocks=12)


@pytest.mark.parametrize("bad", ["4096", 4096.0, None, True])
def test_plan_host_layout_type_errors(bad):
    with pytest.raises(TypeError, match="page_size_bytes"):
        hisparse.plan_host_layout(bad, 64, 640, 1 << 30)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(top_k=0), "top_k"),
        (dict(device_buffer_size=32768, top_k=16), "device_buffer_size"),
        (dict(device_buffer_size=0), "device_buffer_size"),
        (dict(max_union_rows=2047), "max_union_rows"),
        (dict(max_union_rows=4097), "max_union_rows"),
        (dict(top_k=4096, num_speculative_tokens=1), "max_union_rows"),
        (dict(row_bytes=650), "row_bytes"),
        (dict(row_bytes=0), "row_bytes"),
        (dict(row_bytes=None, row_width=325, dtype="bfloat16"), "row_bytes"),
        (dict(row_bytes=None), "row_bytes"),
        (dict(row_bytes=None, row_width=328), "row_width"),
        (dict(row_bytes=600, row_width=328, dtype="bfloat16"), "row_bytes"),
        (dict(block_size=0), "block_size"),
        (dict(hot_block_size=-1), "hot_block_size"),
        (dict(num_speculative_tokens=-1), "num_speculative_tokens"),
        (dict(top_k=1 << 40), "top_k"),
    ],
)
def test_config_errors_name_the_field(kwargs, name):
    kwargs = {"row_bytes": 656, **kwargs}
    with pytest.raises(ValueError, match=name):
        hisparse.Config(**kwargs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(top_k="2048"), "top_k"),
        (dict(device_buffer_size=4096.0), "device_buffer_size"),
        (dict(max_union_rows=2048.0), "max_union_rows"),
        (dict(row_bytes="656"), "row_bytes"),
        (dict(block_size=None), "block_size"),
        (dict(eager_host_mirror=1), "eager_host_mirror"),
        (dict(row_bytes=None, row_width=328, dtype="not-a-dtype"), "dtype"),
    ],
)
def test_config_type_errors_name_the_field(kwargs, name):
    kwargs = {"row_bytes": 656, **kwargs}
    with pytest.raises(TypeError, match=name):
        hisparse.Config(**kwargs)


def test_config_defaults_and_names_come_from_the_library():
    defaults = hisparse._C.default_config()
    config = hisparse.Config(row_bytes=656)
    for name in ("top_k", "device_buffer_size", "block_size", "hot_block_size", "num_speculative_tokens",
                 "eager_host_mirror"):
        assert getattr(config, name) == defaults[name], name
    assert defaults["max_union_rows"] == 0  # the rule's: top_k x (1 + num_speculative_tokens)
    assert config.max_union_rows == hisparse._C.default_max_union_rows(config.top_k, 0) == config.top_k
    assert hisparse.Config(row_bytes=656, device_buffer_size=8192, num_speculative_tokens=3).max_union_rows == 8192
    assert hisparse.STAT_NAMES == hisparse._C.STAT_NAMES == ("lookups", "hits", "misses", "resident", "invalid")
    assert hisparse._C.DTYPES["bfloat16"] == (6, 2) and hisparse._C.DTYPES["float8_e4m3fn"][1] == 1
    assert len(hisparse._C.DTYPES) == 12


def test_config_derives_rows_and_union():
    config = hisparse.Config(top_k=2048, device_buffer_size=8192, row_width=576, dtype="bfloat16",
                             num_speculative_tokens=2)
    assert config.row_bytes == 1152
    assert config.max_union_rows == 3 * 2048
    assert config.resolver_shared_memory_bytes == hisparse._C.resolver_shared_memory_bytes(8192, 6144)
    small = hisparse.Config(top_k=16, device_buffer_size=32, row_bytes=16)
    assert small.resolver_shared_memory_bytes < config.resolver_shared_memory_bytes
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.top_k = 1


def test_config_device_check_without_a_device():
    if hisparse._C.build_info()["cuda_compiled"] and hisparse._C.cuda_device_count() > 0:
        pytest.skip("a CUDA device is present (covered by test_gpu_smoke)")
    with pytest.raises(RuntimeError):
        hisparse.Config(row_bytes=656).check_device(0)
    with pytest.raises(ValueError, match="device"):
        hisparse.Config(row_bytes=656).check_device("zero")
    with pytest.raises(TypeError, match="device"):
        hisparse.Config(row_bytes=656).check_device(0.0)


def test_check_host_memory_errors():
    with pytest.raises(TypeError, match="pool_bytes"):
        hisparse.check_host_memory("1")
    with pytest.raises(ValueError, match="pool_bytes"):
        hisparse.check_host_memory(-1)
    hisparse.check_host_memory(1 << 20)
    available = hisparse.layout.available_host_memory()
    with pytest.raises(ValueError, match=r"needs ~\d+ GiB .* only \d+ GiB of RAM is available.*size_bytes"):
        hisparse.check_host_memory(2 * available + (1 << 30))


def test_native_errors_are_python_exceptions():
    # Status codes map to exception types; nothing crashes the interpreter.
    with pytest.raises(ValueError):
        hisparse._C.plan_host_layout(0, 1, 1, 1)
    with pytest.raises(ValueError, match="device_buffer_size"):
        hisparse._C.resolver_shared_memory_bytes(0, 1)
    with pytest.raises(ValueError, match="page_size_bytes"):
        hisparse._C.plan_host_layout(-1, 1, 1, 1)  # negative into an unsigned argument
    with pytest.raises(TypeError, match="block_size: expected an int, got float"):
        hisparse._C.plan_host_layout(16, 1.0, 1, 1)


# ---------------------------------------------------------------------- README


def _readme_blocks(language: str) -> list[str]:
    text = (REPO / "README.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_readme_has_the_two_fresh_machine_commands():
    commands = [block.strip() for block in _readme_blocks("bash")]
    setup = [c for c in commands if c.endswith("&& hisparse bench")]
    assert len(setup) == 1, commands
    # The CPU build of torch (the CUDA build is gigabytes), and a build without isolation in the persistent build
    # tree that the test command reuses.
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in setup[0]
    assert "pip install --no-build-isolation '.[bench]'" in setup[0]
    assert "bash scripts/run_tests.sh" in commands
    script = (REPO / "scripts/run_tests.sh").read_text()
    assert "--no-build-isolation" in script and "HISPARSE_BUILD_TESTS=ON" in script
    assert (REPO / "scripts/run_tests.sh").is_file()
    ci = (REPO / ".ci/run").read_text()
    assert "bash scripts/run_tests.sh" in ci, ".ci/run must run the README's test command"


@pytest.mark.slow
def test_readme_python_example_runs():
    pytest.importorskip("torch")
    blocks = _readme_blocks("python")
    assert blocks, "README.md has no python example"
    for block in blocks:
        result = run_python(block)
        stdout = check_ok(result)
        assert f"hisparse {hisparse.__version__}" in stdout
        assert "'misses': 2" in stdout


def _code(line: str) -> str:
    return line.split("//", 1)[0].strip()


def test_readme_cpp_example_is_the_tested_program():
    # examples/cpp is built and run by ctest against an installed hisparse;
    # the README's C++ lines must be lines of that program.
    program = {_code(line) for line in (REPO / "examples/cpp/main.cpp").read_text().splitlines()}
    cmake = {line.strip() for line in (REPO / "examples/cpp/CMakeLists.txt").read_text().splitlines()}
    cpp_blocks = _readme_blocks("cpp")
    cmake_blocks = _readme_blocks("cmake")
    assert cpp_blocks and cmake_blocks
    for block in cpp_blocks:
        for line in block.splitlines():
            if _code(line):
                assert _code(line) in program, f"README C++ line not in examples/cpp/main.cpp: {line!r}"
    for block in cmake_blocks:
        for line in block.splitlines():
            if line.strip():
                assert line.strip() in cmake, f"README CMake line not in examples/cpp/CMakeLists.txt: {line!r}"
