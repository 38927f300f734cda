"""The critical path of a traced step: which chain of CPU work, launches, kernels, synchronisations,
data loading and collectives, shortened, would shorten the step.

Contract: :func:`critical_path` builds, for one window of one rank (a ``ProfilerStep``, an
annotation's instance, or the whole trace), the dependency graph of Holistic Trace Analysis'
lightweight critical-path analysis (``hta/analyzers/critical_path_analysis.py``, 0.6.x) from the
rows HTA sees (:class:`~stepscope.traces.links.HtaRows`: HTA's filtering and rounded times), takes
its longest path and says what bounds it. In ``hta`` mode the graph is HTA's, edge for edge
(tested on HTA's own critical-path traces); the default mode differs where HTA's answer misleads a
user, each difference named in :data:`DIFFERENCES`.

The graph. Every CPU operator / CUDA runtime call (and data-loading range) in the window and every
GPU row launched from it has a start and an end node; times are HTA's (µs, rounded inward). Edges:

- per CPU thread, the nesting walk: parent start → first child start, child end → next sibling
  start, last child end → parent end (``operator``; between two top-level operators a
  ``dependency`` of weight 0 in HTA), op start → op end for a leaf; in HTA a blocking runtime call
  (``cudaStreamSynchronize``, ``cudaMemcpy``…) weighs 0: its time is the GPU's, reached through
  its sync edge (the default mode draws it last, as a ``wait``: see :data:`DIFFERENCES`). The
  backward thread is walked as part of the forward thread (HTA's remap) when exactly one thread
  has ``forward`` and one ``autograd`` operators;
- the CUDA runtime lock (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ``cudaHostAlloc`` across
  threads): each call's end waits for the calls that started before it (``dependency``);
- per kernel: kernel start → end (``operator``); then, when the stream was empty at the launch
  and the previous kernel ended before the launch, launch start → kernel start (``launch``);
  otherwise, previous kernel end on the stream → kernel start when under 1.5 ms
  (``kernel_gap``); a ``cudaStreamWaitEvent`` makes the next kernel on the waiting stream wait
  for the kernel before the matching ``cudaEventRecord`` (``sync``);
- ``Stream Sync`` / ``Context Sync`` / ``Event Sync``: the last kernel on the stream (all streams;
  the recorded event's kernel) → the end of the CPU call that waited (``sync``, weight 0 in HTA;
  the default mode weighs the call's return after that work).

The longest path is the classic dynamic programme over a topological order (linear in nodes and
edges; HTA calls networkx). Ties are broken as networkx does (first edge added, earliest end), so
the path is HTA's, not only its length. Each weighted edge is *attributed* to an event (HTA's
rule: the event it lies in; a gap between two children to their parent) and classified:
``cpu``, ``data_loading``, ``launch_overhead``, ``kernel_gap``, ``gpu_compute``, ``gpu_memory``,
``communication``, and (default mode) ``sync_wait``: a blocking call's time while the device ran
nothing the trace shows (HTA's ``gpu_compute_bound`` is ``gpu_compute`` + ``gpu_memory`` her

The package, stage by stage: :mod:`.rows` (the columns over HTA's kept rows, the windows),
:mod:`.graph` (nodes and the edge store), :mod:`.host_edges` (the runtime lock, the nesting walk,
hand-offs between threads), :mod:`.launches` (queue lengths and launch bookkeeping over the whole
trace), :mod:`.device_edges` (kernels, launch delays, gaps, syncs), :mod:`.longest` (the longest
path), :mod:`.attribution` (what each path edge is attributed to and what bounds it),
:mod:`.summary` (a rank's steps summarised); :mod:`.analyse` runs them for one window and
:mod:`.model` holds the vocabulary and the result types.
"""


from stepscope.analysis.trace.critical_path.analyse import critical_path, step_paths
from stepscope.analysis.trace.critical_path.rows import step_windows
from stepscope.analysis.trace.critical_path.model import (BETWEEN_OPS, BLOCKING_CALLS, BOUND_KINDS, BOUND_LABELS, COMM, CPU,
                                                          DATA_LOADING, DEPENDENCY, DIFFERENCES, GAP, GPU_COMPUTE, GPU_MEMORY,
                                                          GRAPH_LAUNCH_CALLS, HTA_BOUND, HTA_EDGE_TYPES, KERNEL_GAP,
                                                          KERNEL_GAP_LIMIT_US, KERNEL_LAUNCH_CALLS, LAUNCH, LAUNCH_CALLS,
                                                          LAUNCH_OVERHEAD, OPERATOR, RUNTIME_LOCK_CALLS, SYNC, SYNC_WAIT,
                                                          WAIT, WAIT_WORTH_NAMING_US, CriticalPath, PathEdge, Segment)
from stepscope.analysis.trace.critical_path.summary import (DEFAULT_PATH_STEPS, PathSpan, PathSummary, StepPath, chosen_steps,
                                                            path_summary, segments)

__all__ = [
    "BETWEEN_OPS", "BLOCKING_CALLS", "BOUND_KINDS", "BOUND_LABELS", "COMM", "CPU", "DATA_LOADING", "DEFAULT_PATH_STEPS",
    "DEPENDENCY", "DIFFERENCES", "GAP", "GPU_COMPUTE", "GPU_MEMORY", "GRAPH_LAUNCH_CALLS", "HTA_BOUND", "HTA_EDGE_TYPES",
    "KERNEL_GAP", "KERNEL_GAP_LIMIT_US", "KERNEL_LAUNCH_CALLS", "LAUNCH", "LAUNCH_CALLS", "LAUNCH_OVERHEAD", "OPERATOR",
    "RUNTIME_LOCK_CALLS", "SYNC", "SYNC_WAIT", "WAIT", "WAIT_WORTH_NAMING_US", "CriticalPath", "PathEdge", "PathSpan",
    "PathSummary", "Segment", "StepPath", "chosen_steps", "critical_path", "path_summary", "segments", "step_paths",
    "step_windows",
]
