"""The zoo: training workloads with planted bottlenecks.

Each scenario is an ordinary, unmodified training script inside the package
(``python -m stepscope.zoo.<module>`` runs it bare; ``stepscope demo NAME`` runs it under capture)
and states the bottleneck planted in it. The diagnosis tests run every scenario and require its
planted family to be the top finding.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.errors import UsageError


@dataclass(frozen=True)
class Scenario:
    """A zoo workload.

    Args:
        name: the name ``stepscope demo NAME`` takes.
        module: the module run as ``__main__``.
        planted_family: the diagnosis family the scenario is built to trigger.
        title: one line for ``stepscope demo --list``.
        mechanism: how the bottleneck is planted (what the script does).
        args: extra command-line arguments passed to the script by ``stepscope demo``.
        nproc: processes; above 1, ``stepscope demo`` launches the scenario under torchrun (gloo).
    """

    name: str
    module: str
    planted_family: str
    title: str
    mechanism: str
    args: tuple[str, ...] = ()
    nproc: int = 1


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            name="input-cpu",
            module="stepscope.zoo.input_cpu",
            planted_family="input_pipeline",
            title="CPU-heavy __getitem__ with num_workers=0",
            mechanism="each sample runs a NumPy augmentation of a few ms in the main process, "
            "so the model waits for every batch",
        ),
        Scenario(
            name="storage-latency",
            module="stepscope.zoo.storage_latency",
            planted_family="storage_io",
            title="__getitem__ blocked on a slow remote store, num_workers=0",
            mechanism="each sample waits a few ms for a simulated object-store round trip while the "
            "CPU stays idle",
        ),
        Scenario(
            name="cold-files",
            module="stepscope.zoo.cold_files",
            planted_family="storage_io",
            title="first epoch reads 256 MiB of files evicted from the page cache, num_workers=2",
            mechanism="the data set is written and dropped from the page cache before training; the first of "
            "3 epochs waits for the disk, the later ones read from memory",
        ),
        Scenario(
            name="small-batch",
            module="stepscope.zoo.small_batch",
            planted_family="compute",
            title="wide MLP trained with a batch of 1",
            mechanism="every matmul is a thin matrix-vector product: cores busy, low MFU",
        ),
        Scenario(
            name="tiny-ops",
            module="stepscope.zoo.tiny_ops",
            planted_family="launch_overhead",
            title="150 tiny Linear+Tanh layers (16 wide) per forward",
            mechanism="thousands of operators per step, each doing less math than its dispatch costs",
        ),
        Scenario(
            name="checkpoint-stall",
            module="stepscope.zoo.checkpoint_stall",
            planted_family="periodic_stall",
            title="synchronous torch.save + fsync every 5 steps",
            mechanism="a compute-bound loop writes model and optimizer state to disk on the "
            "critical path every N steps",
        ),
        Scenario(
            name="memory-leak",
            module="stepscope.zoo.memory_leak",
            planted_family="memory_pressure",
            title="outputs and buffers retained every step",
            mechanism="a list that is never cleared keeps ~4 MiB per step alive: RSS grows steadily",
        ),
        Scenario(
            name="oversubscribed",
            module="stepscope.zoo.oversubscribed",
            planted_family="cpu_oversubscription",
            title="4 workers × 4 intra-op threads on the cores of this machine",
            mechanism="a worker_init_fn raises each worker's torch threads and every sample runs "
            "multi-threaded matmuls, on top of the training process's own threads",
        ),
        Scenario(
            name="busy-model",
            module="stepscope.zoo.busy_model",
            planted_family="healthy",
            title="a model using every core beside a light num_workers=0 loader",
            mechanism="a few percent of the step waits for a small per-sample transform while the "
            "matmuls use all cores: workers or fewer threads would slow it down",
        ),
        Scenario(
            name="worker-tokenize",
            module="stepscope.zoo.worker_tokenize",
            planted_family="input_pipeline",
            title="slow pure-Python tokenize() in __getitem__, num_workers=2",
            mechanism="each sample runs a pure-Python comprehension over 12,000 characters in the "
            "DataLoader workers; code attribution names worker_tokenize.py tokenize() in the workers",
        ),
        Scenario(
            name="loop-bookkeeping",
            module="stepscope.zoo.loop_bookkeeping",
            planted_family="outside_model",
            title="per-step metric dict built in pure Python outside the model",
            mechanism="after each optimizer step every parameter goes through .tolist() and a Python "
            "sum of squares: the 'other' phase dominates, on step_metrics()'s one line",
        ),
        Scenario(
            name="tokenize-main",
            module="stepscope.zoo.tokenize_main",
            planted_family="input_pipeline",
            title="pure-Python tokenising in __getitem__, num_workers=0, a model on 2 intra-op threads",
            mechanism="each batch of 16 texts is tokenised and hashed character by character in the main "
            "process (~17 ms); on 2 cores workers alone fight the model's threads, workers with one "
            "intra-op thread help (what run --verify measures)",
        ),
        Scenario(
            name="metrics-confusion",
            module="stepscope.zoo.metrics_confusion",
            planted_family="outside_model",
            title="a confusion matrix updated by a pure-Python double loop after every step",
            mechanism="update_confusion() loops over the batch and the 50 classes in Python: the 'other' phase "
            "dominates, inside that function (its call site only converts two tensors to lists)",
        ),
        Scenario(
            name="gc-cycles",
            module="stepscope.zoo.gc_cycles",
            planted_family="garbage_collection",
            title="growing cache of small cyclic objects: garbage-collector pauses",
            mechanism="every step keeps a tree of parent<->child cycles and drops another; full "
            "collections walk the ever larger cache (GC pauses measured with gc.callbacks)",
        ),
        Scenario(
            name="compile-recompiles",
            module="stepscope.zoo.compile_recompiles",
            planted_family="compile",
            title="torch.compile(dynamic=False) fed a new sequence length every step",
            mechanism="each new length fails a shape guard and recompiles the forward, until the frame hits "
            "the recompile limit (8) and runs eager for new lengths",
        ),
        Scenario(
            name="compile-graph-break",
            module="stepscope.zoo.compile_graph_break",
            planted_family="compile",
            title="a compiled forward branching on tensor.item()",
            mechanism="dynamo cannot trace .item(): the frame breaks into two graphs and the code after the "
            "break is compiled again for the values it specialises on",
        ),
        Scenario(
            name="compile-short",
            module="stepscope.zoo.compile_short",
            planted_family="compile",
            title="a compiled MLP trained for 20 steps",
            mechanism="compiling the model takes most of a job this short and never pays back",
        ),
        Scenario(
            name="compile-healthy",
            module="stepscope.zoo.compile_healthy",
            planted_family="healthy",
            title="a compiled MLP, one graph compiled once, 200 steps",
            mechanism="fixed shapes and no data-dependent Python: one compilation, then the compiled graph; "
            "its compile time a small share of the run",
        ),
        Scenario(
            name="healthy",
            module="stepscope.zoo.healthy",
            planted_family="healthy",
            title="compute-bound MLP on in-memory tensors",
            mechanism="batches come from a TensorDataset (no per-sample work); large matmuls "
            "dominate the step",
        ),
        Scenario(
            name="jsonl-text",
            module="stepscope.zoo.jsonl_text",
            planted_family="healthy",
            title="token model fed from JSONL by stepscope.data",
            mechanism="IndexedJsonl + BucketBatchSampler + pad_collate (+ SkipBadSamples) on a generated JSONL file: "
            "sub-millisecond batches with little padding; the per-token MLP dominates the step",
        ),
        Scenario(
            name="comm-bound",
            module="stepscope.zoo.comm_bound",
            planted_family="communication",
            title="DDP on 2 gloo processes: a wide MLP with a batch of 1 per rank",
            mechanism="each step computes one sample and all-reduces ~13 MB of gradients: the step waits "
            "in the all-reduce after backward",
            nproc=2,
        ),
        Scenario(
            name="straggler",
            module="stepscope.zoo.straggler",
            planted_family="straggler",
            title="DDP on 2 gloo processes: rank 1's DataLoader waits 5 ms per sample",
            mechanism="rank 1 loads slowly (num_workers=0, a slow shard); rank 0 waits for it in DDP's "
            "gradient all-reduce",
            nproc=2,
        ),
        Scenario(
            name="slow-rank",
            module="stepscope.zoo.slow_rank",
            planted_family="straggler",
            title="DDP on 2 gloo processes: rank 1 blocks ~20 ms per step outside the model",
            mechanism="after each optimizer step rank 1 runs a blocking per-rank chore (rank_chore()); "
            "rank 0 waits for it in the next gradient all-reduce",
            nproc=2,
        ),
    )
}

#: What ``stepscope demo`` runs without arguments.
DEFAULT_SCENARIO = "input-cpu"


def get_scenario(name: str) -> Scenario:
    """Look a scenario up by name.

    Raises:
        UsageError: unknown name (the message lists the known ones).
    """
    try:
        return SCENARIOS[name]
    except KeyError:
        known = ", ".join(sorted(SCENARIOS))
        raise UsageError(f"unknown demo scenario {name!r}; choose one of: {known} "
                         "(see 'stepscope demo --list')") from None
