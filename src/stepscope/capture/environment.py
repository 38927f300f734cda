"""Facts about the machine and process that a run record carries."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

from stepscope._version import __version__
from stepscope.record.run import DeviceInfo


def usable_cpus() -> int | None:
    """CPUs this process may run on (``sched_getaffinity``: taskset, a cgroup cpuset), else None."""
    try:
        return len(os.sched_getaffinity(0)) or None
    except (AttributeError, OSError):
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def distributed_env() -> dict[str, int]:
    """Rank information from torchrun's environment variables (defaults for a single process)."""

    def read(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    return {"rank": read("RANK", 0), "local_rank": read("LOCAL_RANK", 0), "world_size": read("WORLD_SIZE", 1),
            "node_rank": read("GROUP_RANK", 0), "local_world_size": read("LOCAL_WORLD_SIZE", 1)}


def static_meta() -> dict[str, Any]:
    """Environment fields known before the script runs (no torch import)."""
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except Exception:  # noqa: BLE001
        physical = None
    return {
        "stepscope_version": __version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count_logical": os.cpu_count() or 0,
        "cpu_count_physical": physical,
        "cpu_count_usable": usable_cpus(),
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "argv": tuple(sys.argv),
        **distributed_env(),
    }


def torch_meta() -> dict[str, Any]:
    """Torch version, threads and devices, read at the end of the run (torch is loaded by then)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    devices: list[DeviceInfo] = [DeviceInfo(index=-1, kind="cpu", name=cpu_model())]
    try:
        cuda = torch.cuda
        if cuda.is_initialized():
            for index in range(cuda.device_count()):
                props = cuda.get_device_properties(index)
                devices.append(DeviceInfo(index=index, kind="cuda", name=props.name,
                                          total_memory_bytes=int(props.total_memory),
                                          capability=f"{props.major}.{props.minor}"))
    except Exception:  # noqa: BLE001 - device discovery is best effort
        pass
    return {
        "torch_version": str(torch.__version__),
        "intra_op_threads": int(torch.get_num_threads()),
        "devices": tuple(devices),
    }
