"""Device idle time attributed to the host's activity: exact hand-made cases and the ResNet sample."""

from __future__ import annotations

import pytest
from reference_traces import SKIP, TRACES, analysis, kineto_trace_names
from trace_builders import kernel, op, runtime, table_of

from stepscope.analysis.trace.idle_causes import idle_causes
from stepscope.analysis.trace.rank_analysis import rank_evidence
from stepscope.analysis.trace.temporal import temporal_breakdown
from stepscope.traces.links import links_of
from stepscope.traces.timeline import timeline_of

RESNET_0 = "kineto_tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _trace():
    return table_of(
        # busy 0-10, idle 10-100 (90 µs), busy 100-110, idle 110-200 (90 µs), busy 200-210
        op("aten::mm", 0, 5, external_id=1),
        runtime("cudaLaunchKernel", 1, 2, correlation=1, external_id=1),
        kernel("k1", 0, 10, correlation=1),
        op(LOADER, 10, 40, cat="user_annotation"),  # 10-50: data loading
        op("aten::collate", 15, 10, external_id=9),  # inside the loader: still the loader's
        runtime("cudaDeviceSynchronize", 50, 20, correlation=50),  # 50-70: sync
        op("aten::relu", 80, 15, external_id=2),  # 80-95: issues k2 -> launch
        runtime("cudaLaunchKernel", 90, 10, correlation=2, external_id=2),  # 90-100 (inside the op)
        kernel("k2", 100, 10, correlation=2),
        op("[stepscope]dataloader_next", 110, 30, cat="user_annotation"),  # 110-140: loader (ours)
        runtime("cudaStreamSynchronize", 130, 20, correlation=60),  # 140-150 only (130-140 is the loader's)
        runtime("cudaMemsetAsync", 160, 5, correlation=3),  # 160-165: launch
        kernel("Memset (Device)", 200, 10, correlation=3, cat="gpu_memset"),
    )


def test_idle_causes_partition_hand_made():
    table = _trace()
    causes = idle_causes(links_of(table))
    assert causes is not None
    assert causes.idle_us == 180.0 and causes.kernel_time_us == 210.0 and causes.gaps == 2
    assert causes.dataloader_us == 40.0 + 30.0
    assert causes.sync_us == 20.0 + 10.0
    assert causes.launch_us == 20.0 + 5.0  # aten::relu 80-95 and its launch to 100; the memset launch
    assert causes.other_us == 180.0 - 70.0 - 30.0 - 25.0  # 70-80 and 165-200
    parts = causes.dataloader_us + causes.sync_us + causes.launch_us + causes.other_us
    assert parts == pytest.approx(causes.idle_us)
    temporal = temporal_breakdown(timeline_of(links_of(table)), 0)
    assert temporal is not None and causes.idle_us == temporal.idle_us
    assert causes.share("dataloader") == pytest.approx(70.0 / 210.0)


def test_host_only_operator_is_not_launch():
    table = table_of(
        kernel("k1", 0, 10, correlation=1),
        op("aten::cpu_work", 20, 50, external_id=5),  # issues nothing: "other"
        kernel("k2", 100, 10, correlation=2),
    )
    causes = idle_causes(links_of(table))
    assert causes is not None
    assert (causes.dataloader_us, causes.sync_us, causes.launch_us, causes.other_us) == (0.0, 0.0, 0.0, 90.0)


def test_no_gpu_rows_means_no_attribution():
    assert idle_causes(links_of(table_of(op("aten::add", 0, 10)))) is None


@SKIP
@pytest.mark.parametrize("rel", kineto_trace_names())
def test_idle_causes_add_up_to_idle_share(rel):
    item = analysis(rel)
    evidence = rank_evidence(item)
    if item.temporal is None:
        assert item.idle_causes is None and evidence.idle.dataloader is None
        return
    total = sum(
        getattr(evidence.idle, f) for f in ("dataloader", "sync", "launch", "other")
    )
    assert total == pytest.approx(evidence.idle.share, abs=1e-9)


@pytest.mark.skipif(not (TRACES / RESNET_0).is_file(), reason="reference traces absent")
def test_resnet_num_workers_0_idles_in_the_dataloader():
    evidence = rank_evidence(analysis(RESNET_0))
    assert evidence.idle.share == pytest.approx(0.394, abs=0.001)
    assert evidence.idle.dataloader == pytest.approx(0.287, abs=0.001)
    assert evidence.idle.dataloader > 0.7 * evidence.idle.share  # the main cause by far
    assert evidence.idle.sync < 0.001
