"""``stepscope monitor``'s input: the sampler's probes over one machine (or one process tree), each
sample turned into a frame by the same arithmetic as a run's signals
(:func:`~stepscope.analysis.run.live.live_frame`); :func:`~stepscope.pipeline.commands.monitor_view`
makes the frame the view the renderers format."""

from __future__ import annotations

from typing import Any

from stepscope.analysis.run.live import MonitorFrame, live_frame
from stepscope.capture.sampler import SystemSampler
from stepscope.record.samples import SamplesBuilder

_GPU_SLOW = ("gpu_sm_clock_mhz", "gpu_power_mw", "gpu_temp_c", "gpu_pcie_tx_bytes_per_s", "gpu_pcie_rx_bytes_per_s")


class LiveMonitor:
    """Samples the machine (or one process tree) and turns the last two samples into a frame."""

    def __init__(self, pid: int | None, interval_s: float, *, top: int | None = 15, gpu: Any = "auto"):
        if gpu == "auto":
            from stepscope.capture.gpu import open_gpus

            gpu, note = open_gpus(slow_every=1)
        else:
            note = None
        self.sampler = SystemSampler(pid, gpu=gpu, with_io=pid is not None, interval_s=interval_s)
        self.pid = pid
        self.top = top
        self.meta = self.sampler.header(interval_s=interval_s)
        self.processes: dict[int, dict[str, Any]] = {}
        self.notes: list[str] = [note] if note else []
        self._previous: dict[str, Any] | None = None
        self._last_gpu: dict[str, list[int]] = {}

    def step(self) -> MonitorFrame | None:
        """Take a sample; the frame since the previous one (None for the first)."""
        sample, events = self.sampler.sample()
        for event in events:
            self._apply(event)
        if sample is None:
            return None
        self._carry_gpu(sample)
        previous, self._previous = self._previous, sample
        if previous is None:
            return None
        builder = SamplesBuilder(self.meta)
        for event in self.processes.values():
            builder.add_event(event)
        builder.notes = list(self.notes)
        builder.add(previous)
        builder.add(sample)
        return live_frame(builder.freeze(), top=self.top)

    @property
    def target_alive(self) -> bool:
        return self.sampler.target_alive

    def close(self) -> None:
        self.sampler.close()

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "process":
            self.processes[event["id"]] = event
        elif kind == "exit":
            self.processes.pop(event["id"], None)
        elif kind == "role" and event["id"] in self.processes:
            self.processes[event["id"]].update(role=event["role"], loader_id=event.get("loader_id"))
        elif kind == "note" and event["text"] not in self.notes:
            self.notes.append(event["text"])

    def _carry_gpu(self, sample: dict[str, Any]) -> None:
        """GPU metrics read round-robin (PCIe) keep their last value on screen."""
        for name in _GPU_SLOW:
            values = sample.get(name)
            if values is None:
                continue
            last = self._last_gpu.setdefault(name, [-1] * len(values))
            sample[name] = [value if value >= 0 else old for value, old in zip(values, last)]
            self._last_gpu[name] = sample[name]
