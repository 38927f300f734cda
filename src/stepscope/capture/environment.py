"""Facts about the machine and process that a run record carries."""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from typing import Any

from stepscope._version import __version__
from stepscope.record.run import DeviceInfo
from stepscope.redact import redact_argv


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
    return platform.machine()  # not platform.processor(): on Linux a `uname -p` child giving the machine or nothing


def platform_string() -> str:
    """``platform.platform()`` without the ``uname -p`` child process it starts on Linux to read the
    processor (10-100 ms before the script could start). There the processor adds nothing to the
    string when it equals the machine or is unknown (``platform`` drops both), which is what Linux's
    ``uname -p`` prints; elsewhere ``platform.platform()`` itself."""
    join = getattr(platform, "_platform", None)
    if not sys.platform.startswith("linux") or join is None:
        return platform.platform()
    system = os.uname()
    libc, version = platform.libc_ver()
    return str(join(system.sysname, system.release, system.machine, "with", libc + version))


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
        "platform": platform_string(),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count_logical": os.cpu_count() or 0,
        "cpu_count_physical": physical,
        "cpu_count_usable": usable_cpus(),
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "argv": redact_argv(sys.argv),
        "env": setup_env(),
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


#: Environment variables that change how fast a run is (threads, devices, collectives, torch's
#: own switches): recorded so that ``stepscope diff`` can say what changed between two runs.
SETUP_ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "OPENBLAS_", "NCCL_", "GLOO_", "CUDA_", "CUBLAS_", "CUDNN_",
                      "TORCH_", "PYTORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "NVIDIA_", "HIP_", "ROCR_",
                      "OMPI_", "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE", "MALLOC_", "LD_PRELOAD")
_ENV_VALUE_MAX = 300


def setup_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of :data:`SETUP_ENV_PREFIXES` that are set (secret-looking ones masked)."""
    from stepscope.redact import MASK, enabled, is_secret_name, redact_text

    environ = dict(os.environ if environ is None else environ)
    chosen = {}
    for name in sorted(environ):
        if not name.startswith(SETUP_ENV_PREFIXES):
            continue
        value = environ[name][:_ENV_VALUE_MAX]
        if enabled():
            value = MASK if is_secret_name(name) else redact_text(value)
        chosen[name] = value
    return chosen


def git_commit(path: str | os.PathLike[str]) -> str | None:
    """The commit checked out in the git repository that holds ``path`` (read from the ``.git``
    files: no git binary needed), or None outside a repository or when it cannot be read."""
    from pathlib import Path

    try:
        here = Path(path).resolve()
        for folder in (here, *here.parents) if here.is_dir() else here.parents:
            dot_git = folder / ".git"
            if dot_git.is_file():  # a worktree or submodule: "gitdir: <path>"
                pointer = dot_git.read_text(encoding="utf-8", errors="replace").strip()
                if not pointer.startswith("gitdir:"):
                    return None
                dot_git = (folder / pointer.split(":", 1)[1].strip()).resolve()
            elif not dot_git.is_dir():
                continue
            return _resolve_head(dot_git)
    except (OSError, ValueError):
        return None
    return None


def _resolve_head(git_dir: os.PathLike[str]) -> str | None:
    from pathlib import Path

    git_dir = Path(git_dir)
    head = (git_dir / "HEAD").read_text(encoding="utf-8", errors="replace").strip()
    if not head.startswith("ref:"):
        return head if re.fullmatch(r"[0-9a-f]{40,64}", head) else None
    ref = head.split(":", 1)[1].strip()
    common = git_dir
    commondir = git_dir / "commondir"  # worktrees keep branches in the main repository
    if commondir.is_file():
        common = (git_dir / commondir.read_text(encoding="utf-8").strip()).resolve()
    for base in (git_dir, common):
        loose = base / ref
        if loose.is_file():
            value = loose.read_text(encoding="utf-8", errors="replace").strip()
            return value if re.fullmatch(r"[0-9a-f]{40,64}", value) else None
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(encoding="utf-8", errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == ref and re.fullmatch(r"[0-9a-f]{40,64}", parts[0]):
                return parts[0]
    return None
