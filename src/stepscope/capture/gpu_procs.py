"""The processes that hold GPU memory, judged: which look stale, which may be ended, and ending them.

The facts of each pid NVML reports (:class:`GpuProcessView`) are read from /proc through psutil;
:func:`stale_reason` judges them; :func:`unconfirmed` says why NVML's word is not enough to end
one; :func:`end_processes` ends the ones chosen, re-checking each pid first. ``stepscope gpu-procs``
(:mod:`stepscope.cli.gpu_procs_cmd`) shows them through :mod:`stepscope.pipeline.commands`.

A process looks stale when it is a zombie, or when the job it belonged to is gone — its parent is
gone (it was handed to init) or its process group's leader is gone while its parent was itself
orphaned, as with a DataLoader worker whose rank outlived torchrun's agent — and it is idle. An
orphan that is still busy is left alone: it is more likely a job started with nohup than a
leftover. A child of pid 1 whose job leader is alive is not an orphan (init also starts services,
and is a container's entry point).

NVML's pid list alone never justifies a signal: ending a process also requires /proc to show it
holding a ``/dev/nvidia*`` file, and NVML's (host) pid to be confirmed as this process (stepscope in
the host's pid namespace, reading the host's /proc); otherwise the process is left alone, with the
reason.
"""

from __future__ import annotations

import os
import pwd
import time
from dataclasses import dataclass

import psutil

from stepscope.capture import gpu as gpu_layer

#: Processes that adopt orphans: a child of one of these whose job is gone was left behind.
INIT_NAMES = frozenset({"systemd", "init", "tini", "docker-init", "dumb-init", "launchd"})
#: An orphan using more CPU than this (share of one core, over ~0.2 s) is busy, not stale.
BUSY_CPU = 0.05
TERMINATE_GRACE_S = 5.0


@dataclass(frozen=True)
class GpuProcessView:
    """A process holding GPU memory, with what is needed to judge and end it."""

    pid: int
    ppid: int | None
    uid: int | None
    user: str
    command: str
    gpus: tuple[int, ...]
    gpu_memory_bytes: int | None
    age_s: float | None
    state: str
    stale: str | None  # why it looks stale, None when it does not
    create_time: float | None  # to re-check the pid right before signalling it
    visible: bool = True  # False: NVML reports a pid this namespace cannot see (containers)
    holds_gpu_device: bool | None = None  # a /dev/nvidia* file open or mapped (None: /proc cannot tell)
    pid_problem: str | None = None  # why NVML's (host) pid cannot be matched to this process, if it cannot



def stale_reason(*, state: str, parent_alive: bool, parent_name: str, parent_state: str,
                 group_leader_alive: bool, cpu_util: float, parent_orphaned: bool = True) -> str | None:
    """Why a process looks stale, or None. Pure: the facts are gathered by :func:`inspect_processes`.

    "Job leader gone" needs the parent itself to be orphaned (its own parent is init): a DataLoader
    worker whose rank lives on after torchrun's agent died. A child of a live, parented process
    (a test runner's child whose shell's job leader exited) is not a leftover.
    """
    if state == psutil.STATUS_ZOMBIE:
        return "zombie: exited, not reaped"
    if parent_alive and parent_state == psutil.STATUS_ZOMBIE:
        orphan = "parent exited"
    elif (not parent_alive or parent_name in INIT_NAMES) and not group_leader_alive:
        # a child of init whose job leader lives is a service or a container's workload, not a leftover:
        # pid 1 adopts orphans but also starts processes, so its being the parent proves nothing alone
        orphan = "parent gone"
    elif not group_leader_alive and parent_orphaned:
        orphan = "job leader gone"
    else:
        return None
    if cpu_util > BUSY_CPU:
        return None  # busy: more likely a nohup job than a leftover
    return f"{orphan}; idle"


def inspect_processes(found: list[gpu_layer.GpuProcess], probe_s: float = 0.2) -> list[GpuProcessView]:
    """Gather the facts about each pid NVML reports (one row per pid, GPUs merged)."""
    by_pid: dict[int, list[gpu_layer.GpuProcess]] = {}
    for item in found:
        by_pid.setdefault(item.pid, []).append(item)
    cpu_before = {pid: _cpu_seconds(pid) for pid in by_pid}
    if by_pid:
        time.sleep(probe_s)
    views = []
    for pid, items in sorted(by_pid.items()):
        memory = [item.used_memory_bytes for item in items if item.used_memory_bytes >= 0]
        gpus = tuple(sorted({item.gpu for item in items}))
        views.append(_view(pid, gpus, sum(memory) if memory else None, cpu_before[pid], probe_s))
    return views + _zombie_children(views)


def _view(pid: int, gpus: tuple[int, ...], memory: int | None, cpu_before: float | None,
          probe_s: float) -> GpuProcessView:
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            ppid, uid, state = process.ppid(), process.uids().real, process.status()
            name, created = process.name(), process.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return GpuProcessView(pid, None, None, "?", "(not visible here: another pid namespace, or ended)", gpus,
                              memory, None, "?", None, None, visible=False)
    try:
        command = " ".join(process.cmdline()) or f"[{name}]"
    except psutil.Error:  # a zombie has no command line any more
        command = f"[{name}]"
    parent_alive, parent_name, parent_state = _parent(ppid)
    parent_orphaned = _parent_orphaned(ppid)
    cpu_after = _cpu_seconds(pid)
    cpu_util = (cpu_after - cpu_before) / probe_s if cpu_after is not None and cpu_before is not None else 0.0
    reason = stale_reason(state=state, parent_alive=parent_alive, parent_name=parent_name, parent_state=parent_state,
                          group_leader_alive=_group_leader_alive(pid), cpu_util=cpu_util,
                          parent_orphaned=parent_orphaned)
    return GpuProcessView(pid, ppid, uid, user_name(uid), command, gpus, memory, time.time() - created, state,
                          reason, created, holds_gpu_device=gpu_layer.holds_gpu_device(pid),
                          pid_problem=gpu_layer.nvml_pid_problem(pid))


def _zombie_children(views: list[GpuProcessView]) -> list[GpuProcessView]:
    """Live children of zombie GPU processes (e.g. DataLoader workers) keep the GPU's files open."""
    out = []
    listed = {view.pid for view in views}
    for view in views:
        if view.state != psutil.STATUS_ZOMBIE:
            continue
        try:
            children = psutil.Process(view.pid).children()
        except psutil.Error:
            continue
        for child in children:
            if child.pid in listed:
                continue
            try:
                with child.oneshot():
                    out.append(GpuProcessView(
                        child.pid, view.pid, child.uids().real, user_name(child.uids().real),
                        " ".join(child.cmdline()) or f"[{child.name()}]", (), None, time.time() - child.create_time(),
                        child.status(), f"child of zombie {view.pid}: may hold its GPU memory",
                        child.create_time()))
            except psutil.Error:
                continue
    return out


def _parent(ppid: int) -> tuple[bool, str, str]:
    if ppid <= 0:
        return True, "", ""  # the first process of its namespace (a container's entry point)
    try:
        parent = psutil.Process(ppid)
        # pid 1 is the namespace's init whatever its name (a container's entry point, a VM agent)
        return True, "init" if ppid == 1 else parent.name(), parent.status()
    except psutil.Error:
        return False, "", ""


def _parent_orphaned(ppid: int) -> bool:
    """Whether the parent was itself re-parented to init (its launcher is gone).

    A child of init counts only when its own job leader is gone too: init (a container's entry point,
    systemd) also starts processes on purpose.
    """
    if ppid <= 1:
        return False
    try:
        grandparent = psutil.Process(ppid).ppid()
        adopted = grandparent <= 1 or psutil.Process(grandparent).name() in INIT_NAMES
    except psutil.Error:
        return False
    return adopted and not _group_leader_alive(ppid)


def _group_leader_alive(pid: int) -> bool:
    try:
        leader = os.getpgid(pid)
    except OSError:
        return True
    return leader == pid or psutil.pid_exists(leader)


def _cpu_seconds(pid: int) -> float | None:
    try:
        times = psutil.Process(pid).cpu_times()
        return times.user + times.system
    except psutil.Error:
        return None


def unconfirmed(view: GpuProcessView) -> str | None:
    """Why NVML's word that ``view`` is a GPU process is not enough to end it, or None.

    NVML's pid list is not proof: it reports host pids (another process, or none, inside a
    container) and may lag behind pid reuse. A process is ended only when /proc shows it holding a
    GPU device file and its pid is confirmed to be the one NVML means.
    """
    if view.pid_problem:
        return view.pid_problem
    if view.holds_gpu_device is None:
        return "cannot confirm from /proc that it holds a GPU device (/dev/nvidia*); not ended"
    if not view.holds_gpu_device:
        return "holds no GPU device file (/dev/nvidia*) although NVML lists it; not ended"
    return None


def end_processes(views: list[GpuProcessView], grace_s: float = TERMINATE_GRACE_S) -> list[tuple[int, str]]:
    """SIGTERM each pid (after checking it is still the same process), SIGKILL what remains; each
    pid's outcome: ``reused`` (now another process), ``released`` (no GPU device file any more),
    ``gone`` (already), ``denied`` (not permitted), ``ended`` (by SIGTERM), ``killed`` (by SIGKILL),
    ``stuck`` (still there after SIGKILL)."""
    lines: list[tuple[int, str]] = []
    signalled = []
    for view in views:
        try:
            process = psutil.Process(view.pid)
            if view.create_time is not None and abs(process.create_time() - view.create_time) > 0.01:
                lines.append((view.pid, "reused"))
                continue
            if gpu_layer.holds_gpu_device(view.pid) is not True:
                lines.append((view.pid, "released"))
                continue
            process.terminate()
            if process.status() == psutil.STATUS_STOPPED:
                process.resume()  # a stopped process only sees SIGTERM once continued
            signalled.append(process)
        except psutil.NoSuchProcess:
            lines.append((view.pid, "gone"))
        except psutil.AccessDenied:
            lines.append((view.pid, "denied"))
    gone, alive = psutil.wait_procs(signalled, timeout=grace_s)
    lines += [(process.pid, "ended") for process in gone]
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    gone, alive = psutil.wait_procs(alive, timeout=2.0)
    lines += [(process.pid, "killed") for process in gone]
    lines += [(process.pid, "stuck") for process in alive]
    return lines


def user_name(uid: int) -> str:
    """The login name of ``uid`` (the number when it has none, ``?`` when unknown)."""
    if uid < 0:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)
