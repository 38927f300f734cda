"""Multi-rank jobs under torchrun (gloo, 2 processes): the communication phase, the merged job
report, cross-rank verdicts, bit-identical DDP, killed ranks, two nodes on one machine."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys

import pytest

from support import cli_env, popen, run_cli, run_python, write_script
from stepscope.record.store import load_record

#: Every job rendezvouses on a port of its own (``--standalone``, or a free port), so jobs of
#: parallel tests never meet. The verdict tests read the zoo's own distributed scenarios
#: (comm-bound, straggler), run once by test_zoo.py.
pytestmark = pytest.mark.slow

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
#: The stack sampler (code attribution) is not what these tests measure: it stays off here.
NO_STACKS = ["--stacks-hz", "0"]

# A script without DDP or FSDP whose point is not the optimizer updates its weights by hand:
# torch.optim's first optimizer imports torch._dynamo (~1 s of CPU in each rank). DDP and
# fully_shard import it themselves, so their scripts keep torch.optim at no extra cost.

STRAGGLER = """
    import time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)

    class Shard(Dataset):
        def __len__(self):
            return 8 * 40
        def __getitem__(self, index):
            if rank == 1:
                time.sleep(0.005)  # rank 1 reads a slow shard
            g = torch.Generator().manual_seed(index)
            return torch.randn(32, generator=g), torch.randn(1, generator=g)

    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(Shard(), batch_size=8):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()
"""


@pytest.mark.serial  # the verdict needs the cores to itself
def test_straggler_is_named_with_its_cause_and_rank0_is_not_told_to_raise_its_batch(tmp_path, zoo_run):
    run = zoo_run("straggler")  # rank 1 waits 5 ms per sample for data (num_workers=0); rank 0 does not
    report = run.report
    top = report["findings"][0]
    assert top["family"] == "straggler", [item["title"] for item in report["findings"]]
    assert top["rank"] == 1
    assert "rank 1" in top["title"] and "for data" in top["title"] and "num_workers=0" in top["title"]
    families = {item["family"] for item in report["findings"]}
    assert "compute" not in families and "communication" not in families
    assert "batch_size" not in json.dumps(report["findings"])
    rank0 = next(item for item in report["ranks"] if item["rank"] == 0)  # the waiting rank itself
    assert "straggler" in {item["family"] for item in rank0["findings"]}  # (others' load may rank above)
    assert not {"compute", "communication"} & {item["family"] for item in rank0["findings"]}
    summary = run_cli(["report", str(run.dir)], tmp_path)
    assert "Ranks (2 of 2)" in summary.stdout + summary.stderr and "straggles" in summary.stdout + summary.stderr
    rows = {row["rank"]: row for row in report["job"]["ranks"]}
    assert rows[0]["communication_s"] > 0.5 * rows[1]["data_wait_s"]  # rank 0 waits in the all-reduce
    steps = load_record(run.dir, 0).steps
    total = steps.data_wait_ns + steps.forward_ns + steps.backward_ns + steps.optimizer_ns \
        + steps.communication_ns + steps.other_ns
    assert (total == steps.duration_ns).all()


@pytest.mark.serial  # the verdict needs the cores to itself
def test_communication_bound_job_names_its_share(zoo_run):
    report = zoo_run("comm-bound").report  # a wide MLP, a batch of 1 per rank, DDP over gloo
    top = report["findings"][0]
    assert top["family"] == "communication", [item["title"] for item in report["findings"]]
    assert top["ranks"] == [0, 1]
    share = top["extra"]["exposed_share"]
    assert share >= 0.3 and f"{share:.0%}"[:-1] in top["title"]
    assert any("bucket_cap_mb" in item["action"] for item in top["prescriptions"])
    assert "compute" not in {item["family"] for item in report["findings"]}


BIT_IDENTICAL = """
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 300), torch.nn.Tanh(), torch.nn.Linear(300, 1)),
                bucket_cap_mb=0.01)  # several buckets
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(dist.get_rank())
    losses = []
    for step in range(12):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item().hex())
    digest = float(sum(p.double().sum() for p in model.parameters())).hex()
    print(f"rank{dist.get_rank()} " + " ".join(losses) + " params=" + digest)
    dist.destroy_process_group()
"""


def _rank_lines(stdout: str) -> list[str]:
    return sorted(re.findall(r"rank\d(?: 0x[0-9a-fp.+-]+)+ params=-?0x[0-9a-fp.+-]+", stdout))


#: torch's own teardown, seen without stepscope (a plain torchrun of BIT_IDENTICAL, on a loaded
#: machine): a rank aborts at exit, after its last line, in a C++ thread's destructor.
TEARDOWN_ABORT = "terminate called without an active exception"


#: Runs of a job that end in :data:`TEARDOWN_ABORT` before it counts as failed: twice in a row
#: happened once, in a plain run beside the other tests (one worker more than the cores).
TEARDOWN_TRIES = 3


def _torchrun(args: list[str], cwd) -> subprocess.CompletedProcess:
    """A torchrun job, run again (up to :data:`TEARDOWN_TRIES` in all) only while a rank dies of
    :data:`TEARDOWN_ABORT`."""
    result = run_python(args, cwd, timeout=240)
    for _ in range(TEARDOWN_TRIES - 1):
        if result.returncode == 0 or TEARDOWN_ABORT not in result.stderr:
            break
        result = run_python(args, cwd, timeout=240)
    return result


def test_ddp_losses_are_bit_identical_with_and_without_capture(tmp_path):
    write_script(tmp_path, "ddp.py", BIT_IDENTICAL)
    bare = _torchrun([*TORCHRUN, "ddp.py"], tmp_path)
    assert bare.returncode == 0, bare.stderr[-3000:]
    captured = _torchrun([*TORCHRUN, "-m", "stepscope", "run", "--no-monitor", *NO_STACKS, "-o", "out", "--force",
                          "ddp.py"], tmp_path)
    assert captured.returncode == 0, captured.stderr[-3000:]
    # the two ranks share one pipe: their lines may reach it in either order, or (under torchrun's
    # own output handling) run together on one line, so each rank's line is found by its pattern
    assert _rank_lines(bare.stdout) == _rank_lines(captured.stdout) and len(_rank_lines(bare.stdout)) == 2
    record = load_record(tmp_path / "out", 0)
    assert record.steps.communication_ns.sum() + record.steps.communication_overlap_ns.sum() > 0


def test_python_collectives_and_async_work_are_communication(tmp_path):
    write_script(tmp_path, "coll.py", """
        import time, torch, torch.distributed as dist
        from torch.utils.data import DataLoader, TensorDataset
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = torch.nn.Linear(4, 1)
        for x, in DataLoader(TensorDataset(torch.randn(40, 4)), batch_size=4):
            model.zero_grad()
            model(x).sum().backward()
            for p in model.parameters():
                if rank == 1:
                    time.sleep(0.01)  # rank 0 waits 10 ms in each all_reduce
                dist.all_reduce(p.grad)
            work = dist.all_reduce(torch.ones(3), async_op=True)
            work.wait()
            dist.barrier()
            with torch.no_grad():  # by hand: torch.optim is not what this measures
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.1)
        dist.destroy_process_group()
    """)
    result = run_python([*TORCHRUN, "-m", "stepscope", "run", "--no-monitor", *NO_STACKS, "-o", "out", "coll.py"],
                        tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = load_record(tmp_path / "out", 0).steps
    assert len(steps) >= 9
    import numpy as np

    assert np.median(steps.communication_ns[2:]) > 10_000_000  # rank 1 sleeps 2 × 10 ms before its all_reduce
    assert not list((tmp_path / "out").glob("rank*.lock"))  # a clean job leaves no lock behind


def test_a_killed_rank_is_reported_missing_and_loses_nobody_else_s_data(tmp_path):
    write_script(tmp_path, "dies.py", """
        import os, signal, time, torch, torch.distributed as dist
        from torch.utils.data import DataLoader, TensorDataset
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = torch.nn.Linear(4, 1)
        for step, (x,) in enumerate(DataLoader(TensorDataset(torch.randn(80, 4)), batch_size=4)):
            model.zero_grad()
            model(x).sum().backward()
            with torch.no_grad():  # by hand: torch.optim is not what this measures
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.1)
            time.sleep(0.05)
            if rank == 1 and step == 10:
                os.kill(os.getpid(), signal.SIGKILL)
    """)
    result = run_python([*TORCHRUN, "-m", "stepscope", "run", *NO_STACKS, "-o", "out", "dies.py"], tmp_path, timeout=240,
                        env={"STEPSCOPE_JOB_WAIT_S": "20"})
    assert result.returncode != 0
    assert load_record(tmp_path / "out", 0).steps.communication_ns is not None
    report = run_cli(["report", "out", "--format", "json"], tmp_path)
    assert report.returncode == 0, report.stderr
    job = json.loads(report.stdout)["job"]
    assert [row["rank"] for row in job["ranks"]] == [0]
    (missing,) = job["missing"]
    assert missing["rank"] == 1 and "no record" in missing["reason"] and missing["ran_s"] > 0.3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_nodes_write_one_run_directory_and_one_report(tmp_path):
    write_script(tmp_path, "straggler.py", STRAGGLER)
    port = _free_port()
    common = ["-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
              "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "job7"]
    nodes = [popen([sys.executable, *common, "--node_rank", str(node), "-m", "stepscope", "run",
                    *NO_STACKS, "-o", "out", "straggler.py"], tmp_path, cli_env(),
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    outputs = [node.communicate(timeout=240) for node in nodes]
    assert nodes[0].returncode == 0, outputs[0][1][-3000:]
    # node 0's agent hosts the c10d store: when it exits first, node 1's agent may lose the store
    # after its worker ended (a torchrun shutdown race, not the job's)
    assert nodes[1].returncode == 0 or "RendezvousConnectionError" in outputs[1][1], outputs[1][1][-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [(row["rank"], row["node"]) for row in report["job"]["ranks"]] == [(0, 0), (1, 1)]
    # both nodes' records reach the one diagnosis (the verdict itself: the serial straggler test)
    straggler = [item for item in report["findings"] if item["family"] == "straggler"]
    assert straggler and straggler[0]["rank"] == 1, [item["title"] for item in report["findings"]]


def test_fsdp2_collectives_are_communication(tmp_path):
    write_script(tmp_path, "fsdp.py", """
        import torch, torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        from torch.utils.data import DataLoader, TensorDataset
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in DataLoader(TensorDataset(torch.randn(80, 16), torch.randn(80, 1)), batch_size=8):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        dist.destroy_process_group()
    """)
    result = run_python([*TORCHRUN, "-m", "stepscope", "run", "--no-monitor", *NO_STACKS, "-o", "out", "fsdp.py"],
                        tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = load_record(tmp_path / "out", 0).steps
    assert len(steps) == 10 and steps.communication_ns.sum() > 0  # all_gather_single / reduce_scatter_single


def test_a_script_s_own_comm_hook_runs_and_is_timed(tmp_path):
    write_script(tmp_path, "hooked.py", """
        import torch, torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(32, 1))
        calls = []
        def hook(state, bucket):
            calls.append(1)
            return default_hooks.allreduce_hook(state, bucket)
        model.register_comm_hook(None, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(8):
            opt.zero_grad()
            model(torch.randn(4, 32)).sum().backward()
            opt.step()
        import sys
        sys.stdout.write(f"calls {len(calls)}\\n")  # one write: the two ranks share the pipe
        dist.destroy_process_group()
    """)
    result = run_python([*TORCHRUN, "-m", "stepscope", "run", "--no-monitor", *NO_STACKS, "-o", "out", "hooked.py"],
                        tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("calls 8") == 2  # the script's hook ran for every bucket
    steps = load_record(tmp_path / "out", 0).steps
    assert steps.communication_ns.sum() + steps.communication_overlap_ns.sum() > 0


ALL_REDUCE_LOOP = """
    import os, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    for _ in range(30):
        model.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
        with torch.no_grad():  # by hand: torch.optim is not what this measures
            for parameter in model.parameters():
                parameter.add_(parameter.grad, alpha=-0.01)
    # the samples file is what is sent too: a run that ends before its sampler has started has none
    deadline = time.monotonic() + 60
    while not os.path.exists(f"out/samples.rank{dist.get_rank()}.jsonl.gz") and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()
"""


def test_two_nodes_without_a_shared_filesystem_merge_on_rank_0_s_node(tmp_path):
    """Each node writes to its own directory; rank 1's record reaches rank 0 through the job's c10d
    store, and node 0's directory holds the one merged report."""
    port = _free_port()
    common = ["-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
              "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "nofs"]
    homes = [tmp_path / f"node{node}" for node in (0, 1)]
    for home in homes:
        home.mkdir()
        write_script(home, "loop.py", ALL_REDUCE_LOOP)
    nodes = [popen([sys.executable, *common, "--node_rank", str(node), "-m", "stepscope", "run",
                    *NO_STACKS, "-o", "out", "loop.py"], homes[node], cli_env(),
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    outputs = [node.communicate(timeout=240) for node in nodes]
    assert nodes[0].returncode == 0, outputs[0][1][-3000:]
    assert nodes[1].returncode == 0 or "RendezvousConnectionError" in outputs[1][1], outputs[1][1][-3000:]
    assert sorted(p.name for p in (homes[1] / "out").glob("record.*")) == ["record.rank1.json.gz"]
    assert not (homes[1] / "out" / "report.json").exists()
    node0 = homes[0] / "out"
    assert sorted(p.name for p in node0.glob("record.*")) == ["record.rank0.json.gz", "record.rank1.json.gz"]
    assert (node0 / "samples.rank1.jsonl.gz").is_file()
    report = json.loads((node0 / "report.json").read_text())
    assert [(row["rank"], row["node"]) for row in report["job"]["ranks"]] == [(0, 0), (1, 1)]
    assert report["job"]["missing"] == []
    assert "Ranks (2 of 2)" in outputs[0][1]
    assert load_record(node0, 1).meta.rank == 1


def _traceback_lines(stderr: str, rank: int) -> list[str]:
    """Rank ``rank``'s traceback as torch.distributed's excepthook prints it (each line prefixed),
    a peer's port (run-dependent) masked."""
    prefix = f"[rank{rank}]:"
    return [re.sub(r"\]:\d+\b", "]:PORT", line) for line in stderr.splitlines() if line.startswith(prefix)]


def _bare_and_captured(tmp_path, script: str, name: str,
                       launcher: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, ...]:
    write_script(tmp_path, name, script)
    bare = run_python([*TORCHRUN, *launcher, name], tmp_path, timeout=240)
    captured = run_python([*TORCHRUN, *launcher, "-m", "stepscope", "run", "--no-monitor", *NO_STACKS, "-o", "out",
                           name], tmp_path, timeout=240)
    return bare, captured


def test_a_failing_comm_hook_s_traceback_is_python_s(tmp_path):
    """The script's own hook returns a failed future: DDP's error reaches the script unchanged (no
    "Got the following error when running the callback", no ``At:`` stack of capture's frames)."""
    bare, captured = _bare_and_captured(tmp_path, """
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(4, 1))
        def hook(state, bucket):
            future = torch.futures.Future()
            future.set_exception(RuntimeError("hook failed on purpose"))
            return future
        model.register_comm_hook(None, hook)
        model(torch.randn(2, 4)).sum().backward()
    """, "hookfail.py")
    assert bare.returncode != 0 and captured.returncode != 0
    for rank in (0, 1):
        expected = _traceback_lines(bare.stderr, rank)
        assert expected[-1].endswith("RuntimeError: Unable to cast hook failed on purpose to Tensor"), bare.stderr
        assert _traceback_lines(captured.stderr, rank) == expected, captured.stderr[-4000:]


def test_a_dead_peer_s_error_reaches_rank_0_as_without_capture(tmp_path):
    """Rank 1 vanishes while rank 0 waits in DDP's all-reduce (capture's default hook): rank 0's
    traceback is the one Python prints without stepscope, line for line."""
    bare, captured = _bare_and_captured(tmp_path, """
        import os, time, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = DDP(torch.nn.Linear(4, 1))
        for step in range(4):
            if rank == 1 and step == 2:
                time.sleep(1)  # rank 0 is waiting in the all-reduce when rank 1 is gone
                os._exit(0)  # its sockets close as on a kill; a clean exit lets the launcher wait for rank 0
            model(torch.randn(2, 4)).sum().backward()
    """, "peerdies.py")
    # A rank that fails makes the launcher stop the others (SIGTERM) at its next look, which may come
    # before rank 0 has met the closed connection and printed its traceback; one that exits cleanly
    # does not, so rank 0 always fails on its own.
    assert bare.returncode != 0 and captured.returncode != 0
    expected = _traceback_lines(bare.stderr, 0)
    assert "Connection closed by peer" in expected[-1], bare.stderr[-4000:]
    assert _traceback_lines(captured.stderr, 0) == expected, captured.stderr[-4000:]
    assert "stepscope" not in "\n".join(_traceback_lines(captured.stderr, 0))


RANK_DIES = """
    import os, signal, sys, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    how, dying = sys.argv[1], int(sys.argv[2])
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(8):
        if rank == dying and step == 3:  # in step 4, after 3 complete steps
            time.sleep(0.3)  # the other rank waits in the all-reduce
            if how == "raise":
                raise RuntimeError("rank fails on purpose")
            if how == "exit":
                os._exit(1)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
"""


@pytest.mark.parametrize(("how", "dying", "expected"), [
    ("raise", 1, {"how": "exception", "exception": "RuntimeError", "exit_code": 1}),
    ("exit", 1, {"how": "os._exit", "exit_code": 1}),
    ("kill", 1, {"how": "killed", "signal": "SIGKILL", "exit_code": -9}),
    ("kill", 0, {"how": "killed", "signal": "SIGKILL", "exit_code": -9}),  # rank 1 writes the job's report
])
def test_a_job_whose_rank_dies_has_a_merged_report_naming_the_first_failure(tmp_path, how, dying, expected):
    write_script(tmp_path, "dies.py", RANK_DIES)
    result = run_python([*TORCHRUN, "-m", "stepscope", "run", "--no-monitor", *NO_STACKS, "-o", "out", "dies.py", how,
                         str(dying)], tmp_path, timeout=240, env={"STEPSCOPE_CHECKPOINT_S": "0"})
    assert result.returncode != 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    failure = report["job"]["failure"]
    assert failure is not None, result.stderr[-4000:]
    assert failure["rank"] == dying and failure["step"] == 4 and failure["then"] == [1 - dying], failure
    assert {key: failure[key] for key in expected} == expected, failure
    assert f"The job failed: rank {dying} failed first, in step 4" in result.stderr, result.stderr[-4000:]
    assert result.stderr.count("The job failed:") == 1  # one rank merged
    assert (tmp_path / "out" / f"rank{dying}.lock").exists()  # the failed rank's mark stays
