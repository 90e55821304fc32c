"""The hisparse command line (also ``python -m hisparse``).

``hisparse info``: version, backends, devices; ``hisparse bench``: the
trace-driven benchmark; ``hisparse plan``: the capacity planner.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Optional, Sequence

from . import _C

__all__ = ["main", "collect_info"]


def _registration_probe() -> dict:
    """Register one small pool with the GPU to see whether pinning works here."""
    from .host_pool import HostPool  # noqa: PLC0415

    try:
        pool = HostPool(1 << 20, register="always", check_memory=False)
    except Exception as error:  # noqa: BLE001 - the reason is the answer
        return {"works": False, "reason": str(error)}
    info = pool.info()
    pool.release()
    return {"works": True, "register_seconds": info["register_seconds"]}


def collect_info() -> dict:
    """Everything ``hisparse info`` reports, as a dict."""
    from ._tensors import torch_or_none  # noqa: PLC0415

    build = _C.build_info()
    devices = []
    count = _C.cuda_device_count() if build["cuda_compiled"] else 0
    for index in range(count):
        props = _C.cuda_device_properties(index)
        props["index"] = index
        devices.append(props)
    torch = torch_or_none()
    return {
        "version": _C.version(),
        "backends": ["cpu", "cuda"] if build["cuda_compiled"] else ["cpu"],
        "build": build,
        "cuda_devices": devices,
        "cuda_unavailable_reason": _C.cuda_unavailable_reason() if build["cuda_compiled"] else "not compiled in",
        "host_registration": _registration_probe(),
        "available_host_memory_bytes": _C.available_host_memory(),
        "python": platform.python_version(),
        "torch": getattr(torch, "__version__", None),
        "platform": platform.platform(),
    }


def _print_info(info: dict) -> None:
    build = info["build"]
    print(f"hisparse {info['version']}")
    cuda = (
        f"cuda (runtime {build['cuda_runtime_version']}, sm {build['cuda_architectures']})"
        if build["cuda_compiled"]
        else "cuda: not compiled in"
    )
    print(f"  backends        : cpu, {cuda}")
    print(f"  build           : {build['build_type']}, {build['compiler']}")
    if info["cuda_devices"]:
        for device in info["cuda_devices"]:
            major, minor = device["compute_capability"]
            print(
                f"  cuda:{device['index']:<13}: {device['name']} (sm_{major}{minor}, "
                f"{device['multiprocessor_count']} SMs, {device['total_global_memory'] / 2**30:.0f} GiB, "
                f"{device['max_shared_memory_per_block'] // 1024} KiB shared/block)"
            )
    else:
        print(f"  cuda devices    : none ({info['cuda_unavailable_reason']})")
    probe = info["host_registration"]
    if probe["works"]:
        print(f"  host register   : works ({probe['register_seconds'] * 1e3:.2f} ms for 1 MiB)")
    else:
        print(f"  host register   : unavailable ({probe['reason']})")
    print(f"  host memory     : {info['available_host_memory_bytes'] / 2**30:.1f} GiB available")
    print(f"  python / torch  : {info['python']} / {info['torch'] or 'not installed'}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="hisparse", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    info_parser = commands.add_parser("info", help="version, backends, devices, host registration, build flags")
    info_parser.add_argument("--json", action="store_true", help="print the report as JSON")
    from .bench.commands import add_bench_parser, add_plan_parser  # noqa: PLC0415 (no torch needed to parse)

    add_bench_parser(commands)
    add_plan_parser(commands)
    args = parser.parse_args(argv)

    if args.command in ("bench", "plan"):
        from .bench.commands import run_bench_command, run_plan_command  # noqa: PLC0415

        run = run_bench_command if args.command == "bench" else run_plan_command
        try:
            return run(args)
        except (ValueError, TypeError) as error:
            parser.exit(2, f"hisparse {args.command}: error: {error}\n")

    if args.command == "info":
        info = collect_info()
        if args.json:
            json.dump(info, sys.stdout, indent=2)
            print()
        else:
            _print_info(info)
        return 0
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
