"""The bottleneck factors of the blind evaluation: what each plants, how its size is drawn, its code.

A factor is code planted into a plain training loop at named hooks (``HOOKS``): the sample's
``__getitem__``, the model, the loader's settings, the loop's set-up, the end of each step, the
end of the run, and the launcher (for what runs beside the script, not in it). The generator wraps
every hook's code in ``if on("<factor>"):``, so each factor is removed by its switch (``BLIND_OFF``)
and nothing else: the script with every switch off is the plain loop. A factor's definitions
(``defs``: constants and functions) are plain module code that only its guarded hooks call.

Sizes are drawn at random per workload (``draw``), as numbers of the planted mechanism (NumPy rounds
per sample, seconds of latency, layers, MiB, objects), not as durations: a loaded machine makes them
slower, as it makes real work slower. ``nominal_ms`` is a rough cost per step on the 2-core
development machine, used only to size a run (its number of steps), never to score.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

Params = Mapping[str, float | int | str]

#: Where a factor's code goes. Script hooks sit at a fixed indentation inside ``train.py``;
#: ``launcher`` runs in ``launch.py`` before the command starts.
HOOKS = ("getitem", "model_init", "model_forward", "loader", "setup", "after_step", "teardown", "launcher")

#: Measured on the 2-core development VM (torch 2.13, one sample of each): a 32x32 NumPy matmul
#: and tanh ~3.5 us, a round of integer arithmetic in Python ~0.14 us, a 16-wide Linear+Tanh
#: forward and backward ~80 us, ~6 GFLOP/s for the MLP.
NUMPY_ROUND_MS = 0.0035
PYTHON_ROUND_MS = 0.00014
TINY_LAYER_MS = 0.08


@dataclass(frozen=True)
class Base:
    """The plain loop every factor is planted into (the same for a workload and its ablations)."""

    batch: int
    features: int
    hidden: int
    depth: int
    num_workers: int
    steps_per_epoch: int
    epochs: int
    ranks: int
    data_seed: int

    @property
    def steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def compute_ms(self) -> float:
        """Forward, backward and SGD of the MLP, ~6 GFLOP/s on the development machine (one rank of
        two runs on one thread: half of that), plus ~1.5 ms of per-step overhead."""
        params = self.features * self.hidden + (self.depth - 1) * self.hidden * self.hidden + self.hidden
        rate = 6e9 / self.ranks
        return 6 * self.batch * params / rate * 1e3 + 1.5


@dataclass(frozen=True)
class Factor:
    """One kind of bottleneck: its name (the switch), what it plants, its size and its code."""

    name: str
    plants: str
    draw: Callable[[random.Random, Base], dict[str, float | int | str]]
    nominal_ms: Callable[[Params, Base], float]
    defs: str = ""
    hooks: Mapping[str, str] = field(default_factory=dict)
    launcher_defs: str = ""
    #: identifiers of its code that a finding naming code (a line, a function, a thread) would show
    code_names: tuple[str, ...] = ()
    #: relative chance of being drawn (a slow rank needs two processes under torchrun: rare)
    weight: float = 1.0


def log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _loader_share(base: Base) -> float:
    """Serial loading cost reaching the step: workers overlap it (roughly, on two cores)."""
    return 1.0 if base.num_workers == 0 else 1.0 / (base.num_workers + 1)


COSTLY_SAMPLES = Factor(
    name="costly_samples",
    plants="CPU work per sample in __getitem__ (NumPy rounds)",
    draw=lambda rng, base: {"rounds": max(4, round(log_uniform(rng, 10, 80) / NUMPY_ROUND_MS / base.batch))},
    nominal_ms=lambda params, base: float(params["rounds"]) * NUMPY_ROUND_MS * base.batch * _loader_share(base),
    defs='''
AUGMENT_ROUNDS = $rounds
AUGMENT_MIX = np.random.default_rng(SEED).standard_normal((32, 32)).astype(np.float32) * 0.1


def augment_sample(sample):
    """Augments one sample on the CPU: a fixed number of small NumPy rounds."""
    plane = np.resize(sample.numpy(), (32, 32))
    for _ in range(AUGMENT_ROUNDS):
        plane = np.tanh(plane @ AUGMENT_MIX)
    return sample + float(plane.mean()) * 1e-3
''',
    hooks={"getitem": "sample = augment_sample(sample)"},
    code_names=("augment_sample",),
)

SLOW_READS = Factor(
    name="slow_reads",
    plants="a blocking read per sample (a remote-store round trip: sleep)",
    draw=lambda rng, base: {"latency_s": round(max(1e-4, log_uniform(rng, 10, 80) / 1e3 / base.batch), 5)},
    nominal_ms=lambda params, base: float(params["latency_s"]) * 1e3 * base.batch * _loader_share(base),
    defs='''
READ_LATENCY_S = $latency_s


def fetch_from_store(index):
    """Reads one sample's record from a remote store: a round trip that blocks the loader."""
    time.sleep(READ_LATENCY_S)
    return index
''',
    hooks={"getitem": "fetch_from_store(index)"},
    code_names=("fetch_from_store",),
)

WORKER_RESTARTS = Factor(
    name="worker_restarts",
    plants="DataLoader workers started anew every short epoch (no persistent_workers), each start "
           "paying a worker_init_fn (pure Python) again",
    draw=lambda rng, base: {"init_rounds": round(log_uniform(rng, 50, 400) / PYTHON_ROUND_MS)},
    nominal_ms=lambda params, base: (float(params["init_rounds"]) * PYTHON_ROUND_MS + 30.0) / base.steps_per_epoch,
    defs='''
WORKER_INIT_ROUNDS = $init_rounds


def open_shard_index(worker_id):
    """Each worker builds its shard index when it starts (pure Python)."""
    value = worker_id
    for round_ in range(WORKER_INIT_ROUNDS):
        value = (value * 31 + round_) % 1_000_003
    return value
''',
    hooks={"loader": "persistent = False\nworker_init = open_shard_index"},
    code_names=("open_shard_index",),
)

GIL_THREAD = Factor(
    name="gil_thread",
    plants="a background Python thread of the training process that holds the GIL while it runs",
    draw=lambda rng, base: {"busy_s": round(rng.uniform(0.001, 0.006), 4), "duty": round(rng.uniform(0.1, 0.5), 2)},
    nominal_ms=lambda params, base: base.compute_ms() * float(params["duty"]),
    defs='''
TELEMETRY_BUSY_S = $busy_s
TELEMETRY_DUTY = $duty


def telemetry_loop(stop):
    """Aggregates metrics in pure Python: it holds the GIL while it works, then waits."""
    counter = 0
    while not stop.is_set():
        until = time.perf_counter() + TELEMETRY_BUSY_S
        while time.perf_counter() < until:
            counter = (counter * 31 + 7) % 1_000_003
        stop.wait(TELEMETRY_BUSY_S * (1 - TELEMETRY_DUTY) / TELEMETRY_DUTY)
''',
    hooks={
        "setup": 'telemetry_stop = threading.Event()\n'
                 'telemetry = threading.Thread(target=telemetry_loop, args=(telemetry_stop,), name="telemetry",'
                 ' daemon=True)\n'
                 'telemetry.start()',
        "teardown": "telemetry_stop.set()\ntelemetry.join()",
    },
    code_names=("telemetry_loop", "telemetry"),
)

TINY_OPS = Factor(
    name="tiny_ops",
    plants="a deep chain of 16-wide layers in the model: thousands of tiny operators per step",
    draw=lambda rng, base: {"layers": round(log_uniform(rng, 40, 300))},
    nominal_ms=lambda params, base: float(params["layers"]) * TINY_LAYER_MS,
    defs='''
REFINE_LAYERS = $layers
REFINE_WIDTH = 16
''',
    hooks={
        "model_init": "self.refine = torch.nn.Sequential(*[layer for _ in range(REFINE_LAYERS) for layer in "
                      "(torch.nn.Linear(REFINE_WIDTH, REFINE_WIDTH), torch.nn.Tanh())])",
        "model_forward": "out = out + self.refine(inputs[:, :REFINE_WIDTH]).mean(dim=1, keepdim=True)",
    },
    code_names=("self.refine", "refine"),
)

PERIODIC_SAVES = Factor(
    name="periodic_saves",
    plants="a synchronous torch.save + fsync every N steps (model, optimizer and an extra buffer)",
    draw=lambda rng, base: {"every": rng.randint(3, 10), "extra_mib": round(log_uniform(rng, 8, 96))},
    nominal_ms=lambda params, base: (5.0 * float(params["extra_mib"]) + 20.0) / float(params["every"]),
    defs='''
SAVE_EVERY = $every
SAVE_EXTRA_MIB = $extra_mib


def save_checkpoint(model, optimizer, ema, step):
    """Writes a checkpoint synchronously and waits for the disk (fsync)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"checkpoint-{os.environ.get('RANK', '0')}.pt")
    with open(path, "wb") as handle:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "ema": ema, "step": step},
                   handle)
        handle.flush()
        os.fsync(handle.fileno())
''',
    hooks={
        "setup": "ema = torch.randn(SAVE_EXTRA_MIB * 262144)",
        "after_step": "if step % SAVE_EVERY == SAVE_EVERY - 1:\n    save_checkpoint(model, optimizer, ema, step)",
    },
    code_names=("save_checkpoint",),
)

MEMORY_GROWTH = Factor(
    name="memory_growth",
    plants="a list that keeps a new tensor every step (never cleared)",
    draw=lambda rng, base: {"mib": rng.randint(1, 4)},
    nominal_ms=lambda params, base: 0.4 * float(params["mib"]),
    defs='''
HISTORY_MIB = $mib


def record_history(history):
    """Keeps a snapshot of every step for later analysis; nothing ever drops them."""
    history.append(torch.ones(HISTORY_MIB * 262144))
''',
    hooks={"setup": "history = []", "after_step": "record_history(history)"},
    code_names=("record_history",),
)

GC_PRESSURE = Factor(
    name="gc_pressure",
    plants="objects in reference cycles built every step beside a large live set (collector pauses)",
    draw=lambda rng, base: {"nodes": round(log_uniform(rng, 1500, 8000)), "live": round(log_uniform(rng, 1e5, 5e5))},
    nominal_ms=lambda params, base: float(params["nodes"]) * 0.002 * (1 + float(params["live"]) / 3e5),
    defs='''
GRAPH_NODES = $nodes
LIVE_OBJECTS = $live


def build_graph_cache(cache, step):
    """Builds this step's lookup graph: pairs of objects that refer to each other."""
    nodes = []
    for index in range(GRAPH_NODES):
        node = {"id": index, "step": step}
        node["peer"] = {"peer": node}
        nodes.append(node)
    cache.append(nodes)
''',
    hooks={
        "setup": "graph_cache = collections.deque(maxlen=4)\n"
                 "lookup_table = [{\"key\": [index]} for index in range(LIVE_OBJECTS)]",
        "after_step": "build_graph_cache(graph_cache, step)",
    },
    code_names=("build_graph_cache",),
)

NEIGHBOUR = Factor(
    name="neighbour",
    plants="a busy process beside the run (another tenant), started and killed by the launcher",
    draw=lambda rng, base: {"duty": round(rng.uniform(0.5, 1.0), 2)},
    nominal_ms=lambda params, base: base.compute_ms() * float(params["duty"]) * 0.5,
    launcher_defs='''
NEIGHBOUR_DUTY = $duty
#: A busy loop (busy NEIGHBOUR_DUTY of every 20 ms) that leaves when its parent is gone.
NEIGHBOUR_CODE = """
import os, sys, time
parent, duty = int(sys.argv[1]), float(sys.argv[2])
deadline = time.monotonic() + 1800
while os.getppid() == parent and time.monotonic() < deadline:
    until = time.perf_counter() + 0.02 * duty
    while time.perf_counter() < until:
        pass
    if duty < 1:
        time.sleep(0.02 * (1 - duty))
"""


def start_neighbour():
    return subprocess.Popen([sys.executable, "-c", NEIGHBOUR_CODE, str(os.getpid()), str(NEIGHBOUR_DUTY)])
''',
    hooks={"launcher": "neighbours.append(start_neighbour())"},
    code_names=("NEIGHBOUR_CODE",),
)

SLOW_RANK = Factor(
    name="slow_rank",
    plants="rank 1 of 2 (gloo, torchrun) does per-step work of its own after the optimizer step",
    draw=lambda rng, base: {"chore_s": round(log_uniform(rng, 0.008, 0.05), 4),
                            "kind": rng.choice(("sleep", "python"))},
    nominal_ms=lambda params, base: float(params["chore_s"]) * 1e3,
    defs='''
CHORE_S = $chore_s
CHORE_KIND = $kind
SLOW_RANK = 1


def rank_chore(rank):
    """Per-rank work after the optimizer step (a metrics upload, an evaluation): only one rank has it."""
    if rank != SLOW_RANK:
        return
    if CHORE_KIND == "sleep":
        time.sleep(CHORE_S)
        return
    value, until = 0, time.perf_counter() + CHORE_S
    while time.perf_counter() < until:
        value = (value * 31 + 7) % 1_000_003
''',
    hooks={"after_step": "rank_chore(rank)"},
    code_names=("rank_chore",),
    weight=0.25,
)

FACTORS: dict[str, Factor] = {factor.name: factor for factor in (
    COSTLY_SAMPLES, SLOW_READS, WORKER_RESTARTS, GIL_THREAD, TINY_OPS, PERIODIC_SAVES, MEMORY_GROWTH,
    GC_PRESSURE, NEIGHBOUR, SLOW_RANK)}
