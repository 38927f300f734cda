"""The linked-events table: roles, correlation links, HTA's view and step assignment, once per trace."""

from __future__ import annotations

from trace_builders import kernel, op, runtime, table_of

from stepscope.traces.links import COMPUTATION, KERNEL, MEMCPY, MEMORY, OPERATOR, RUNTIME, STEP, links_of


def _trace():
    return table_of(
        op("ProfilerStep#3", 0, 100, cat="user_annotation"),  # 0
        op("aten::mm", 10, 20, external_id=1),  # 1
        runtime("cudaLaunchKernel", 12, 5, correlation=7, external_id=1),  # 2
        kernel("gemm", 40, 30, correlation=7),  # 3
        op("ProfilerStep#4", 100, 100, cat="user_annotation"),  # 4
        runtime("cudaMemcpyAsync", 150, 5, correlation=8),  # 5
        kernel("Memcpy HtoD (Pageable -> Device)", 160, 5, correlation=8, cat="gpu_memcpy"),  # 6
        runtime("cudaLaunchKernel", 250, 5, correlation=9),  # 7: after every step
        kernel("late", 260, 5, correlation=9),  # 8
    )


def test_roles_links_and_steps():
    table = _trace()
    links = links_of(table)
    assert links is links_of(table)  # computed once, cached on the table
    assert links.role.tolist() == [STEP, OPERATOR, RUNTIME, KERNEL, STEP, RUNTIME, MEMCPY, RUNTIME, KERNEL]
    assert links.step_number[[0, 4]].tolist() == [3, 4]
    assert links.launcher.tolist() == [-1, -1, -1, 2, -1, -1, 5, -1, 7]
    assert links.step.tolist() == [0, 0, 0, 0, 1, 1, 1, -1, -1]
    assert links.ktype[3] == COMPUTATION and links.ktype[6] == MEMORY and links.ktype[1] == 0
    assert links.rows(KERNEL).tolist() == [3, 8]
    assert links.name_is(lambda s: "Pageable" in s).tolist() == [False] * 6 + [True, False, False]


def test_hta_view_drops_the_last_step_and_links_gpu_rows_to_their_host_row():
    table = _trace()
    hta = links_of(table).hta
    # two ProfilerStep names: host rows from the last step's start on are dropped, with their GPU rows
    assert hta.filtered and hta.index.tolist() == [0, 1, 2, 3]
    assert hta.cpu_link.tolist() == [-1, -1, -1, 2]


def test_plugin_keeps_the_last_runtime_of_a_repeated_correlation():
    table = table_of(
        runtime("cudaLaunchKernel", 0, 2, correlation=5),
        runtime("cudaLaunchKernel", 3, 2, correlation=5),
        kernel("k", 10, 2, correlation=5),
    )
    assert links_of(table).launcher.tolist() == [-1, -1, 1]
    assert links_of(table).hta.cpu_link.tolist() == [-1, -1, 0]  # HTA: the first one
