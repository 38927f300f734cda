"""Capture on real training scripts: transparency, phases, DataLoaders, Lightning, torchrun."""

from __future__ import annotations

import importlib.util

import pytest

from support import run_cli, run_python, write_script
from stepscope.capture.cpu_peak import CROWDED_WAIT_SHARE, STEADY_MEDIAN_SHARE
from stepscope.capture.op_cost import STEADY_MEDIAN_RATIO
from stepscope.record.store import load_record

SEEDED_TRAINING = """
    import sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    workers = int(sys.argv[1])
    torch.manual_seed(1234)
    data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=16, shuffle=True, num_workers=workers,
                        generator=torch.Generator().manual_seed(7))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            print(loss.item().hex())
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_seeded_losses_are_bit_identical_and_loader_settings_recorded(tmp_path, workers):
    write_script(tmp_path, "seeded.py", SEEDED_TRAINING)
    bare = run_python(["seeded.py", str(workers)], tmp_path)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", "seeded.py", str(workers)], tmp_path)
    assert bare.returncode == wrapped.returncode == 0, wrapped.stderr
    assert len(bare.stdout.splitlines()) == 32
    assert wrapped.stdout == bare.stdout
    record = load_record(tmp_path / "out")
    assert len(record.steps) == 32
    assert record.meta.step_source == "optimizer"
    (loader,) = record.loaders
    assert loader.num_workers == workers
    assert loader.batch_size == 16
    assert loader.batches == 32
    assert loader.iterators == 2
    assert loader.dataset_type.endswith("TensorDataset")
    assert len(loader.worker_pids) == 2 * workers  # non-persistent workers restart each epoch
    assert int(record.steps.samples.sum()) == 512
    assert (record.steps.forward_ns > 0).all() and (record.steps.backward_ns > 0).all()
    timed = record.facts.worker_batches
    if workers:
        roles = (tmp_path / "out" / "roles.rank0.jsonl").read_text().splitlines()
        assert len(roles) == 2 * workers
        # every batch was timed in the worker that made it (the losses above are unchanged by it)
        assert timed is not None and len(timed) == 32 and set(timed.pid) <= set(loader.worker_pids)
        assert all(0 <= cpu <= wall for cpu, wall in zip(timed.cpu_ns, timed.wall_ns))
    else:
        assert timed is None and not (tmp_path / "out" / "worker_batches.rank0.txt").exists()


def _share(record, phase: str) -> float:
    steps = record.steps.select(slice(2, None))
    return float(steps.phase(phase).sum() / steps.duration_ns.sum())


@pytest.mark.serial  # phase shares of the zoo's own runs (test_zoo.py), taken on a quiet machine
def test_input_bound_demo_waits_for_data_and_healthy_demo_does_not(zoo_run):
    slow_record, fast_record = load_record(zoo_run("input-cpu").dir), load_record(zoo_run("healthy").dir)
    assert _share(slow_record, "data_wait") > 0.35
    # shares of a CPU run on a loaded machine: preemption lands in any phase, so the margins are wide
    assert _share(fast_record, "data_wait") < 0.2
    assert _share(fast_record, "forward") + _share(fast_record, "backward") > 0.4
    assert slow_record.loaders[0].num_workers == 0


def test_inference_loop_uses_batches_as_steps(tmp_path):
    write_script(tmp_path, "infer.py", """
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        model = torch.nn.Linear(8, 2).eval()
        with torch.no_grad():
            for (x,) in DataLoader(TensorDataset(torch.randn(40, 8)), batch_size=4):
                model(x)
    """)
    result = run_cli(["run", "--no-monitor", "-o", "out", "infer.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    record = load_record(tmp_path / "out")
    assert record.meta.step_source == "batch"
    assert len(record.steps) == 10
    assert (record.steps.forward_ns > 0).all()


def test_iterable_dataset_and_torch_save_of_the_model_still_work(tmp_path):
    write_script(tmp_path, "iterable.py", """
        import io
        import torch
        from torch.utils.data import DataLoader, IterableDataset


        class Stream(IterableDataset):
            def __iter__(self):
                for index in range(24):
                    yield torch.full((4,), float(index))


        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        for batch in DataLoader(Stream(), batch_size=4):
            model.zero_grad()
            model(batch).sum().backward()
            with torch.no_grad():  # updated by hand: torch.optim would import the compiler (~1 s)
                for weight in model.parameters():
                    weight -= 0.01 * weight.grad
        buffer = io.BytesIO()
        torch.save(model, buffer)  # hooks must not leak into pickles
        import copy
        copy.deepcopy(model)
        print("saved", len(buffer.getvalue()) > 0)
    """)
    result = run_cli(["run", "--no-monitor", "-o", "out", "iterable.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "saved True\n"
    record = load_record(tmp_path / "out")
    assert record.loaders[0].iterable_dataset
    assert len(record.steps) == 6


def test_library_api_produces_the_same_record(tmp_path):
    write_script(tmp_path, "api.py", """
        import time
        import stepscope
        import torch

        def batches():
            for _ in range(12):
                time.sleep(0.002)
                yield torch.randn(4, 8)

        model = torch.nn.Linear(8, 1)
        with stepscope.profile(out="api-run", sample_interval_s=None, summary=False) as session:
            for x in session.wrap(batches()):
                with session.phase("forward"):
                    loss = model(x).sum()
                loss.backward()
                session.step()
        print(len(session.record.steps))
    """)
    result = run_python(["api.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "12"
    record = load_record(tmp_path / "api-run")
    assert record.meta.mode == "api" and record.meta.step_source == "explicit"
    assert (record.steps.data_wait_ns[1:] > 1_000_000).all()
    assert (tmp_path / "api-run" / "report.json").is_file()


LIGHTNING_SCRIPT = """
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    if __name__ == "__main__":
        data = TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
        trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
        trainer.fit(Tiny(), DataLoader(data, batch_size=8))
        print("global_step", trainer.global_step)
"""


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed")
def test_lightning_trainer_fit_is_captured(tmp_path):
    write_script(tmp_path, "lit.py", LIGHTNING_SCRIPT)
    result = run_cli(["run", "--no-monitor", "-o", "out", "lit.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "global_step 12" in result.stdout
    record = load_record(tmp_path / "out")
    assert record.meta.step_source == "optimizer"
    assert len(record.steps) == 12
    assert (record.steps.data_wait_ns > 0).all()
    assert (record.steps.forward_ns > 0).all() and (record.steps.backward_ns > 0).all()
    assert record.loaders and record.loaders[0].batch_size == 8


def test_torchrun_ranks_write_their_records_into_one_run_dir(tmp_path):
    write_script(tmp_path, "ddp.py", """
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader, TensorDataset
        from torch.utils.data.distributed import DistributedSampler

        dist.init_process_group("gloo")
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
        model = DistributedDataParallel(torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        dist.destroy_process_group()
    """)
    index = tmp_path / "index.sqlite"
    result = run_python(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                         "-m", "stepscope", "run", "--no-monitor", "--tag", "ddp", "ddp.py"], tmp_path, timeout=300,
                        env={"STEPSCOPE_INDEX": str(index)})
    assert result.returncode == 0, result.stderr[-3000:]
    runs = list((tmp_path / "stepscope-runs").iterdir())
    assert len(runs) == 1, runs
    for rank in (0, 1):
        record = load_record(runs[0], rank=rank)
        assert record.meta.rank == rank and record.meta.world_size == 2
        assert len(record.steps) == 4
    assert (runs[0] / "report.json").is_file()
    # the job is one row of the run index (rank 0 writes it), with its tag
    from stepscope.record.run_index import list_runs

    (indexed,) = list_runs(index)
    assert indexed.run_dir == str(runs[0].resolve()) and indexed.tags == ("ddp",)
    assert indexed.get("world_size") == 2 and indexed.get("steps") == 4


def test_trace_window_is_recorded_and_left_out_of_statistics(tmp_path):
    import orjson

    result = run_cli(["demo", "healthy", "--no-monitor", "--trace", "-o", "out", "--steps", "14"], tmp_path)
    assert result.returncode == 0, result.stderr
    record = load_record(tmp_path / "out")
    (window,) = record.profiler_windows
    assert (window.first_step, window.last_step) == (5, 8)  # profiler warm-up step + 3 recorded
    trace = orjson.loads((tmp_path / "out" / window.trace_path).read_bytes())
    assert any(event.get("name") == "aten::addmm" for event in trace["traceEvents"])
    report = orjson.loads((tmp_path / "out" / "report.json").read_bytes())
    assert report["summary"]["steps"]["excluded"] == [4, 5, 6, 7, 8]
    assert sorted(event["name"] for event in trace["traceEvents"] if event.get("name", "").startswith("ProfilerStep")) \
        == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    assert report["trace"]["steps"] == 3  # the window's trace fed the diagnosis


def test_cpu_peak_is_measured_at_torch_import_once_then_read_from_the_cache(tmp_path):
    write_script(tmp_path, "cpu.py", """
        import sys
        import torch

        torch.manual_seed(0)
        if len(sys.argv) > 1:
            torch.set_num_threads(int(sys.argv[1]))
        model = torch.nn.Linear(64, 64)
        for _ in range(6):  # updated by hand: torch.optim would import the compiler in each of 4 processes
            model.zero_grad()
            model(torch.randn(32, 64)).sum().backward()
            with torch.no_grad():
                for weight in model.parameters():
                    weight -= 0.1 * weight.grad
        print(model.weight.sum().item().hex())
    """)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "OMP_NUM_THREADS": "2"}
    bare = run_python(["cpu.py"], tmp_path, env=env)
    first = run_cli(["run", "--no-monitor", "-o", "first", "cpu.py"], tmp_path, env=env)
    second = run_cli(["run", "--no-monitor", "-o", "second", "cpu.py"], tmp_path, env=env)
    fewer = run_cli(["run", "--no-monitor", "-o", "fewer", "cpu.py", "1"], tmp_path, env=env)
    assert first.returncode == second.returncode == fewer.returncode == 0, first.stderr + second.stderr
    assert first.stdout == second.stdout == bare.stdout  # the measurement leaves the seeded RNG alone
    measured = load_record(tmp_path / "first").facts.cpu_peak
    cached = load_record(tmp_path / "second").facts.cpu_peak
    assert measured.source == "measured" and measured.repetitions >= 3
    assert measured.flops_median <= measured.flops_best
    # a steady first measurement is read from the cache; one taken while other work held the cores
    # (its median under 70 % of its best, or its threads waiting for a core over 20 % of the time)
    # is measured again, keeping the better best
    steady = (measured.flops_median >= STEADY_MEDIAN_SHARE * measured.flops_best
              and measured.core_wait_share is not None and measured.core_wait_share <= CROWDED_WAIT_SHARE)
    assert (cached.source == "cache") is steady, (measured, cached)
    assert cached.flops_best >= measured.flops_best and (cached.flops_best == measured.flops_best or not steady)
    assert (tmp_path / "cache" / "stepscope" / "cpu_peak.json").is_file()
    scaled = load_record(tmp_path / "fewer")
    assert scaled.facts.cpu_peak.threads == 1
    assert any("scaled" in text for text in scaled.warnings)
    # the price of a tiny operator, measured with it (before capture's hooks: the calibration
    # model's steps are not the script's) and cached the same way
    first_cost, second_cost = (load_record(tmp_path / name).facts.op_cost for name in ("first", "second"))
    assert first_cost.source == "measured" and first_cost.seconds_best > 0
    steady_cost = first_cost.seconds_median <= STEADY_MEDIAN_RATIO * first_cost.seconds_best
    assert (second_cost.source == "cache") is steady_cost, (first_cost, second_cost)
    assert len(load_record(tmp_path / "first").steps) == len(load_record(tmp_path / "second").steps) == 6
    assert (tmp_path / "cache" / "stepscope" / "op_cost.json").is_file()


@pytest.mark.serial  # no CPU MFU is given while other processes hold the cores
def test_autocast_and_fp32_runs_get_mfu_against_different_peaks(tmp_path):
    write_script(tmp_path, "amp.py", """
        import sys
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        for _ in range(12):
            model.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=sys.argv[1] == "bf16"):
                out = model(torch.randn(64, 256))
            out.float().pow(2).mean().backward()
            with torch.no_grad():  # updated by hand: torch.optim would import the compiler (~1.5 s a run)
                for parameter in model.parameters():
                    parameter.add_(parameter.grad, alpha=-0.01)
    """)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # peaks measured here, on the quiet machine
    for dtype in ("bf16", "fp32"):
        result = run_cli(["run", "--no-monitor", "--no-summary", "-o", dtype, "amp.py", dtype], tmp_path, env=env)
        assert result.returncode == 0, result.stderr
    import orjson

    reports = {dtype: orjson.loads((tmp_path / dtype / "report.json").read_bytes()) for dtype in ("bf16", "fp32")}
    for dtype, report in reports.items():
        assert report["facts"]["compute"]["matmul_flops_by_dtype"].keys() == {dtype}
        mfu, note = report["summary"]["mfu"], report["summary"]["mfu_note"]
        if mfu is None and "other processes used" in (note or ""):
            pytest.skip(f"machine busy during the {dtype} run: {note}")  # withheld on purpose, see bundle.mfu_estimate
        assert mfu is not None, note
        assert mfu["dtype"] == dtype and dtype in mfu["peak_source"] and 0 < mfu["value"] <= 1
    bf16 = reports["bf16"]
    assert bf16["facts"]["compute"]["autocast"] == "cpu:bf16"
    assert bf16["facts"]["cpu_peak_bf16"]["flops_best"] != bf16["facts"]["cpu_peak"]["flops_best"]
    actions = " ".join(p["action"] for f in bf16["findings"] for p in f["prescriptions"])
    assert "autocast" not in actions  # never told to turn on what it uses


SKIPPING_SCRIPT = """
    import torch
    from torch.utils.data import DataLoader
    from stepscope.data import SkipBadSamples

    class Corrupt(torch.utils.data.Dataset):
        def __len__(self):
            return 96

        def __getitem__(self, index):
            if index % 8 == 3:
                raise OSError(f"truncated record {index}")
            return torch.full((4,), float(index))

    dataset = SkipBadSamples(Corrupt(), exceptions=OSError, name="corrupt-shards")
    model = torch.nn.Linear(4, 1)
    for x in DataLoader(dataset, batch_size=8, num_workers=2):
        model.zero_grad()
        model(x).sum().backward()
        with torch.no_grad():  # updated by hand: torch.optim would import the compiler (~1 s)
            for weight in model.parameters():
                weight -= 0.01 * weight.grad
    print(f"skipped {dataset.skipped}")
"""


def test_skipped_samples_reach_the_record_and_the_summary(tmp_path):
    write_script(tmp_path, "skipping.py", SKIPPING_SCRIPT)
    result = run_cli(["run", "--no-monitor", "-o", "out", "skipping.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "skipped 12\n"  # one bad sample in 8, counted in the two workers
    (counts,) = load_record(tmp_path / "out").facts.skipped_samples
    assert counts.dataset == "corrupt-shards" and counts.total == 12
    assert counts.by_process[0] == 0 and sum(counts.by_process[1:]) == 12 and len(counts.by_process) == 3
    summary = " ".join(result.stderr.split())
    assert "Skipped 12 failed to load, replaced by the next sample (12.5% of 96 delivered)" in summary


# torchvision's transforms are nn.Modules: a dataset calling them runs module calls inside next()
MODULE_TRANSFORMS = """
    import sys
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Dataset

    class Blur(torch.nn.Module):  # as torchvision.transforms.GaussianBlur: a convolution, no parameters
        def __init__(self):
            super().__init__()
            self.register_buffer("kernel", torch.full((3, 1, 9, 9), 1 / 81))

        def forward(self, image):
            for _ in range(6):
                image = F.conv2d(image[None], self.kernel, padding=4, groups=3)[0]
            return image

    class Resize(torch.nn.Module):
        def forward(self, image):
            return F.interpolate(image[None], size=(32, 32), mode="bilinear", align_corners=False)[0]

    class Images(Dataset):
        def __init__(self):
            self.transform = torch.nn.Sequential(Blur(), Resize())

        def __len__(self):
            return 320

        def __getitem__(self, index):
            image = torch.rand(3, 96, 96, generator=torch.Generator().manual_seed(index))
            return self.transform(image), index % 10

    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(Images(), batch_size=16, num_workers=int(sys.argv[1]))
    model = torch.nn.Linear(3 * 32 * 32, 10)
    for x, y in loader:
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x.flatten(1)), y).backward()
        with torch.no_grad():  # updated by hand: torch.optim would import the compiler (~1 s)
            for weight in model.parameters():
                weight -= 0.1 * weight.grad
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_module_transforms_inside_next_are_data_loading_not_the_model(tmp_path, workers):
    write_script(tmp_path, "transforms.py", MODULE_TRANSFORMS)
    result = run_cli(["run", "--no-monitor", "-o", "out", "transforms.py", str(workers)], tmp_path)
    assert result.returncode == 0, result.stderr
    record = load_record(tmp_path / "out")
    assert len(record.steps) == 20
    # the model's forward is one small matmul; the transforms' convolutions are the data wait
    forward, data_wait = _share(record, "forward"), _share(record, "data_wait")
    assert forward < 0.1, (forward, data_wait)
    if workers == 0:
        assert data_wait > 0.6, (forward, data_wait)
    # the FLOPs are the model's alone: its forward matmul and its weight gradient (the input needs none)
    compute = record.facts.compute
    assert compute is not None
    assert compute.flops == 2 * (2 * 16 * 3 * 32 * 32 * 10)
    if workers == 0:
        assert compute.data_ops > 0
