"""The sampler on real processes: a CPU burner, a reader of an evicted file, a DataLoader with two
workers, processes that end mid-run, and the sidecar's life cycle (stop, hang, kill, failure)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import orjson
import pytest
from fakes.fake_nvml import FakeGpu, FakeNvml

from stepscope.analysis.run.signals import (compute_signals, core_busy_shares, core_extremes, process_cpu_utils,
                                            process_running_threads)
from stepscope.capture.gpu import open_gpus
from stepscope.capture.sampler import SystemSampler, run_sampler, start_sidecar
from stepscope.capture.system import UNNAMED_SAMPLES, ProcessTree
from stepscope.errors import CaptureWarning, UsageError
from stepscope.record import layout
from stepscope.record.samples import SamplesWriter, load_samples

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="real-process tests read Linux /proc")


def spawn(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args])


def sample_in_process(path: Path, pid: int, seconds: float | None = None, *, interval: float = 0.05, **kwargs):
    """Run the sampler loop here (no sidecar start-up) until ``seconds`` pass or the target ends."""
    sampler = SystemSampler(pid, kwargs.pop("roles_path", None), gpu=kwargs.pop("gpu", None), interval_s=interval,
                            **kwargs)
    writer = SamplesWriter(path, sampler.header(interval_s=interval))
    deadline = time.monotonic() + (seconds if seconds is not None else 60)
    run_sampler(sampler, writer, interval, lambda: time.monotonic() > deadline)
    writer.close()
    sampler.close()
    return load_samples(path)


def wait_for_samples(path: Path, count: int, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size and len(load_samples(path)) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"fewer than {count} samples in {path} after {timeout_s} s")


def test_a_run_shorter_than_the_scan_period_still_names_a_busy_neighbour(tmp_path, children):
    """Processes outside the tree are scanned every 2 s; the last sample of a stop on request scans
    once more, so a 1-second run names the neighbour that crowded it (a demo beside two busy
    processes ended in 1.9 s on a loaded machine and named nobody)."""
    target = spawn("import time; time.sleep(30)")
    burner = spawn("while True: pass")
    children.extend([target, burner])
    samples = sample_in_process(tmp_path / "samples.jsonl.gz", target.pid, seconds=1.0)
    assert len(samples.foreign) == 1, samples.foreign  # the last sample's scan, ~1 s after the baseline
    ((_, interval_s, procs),) = samples.foreign
    assert 0.5 <= interval_s < 2.0 and burner.pid in [pid for pid, _, _ in procs], samples.foreign


def test_cpu_burner_shows_a_saturated_core(tmp_path, children):
    import psutil

    burner = spawn("while True: pass")
    children.append(burner)
    time.sleep(0.2)
    watched = psutil.Process(burner.pid)
    cpu_before, wall_before = sum(watched.cpu_times()[:2]), time.monotonic()
    samples = sample_in_process(tmp_path / "s.jsonl.gz", burner.pid, 1.5)
    # what the burner really got, measured beside the sampler: on a loaded machine it may get far less
    # than a core, so the sampler is judged against this, not against a fixed share
    real = (sum(watched.cpu_times()[:2]) - cpu_before) / (time.monotonic() - wall_before)
    (main,) = samples.processes_with_role("main")
    assert main.pid == burner.pid
    sampled = process_cpu_utils(samples, np.ones(len(samples) - 1, dtype=bool))[main.id]
    assert real > 0.05 and sampled == pytest.approx(real, abs=0.2), (sampled, real)
    busiest, _idlest, saturated = core_extremes(core_busy_shares(samples))
    assert busiest >= min(real, 0.85) - 0.2  # the core the burner ran on is at least as busy as the burner
    if real > 0.95:
        assert saturated >= 1
    assert set(samples.proc["state"][samples.proc["id"] == main.id]) <= {"R", "S"}


def test_reading_an_evicted_file_shows_disk_reads(tmp_path, children):
    size = 48 << 20
    data_file = tmp_path / "data.bin"
    with open(data_file, "wb") as handle:
        handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())
    fd = os.open(data_file, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache: reads hit the disk
    os.close(fd)
    reader = spawn("""
        import sys, time
        time.sleep(0.3)
        with open(sys.argv[1], "rb", buffering=0) as handle:
            while handle.read(1 << 20):
                time.sleep(0.01)
        time.sleep(0.8)  # I/O counters are read at 2 Hz
    """, str(data_file))
    children.append(reader)
    samples = sample_in_process(tmp_path / "s.jsonl.gz", reader.pid)  # ends with the reader
    disk_read = int(np.sum(samples["disk_read_bytes"][-1] - samples["disk_read_bytes"][0]))
    (main,) = samples.processes_with_role("main")
    process_read = int(samples.proc["read_bytes"][samples.proc["id"] == main.id].max())
    if disk_read == 0 and process_read == 0:
        pytest.skip(f"the block devices here ({samples.meta.disks}) report no reads for an evicted file")
    assert process_read >= 0.9 * size
    assert disk_read >= 0.9 * size
    assert compute_signals(samples).disk_read_bytes_per_s > 0
    assert main.end_ns > 0  # the reader ended during sampling, and the sampler stopped with it


DATALOADER_SCRIPT = """
import json, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Burn(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        end = time.perf_counter() + 0.01
        while time.perf_counter() < end:
            pass
        return torch.tensor([index])

if __name__ == "__main__":
    iterator = iter(DataLoader(Burn(), batch_size=4, num_workers=2))
    with open(sys.argv[1], "a") as roles:  # what stepscope's capture writes when workers start
        for worker in iterator._workers:
            roles.write(json.dumps({"pid": worker.pid, "role": "dataloader_worker", "loader_id": 0,
                                    "ts_ns": time.perf_counter_ns()}) + "\\n")
    deadline = time.monotonic() + 2.5
    for batch in iterator:
        if time.monotonic() > deadline:
            break
"""


@pytest.mark.slow  # real torch DataLoader workers, ~15 s
def test_dataloader_workers_show_up_with_their_cpu(tmp_path, children):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(DATALOADER_SCRIPT)
    roles = layout.roles_path(tmp_path, 0)
    training = subprocess.Popen([sys.executable, str(script), str(roles)])
    children.append(training)
    sidecar = start_sidecar(tmp_path, training.pid, rank=0, interval_s=0.1)
    assert training.wait(timeout=90) == 0
    assert sidecar.process.wait(timeout=5) == 0  # it ends by itself with the training process
    sidecar.stop()
    assert sidecar.warnings == []
    samples = load_samples(layout.samples_path(tmp_path, 0))
    workers = samples.processes_with_role("dataloader_worker")
    assert len(workers) == 2 and all(worker.loader_id == 0 for worker in workers)
    assert all(worker.end_ns > 0 for worker in workers)  # they ended with the script
    utils = process_cpu_utils(samples, np.ones(len(samples) - 1, dtype=bool))
    assert all(utils[worker.id] > 0.03 for worker in workers), utils  # busy (idle is ~0), however loaded the machine
    signals = compute_signals(samples)
    assert signals.worker_count == 2 and signals.worker_cpu_util_mean > 0.03
    assert {load.role for load in signals.workers} >= {"main", "dataloader_worker"}


def test_a_child_ending_mid_run_gets_an_end_time_and_sampling_goes_on(tmp_path, children):
    # The child lives until the sampler has seen it (a fixed lifetime is missed when a loaded
    # machine starves the sampler for longer), then the parent goes on for a second.
    release = tmp_path / "release"
    parent = spawn("""
        import subprocess, sys, time
        time.sleep(0.3)
        subprocess.run([sys.executable, "-c", "import os, sys, time\\n"
                        "while not os.path.exists(sys.argv[1]): time.sleep(0.02)", sys.argv[1]])
        time.sleep(1.0)
    """, str(release))
    children.append(parent)
    sampler = SystemSampler(parent.pid, None, gpu=None, interval_s=0.05)
    writer = SamplesWriter(tmp_path / "s.jsonl.gz", sampler.header(interval_s=0.05))
    deadline = time.monotonic() + 60

    def release_once_seen() -> bool:
        if any(pid != parent.pid for pid in sampler.tree.tracked):
            release.touch()
        return time.monotonic() > deadline

    run_sampler(sampler, writer, 0.05, release_once_seen)
    writer.close()
    sampler.close()
    samples = load_samples(tmp_path / "s.jsonl.gz")
    others = [info for info in samples.processes if info.pid != parent.pid]
    assert len(others) == 1 and others[0].role == "other" and str(release) in others[0].cmdline
    child = others[0]
    assert 0 < child.start_ns < child.end_ns
    assert samples.ts_ns[-1] - child.end_ns > 0.5e9  # samples kept coming after the child ended
    child_rows = samples.proc["sample"][samples.proc["id"] == child.id]
    assert len(child_rows) >= 1 and samples.ts_ns[child_rows.max()] < child.end_ns


def test_sidecar_stops_on_request_after_a_last_sample(tmp_path, children):
    target = subprocess.Popen(["sleep", "30"])
    children.append(target)
    sidecar = start_sidecar(tmp_path, target.pid, rank=3, interval_s=0.1)
    path = layout.samples_path(tmp_path, 3)
    wait_for_samples(path, 5)
    assert os.getsid(sidecar.pid) == sidecar.pid  # own session: a Ctrl-C in the terminal is not for it
    stop_requested = time.monotonic_ns()
    sidecar.stop()
    assert sidecar.process.returncode == 0 and sidecar.warnings == []
    samples = load_samples(path)
    assert not samples.truncated and samples.meta.rank == 3 and samples.meta.target_pid == target.pid
    assert samples.ts_ns[-1] >= stop_requested - 200_000_000
    intervals = np.diff(samples.ts_ns) / 1e9
    assert 0.09 <= np.median(intervals) <= 0.3  # 0.1 s asked; a loaded machine delays wake-ups, never advances them


def test_sidecar_keeps_recording_while_the_training_process_hangs(tmp_path, children):
    target = subprocess.Popen(["sleep", "30"])
    children.append(target)
    os.kill(target.pid, signal.SIGSTOP)
    sidecar = start_sidecar(tmp_path, target.pid, rank=0, interval_s=0.05)
    path = layout.samples_path(tmp_path, 0)
    wait_for_samples(path, 20)
    sidecar.stop()
    samples = load_samples(path)
    assert set(samples.proc["state"]) == {"T"}  # stopped the whole time, sampled the whole time


def test_sidecar_killed_leaves_a_readable_file_and_a_warning(tmp_path, children):
    target = subprocess.Popen(["sleep", "30"])
    children.append(target)
    sidecar = start_sidecar(tmp_path, target.pid, rank=0, interval_s=0.1)
    path = layout.samples_path(tmp_path, 0)
    wait_for_samples(path, 1)
    os.kill(sidecar.pid, signal.SIGKILL)
    sidecar.process.wait(timeout=5)
    with pytest.warns(CaptureWarning, match="code -9"):
        sidecar.stop()
    assert len(load_samples(path)) >= 1


def test_sidecar_failure_becomes_a_warning_never_an_exception(tmp_path, children):
    target = subprocess.Popen(["sleep", "30"])
    children.append(target)
    layout.samples_path(tmp_path, 0).mkdir()  # the sidecar cannot write its file
    sidecar = start_sidecar(tmp_path, target.pid, rank=0)
    sidecar.process.wait(timeout=20)
    with pytest.warns(CaptureWarning, match="could not write the samples"):
        sidecar.stop()
    assert len(sidecar.warnings) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sidecar.stop()  # a second stop is a no-op


def test_sidecar_that_cannot_start_is_inert(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("no more processes")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    with pytest.warns(CaptureWarning, match="could not start"):
        sidecar = start_sidecar(tmp_path, os.getpid(), rank=0)
    sidecar.stop()
    assert sidecar.pid is None and not sidecar.alive()


def test_sidecar_for_a_missing_run_directory_is_inert(tmp_path):
    with pytest.warns(CaptureWarning, match="could not start"):
        sidecar = start_sidecar(tmp_path / "missing", os.getpid(), rank=0)
    assert sidecar.warnings and sidecar.pid is None


def test_sidecar_ignores_modules_in_the_callers_directory(tmp_path, children, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "psutil.py").write_text("raise ImportError('the user project shadows psutil')\n")
    monkeypatch.chdir(project)
    target = subprocess.Popen(["sleep", "30"])
    children.append(target)
    sidecar = start_sidecar(tmp_path, target.pid, rank=0)
    wait_for_samples(layout.samples_path(tmp_path, 0), 2)
    sidecar.stop()
    assert sidecar.warnings == []


@pytest.mark.parametrize("interval", [0, -0.1, float("nan")])
def test_start_sidecar_rejects_a_bad_interval(tmp_path, interval):
    with pytest.raises(UsageError, match="positive"):
        start_sidecar(tmp_path, os.getpid(), rank=0, interval_s=interval)


def test_gpu_values_and_nvml_errors_flow_into_the_samples_file(tmp_path, children):
    target = subprocess.Popen(["sleep", "30"])
    children.append(target)
    nvml = FakeNvml([FakeGpu(compute=[(target.pid, 2 << 30)],
                             errors={"nvmlDeviceGetPowerUsage": 3})])  # NVML_ERROR_NOT_SUPPORTED
    nvml.utilization_script = [[0], [100], [0], [100]]
    probe, _ = open_gpus(nvml, all_gpus=True, slow_every=1)
    sampler = SystemSampler(target.pid, gpu=probe)
    path = tmp_path / "s.jsonl.gz"
    writer = SamplesWriter(path, sampler.header(interval_s=0.01))
    run_sampler(sampler, writer, 0.01, lambda: False, max_samples=8)
    writer.close()
    samples = load_samples(path)
    assert samples.meta.gpus[0].name == "NVIDIA H200"
    assert samples["gpu_util"][:, 0].tolist() == [0, 100, 0, 100] * 2
    assert set(samples["gpu_power_mw"][:, 0]) == {-1} and set(samples["gpu_temp_c"][:, 0]) == {45}
    assert sum("power" in note for note in samples.notes) == 1
    assert set(samples.gpu_procs["pid"]) == {target.pid}
    signals = compute_signals(samples)
    assert signals.gpu_count == 1 and signals.gpu_util_mean == pytest.approx(0.5, abs=0.1)
    assert signals.gpu_util_oscillation == pytest.approx(1.0)


def test_psutil_fallback_gives_the_same_columns(tmp_path, children):
    target = spawn("import time; time.sleep(30)")
    children.append(target)
    fast = sample_in_process(tmp_path / "a.jsonl.gz", target.pid, 0.3, interval=0.1)
    portable = sample_in_process(tmp_path / "b.jsonl.gz", target.pid, 0.3, interval=0.1, use_procfs=False)
    assert portable.meta.cpu_count == fast.meta.cpu_count
    assert portable.meta.mem_total_bytes == pytest.approx(fast.meta.mem_total_bytes, rel=0.01)
    assert (np.diff(portable["cpu_idle"], axis=0) >= 0).all()
    assert portable["mem_used_bytes"].min() > 0
    (main,) = portable.processes_with_role("main")
    # psutil's start times on Linux rest on a boot time rounded to the second
    assert main.pid == target.pid and abs(main.start_ns - fast.processes[0].start_ns) < 1.1e9
    assert portable.proc["rss_bytes"].min() > 0


def test_roles_file_lines_are_read_when_complete(tmp_path, children):
    target = spawn("""
        import subprocess, time
        child = subprocess.Popen(["sleep", "30"])
        print(child.pid, flush=True)
        time.sleep(30)
    """)
    children.append(target)
    time.sleep(0.5)
    roles = tmp_path / "roles.jsonl"
    tree = ProcessTree(target.pid, roles)
    _, events = tree.sample(time.monotonic_ns())
    child = next(event for event in events if event["type"] == "process" and event["pid"] != target.pid)
    assert child["role"] == "other"
    line = orjson.dumps({"pid": child["pid"], "role": "dataloader_worker", "loader_id": 1, "ts_ns": 0})
    roles.write_bytes(line[:10])  # half a line: not read yet
    assert tree.sample(time.monotonic_ns())[1] == []
    roles.write_bytes(line + b"\n")
    (event,) = tree.sample(time.monotonic_ns())[1]
    assert event == {"type": "role", "id": child["id"], "role": "dataloader_worker", "loader_id": 1,
                     "ts_ns": event["ts_ns"]}
    os.kill(child["pid"], signal.SIGKILL)


@pytest.mark.parametrize("shows_one_after", [2, None])
def test_a_child_seen_without_a_command_line_is_recorded_once_it_shows_one(children, monkeypatch, shows_one_after):
    """Between an exec's new memory and its arguments the kernel shows no command line (a clean
    clone's run once recorded a child so): the tree looks again at the next samples, counts the
    child as the run's meanwhile, and records it without one only after UNNAMED_SAMPLES."""
    target = spawn("""
        import subprocess, time
        child = subprocess.Popen(["sleep", "30"])
        time.sleep(30)
    """)
    children.append(target)
    tree = ProcessTree(target.pid, with_io=False)
    deadline = time.monotonic() + 30
    while len(tree._descendants_by_scan()) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    (child_pid,) = tree._descendants_by_scan()
    while not tree._cmdline(child_pid) and time.monotonic() < deadline:  # sleep's exec done
        time.sleep(0.02)
    real, blank = tree._cmdline, [shows_one_after if shows_one_after is not None else 1_000]

    def cmdline(pid: int) -> list[str]:
        if pid == child_pid and blank[0] > 0:
            blank[0] -= 1
            return []
        return real(pid)

    monkeypatch.setattr(tree, "_cmdline", cmdline)
    recorded = []
    for _ in range(UNNAMED_SAMPLES + 2):
        _, events = tree.sample(time.monotonic_ns())
        recorded.append([event for event in events if event["type"] == "process" and event["pid"] == child_pid])
        assert child_pid in tree.known_pids()  # the run's own from its first sight
    os.kill(child_pid, signal.SIGKILL)
    if shows_one_after is not None:
        assert [len(found) for found in recorded] == [0, 0, 1] + [0] * (UNNAMED_SAMPLES - 1)
        assert recorded[2][0]["cmdline"] == ["sleep", "30"] and recorded[2][0]["id"] == 1
    else:
        assert [len(found) for found in recorded] == [0] * UNNAMED_SAMPLES + [1, 0]
        assert recorded[UNNAMED_SAMPLES][0]["cmdline"] == []


def test_sidecar_that_runs_out_of_space_keeps_what_it_wrote_and_says_so_once(tmp_path, children):
    target = subprocess.Popen(["sleep", "30"])
    children.append(target)
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_FSIZE, (1500, resource.RLIM_INFINITY))  # a disk that fills up
        from stepscope.capture.sampler import main
        sys.exit(main(["--run-dir", {str(tmp_path)!r}, "--pid", "{target.pid}", "--interval", "0.02",
                       "--flush-every", "0.02"]))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src")})
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("could not write the samples")
    assert len(load_samples(layout.samples_path(tmp_path, 0))) >= 1  # what fitted is kept


def test_anonymous_memory_grows_with_the_heap_not_with_mapped_files(tmp_path, children):
    # the target maps and touches a 64 MiB file (file-backed RSS), then allocates 64 MiB of heap
    data = tmp_path / "blob"
    data.write_bytes(b"\1" * (64 << 20))
    target = spawn("""
        import mmap, sys, time
        with open(sys.argv[1], "rb") as handle:
            view = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            sum(view[i] for i in range(0, len(view), 4096))  # touch every page: RSS +64 MiB, file-backed
            time.sleep(0.6)
            heap = bytearray(64 << 20)  # zeroed: heap +64 MiB, anonymous
            time.sleep(30)
    """, str(data))
    children.append(target)
    samples = sample_in_process(tmp_path / "s.jsonl.gz", target.pid, 2.5, interval=0.05)
    (main,) = samples.processes_with_role("main")
    rows = samples.proc["id"] == main.id
    rss, anon = samples.proc["rss_bytes"][rows], samples.proc["rss_anon_bytes"][rows]
    assert (anon >= 0).all() and (anon <= rss).all()
    assert rss.max() - rss.min() > 100 << 20  # both the file and the heap
    assert 48 << 20 < anon.max() - anon.min() < 80 << 20  # only the heap


def test_threads_that_run_are_told_from_threads_that_only_exist(tmp_path, children):
    # a process computing on its main thread beside two sleeping threads ran on one thread; the same
    # with a second thread hashing (hashlib lets the GIL go while it hashes) ran on about two,
    # however the machine's cores are shared (both threads wait for a core alike)
    burner = """
        import hashlib, threading, time, sys
        for _ in range(2):
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        if sys.argv[1] == "hash":
            block = bytes(64 << 20)  # ~30 ms a hash without the GIL, then up to 5 ms to get it back
            threading.Thread(target=lambda: [hashlib.sha256(block).digest() for _ in iter(int, 1)], daemon=True).start()
        while True:
            pass
    """
    running = {}
    for mode in ("alone", "hash"):
        target = spawn(burner, mode)
        children.append(target)
        time.sleep(0.3)
        samples = sample_in_process(tmp_path / f"{mode}.jsonl.gz", target.pid, 1.2, interval=0.05)
        target.kill()
        (main,) = samples.processes_with_role("main")
        assert (samples.proc["leader_ticks"] >= 0).all()
        # read first, the main thread's count stays within the process's (a tick: the kernel scales each)
        assert (samples.proc["leader_ticks"] <= samples.proc["cpu_ticks"] + 1).all()
        running[mode] = process_running_threads(samples, np.ones(len(samples) - 1, dtype=bool))[main.id]
        assert compute_signals(samples).workers[0].running_threads == pytest.approx(running[mode])
    assert 1.0 <= running["alone"] < 1.2, running
    assert 1.6 < running["hash"] <= 2.4, running
