import os
import time

import pytest

from seqmem.errors import TensorFlowAlreadyInitializedError
from seqmem.runtime import device, fork_server


def allocate_mb(megabytes):
    import tensorflow as tf

    tensor = tf.ones([megabytes * 1024 * 256])
    stats = device.memory_stats()
    return float(tf.reduce_sum(tensor)), stats.peak_bytes


def inter_op_threads():
    import tensorflow as tf

    return tf.config.threading.get_inter_op_parallelism_threads()


def raise_value_error():
    raise ValueError("boom")


def raise_infeasible():
    from seqmem.errors import InfeasibleBudgetError

    raise InfeasibleBudgetError("smallest achievable peak is 9.0 MB (Op 'x');\nbudget was 8.0 MB", 9 << 20)


def crash():
    os.abort()


def allocate_nearly_the_budget_after_small_tensors(budget_mb):
    import tensorflow as tf

    freed = tf.ones([5 * 1024 * 256])  # 5 MiB: in a growing arena, a region of 8 MiB
    del freed
    kept = tf.ones([1024 * 256])  # 1 MiB, given the first region's free chunk (under twice that) whole
    total = float(tf.reduce_sum(kept))
    block = tf.raw_ops.Empty(shape=[budget_mb - 4, 1 << 20], dtype=tf.uint8)
    return device.arena_reserved(), int(block.shape[0]), total


def arrays_put_on_device():
    """For views of one NumPy buffer at every 4-byte offset up to 64 (aligned or not): bytes the arena gained
    for each, and whether each tensor's values, shape and dtype are the view's."""
    import numpy as np

    base = np.arange(50_000 + 16, dtype=np.float32)
    kept, gained, equal = [], [], []
    for offset in range(16):
        view = base[offset:offset + 50_000]
        before = device.memory_stats().current_bytes
        tensor = device.on_device(view)
        gained.append(device.memory_stats().current_bytes - before)
        equal.append(tensor.dtype.as_numpy_dtype == view.dtype and np.array_equal(tensor.numpy(), view))
        kept.append(tensor)
    return gained, equal


@pytest.mark.device
def test_on_device_always_puts_an_array_in_the_arena():
    run = device.run_with_budget(arrays_put_on_device, budget_mb=64)
    assert run.ok, run.message
    gained, equal = run.value
    assert all(equal)
    assert all(bytes_ >= 200_000 for bytes_ in gained), gained  # with tf.constant, some views stay outside


@pytest.mark.device
def test_run_with_budget_reports_ok_and_oom():
    ok = device.run_with_budget(allocate_mb, 8, budget_mb=64)
    assert ok.verdict == "ok"
    assert ok.value[0] == 8 * 1024 * 256
    assert ok.value[1] >= 8 << 20
    raised = device.run_with_budget(allocate_mb, 128, budget_mb=64)  # TensorFlow gives up
    assert raised.verdict == "oom" and "OOM" in raised.message
    stalled = device.run_with_budget(allocate_mb, 128, budget_mb=64, stall_s=2)  # stopped while the allocator waits
    assert stalled.verdict == "oom" and "idle" in stalled.message and "64 MB arena" in stalled.message


@pytest.mark.device
def test_each_forked_run_starts_a_fresh_arena_with_its_own_budget():
    small = device.run_with_budget(allocate_mb, 100, budget_mb=64, stall_s=2)
    large = device.run_with_budget(allocate_mb, 100, budget_mb=256)  # forked from the same server
    after = device.run_with_budget(allocate_mb, 8, budget_mb=64)
    assert small.verdict == "oom" and large.ok and after.ok
    assert large.value[1] >= 100 << 20 and (8 << 20) <= after.value[1] < (16 << 20)  # none of the run before


def test_a_job_with_onednn_on_is_refused_before_it_is_forked(tmp_path):
    # the fork server imported TensorFlow with oneDNN off, which TensorFlow reads on import
    env = {**device.emulated_device_env(64), "TF_ENABLE_ONEDNN_OPTS": "1"}
    with pytest.raises(RuntimeError, match="TF_ENABLE_ONEDNN_OPTS=0"):
        fork_server.run_forked("os:getpid", (), env, str(tmp_path), timeout_s=5)
    assert not list(tmp_path.iterdir())


@pytest.mark.device
def test_run_with_budget_reports_errors_and_crashes_without_raising():
    error = device.run_with_budget(raise_value_error, budget_mb=64)
    assert error.verdict == "error" and "ValueError: boom" in error.message
    infeasible = device.run_with_budget(raise_infeasible, budget_mb=64)  # no plan fits: said in one line
    assert infeasible.verdict == "infeasible"
    assert infeasible.message == "smallest achievable peak is 9.0 MB (Op 'x'); budget was 8.0 MB"
    crashed = device.run_with_budget(crash, budget_mb=64)
    assert crashed.verdict == "crashed" and crashed.message.startswith("exit status -6 (SIGABRT)")


@pytest.mark.device
def test_a_job_past_its_timeout_is_killed_and_the_next_one_runs():
    late = device.run_with_budget(time.sleep, 60, budget_mb=64, timeout_s=3)
    assert late.verdict == "timeout" and "3 s" in late.message
    assert device.run_with_budget(inter_op_threads, budget_mb=64).ok


@pytest.mark.device
def test_one_stream_by_default_runs_one_op_at_a_time():
    assert device.run_with_budget(inter_op_threads, budget_mb=64).value == 1
    assert device.run_with_budget(inter_op_threads, budget_mb=64, one_stream=False).value == 0  # TF's own pool


@pytest.mark.device
def test_a_reserved_arena_lets_one_tensor_take_nearly_all_of_it_after_others():
    # grown instead, the arena's regions of 2 and 8 MiB leave 54 MiB for a 60 MiB tensor
    run = device.run_with_budget(allocate_nearly_the_budget_after_small_tensors, 64, budget_mb=64, reserved_arena=True)
    assert run.ok, run.message
    assert run.value == (True, 60, 1024 * 256)
    grown = device.run_with_budget(allocate_nearly_the_budget_after_small_tensors, 64, budget_mb=64, stall_s=2)
    assert grown.verdict == "oom"


def test_one_stream_is_part_of_the_emulated_device_environment():
    assert device.emulated_device_env(64)["SEQMEM_INTER_OP_THREADS"] == "1"
    assert "SEQMEM_INTER_OP_THREADS" not in device.emulated_device_env(64, one_stream=False)
    assert device.emulated_device_env(64, reserved_arena=True)["SEQMEM_RESERVED_ARENA"] == "1"
    assert "SEQMEM_RESERVED_ARENA" not in device.emulated_device_env(64)


@pytest.mark.parametrize("budget", [0, -5, float("nan"), "12", True])
def test_bad_budgets_are_rejected(budget):
    with pytest.raises(ValueError, match="positive number"):
        device.emulated_device_env(budget)


def test_configure_after_tensorflow_import_is_refused():
    import tensorflow  # noqa: F401 - the point is that TensorFlow is loaded

    with pytest.raises(TensorFlowAlreadyInitializedError, match="run_with_budget"):
        device.configure_emulated_device(100)


def test_memory_stats_refuses_plain_cpu(monkeypatch):
    for name in [name for name in os.environ if name.startswith("TF_CPU_")]:
        monkeypatch.delenv(name)
    with pytest.raises(RuntimeError, match="emulated device"):
        device.memory_stats("CPU:0")


def server_forked_from():
    return os.environ.get("SEQMEM_FORK_SERVER")


def servers_seen_by_a_job_that_runs_a_job():
    """In a worker: (the server it was forked from, its nested job's, whether the worker started one)."""
    nested = device.run_with_budget(server_forked_from, budget_mb=64)
    return os.environ["SEQMEM_FORK_SERVER"], nested.value, fork_server._server is not None


@pytest.mark.device
def test_a_workers_own_jobs_are_forked_by_the_server_that_forked_it():
    run = device.run_with_budget(servers_seen_by_a_job_that_runs_a_job, budget_mb=64)
    assert run.ok, run.message
    socket_path, nested_socket_path, started_its_own = run.value
    assert socket_path == nested_socket_path == fork_server._socket_path and not started_its_own
    with fork_server._lock:  # a server that is gone leaves no folder behind, and the next job starts another
        fork_server._stop()
    assert not os.path.exists(os.path.dirname(socket_path))
    assert device.run_with_budget(inter_op_threads, budget_mb=64).ok and fork_server._socket_path != socket_path


def sleep_s(seconds: str) -> None:
    time.sleep(float(seconds))


def requests_a_long_job_then_ends(pid_path):
    """In a worker: ask for a job that sleeps a minute, write its pid to `pid_path` once it runs, and end
    without waiting for it."""
    import threading

    folder = os.path.join(os.path.dirname(pid_path), "job")
    os.mkdir(folder)
    threading.Thread(target=fork_server.run_forked, daemon=True,
                     args=("tests.runtime.test_device:sleep_s", ("60",), dict(os.environ), folder, 120)).start()
    while not os.path.exists(os.path.join(folder, "pid")):
        time.sleep(0.02)
    with open(os.path.join(folder, "pid")) as pid, open(pid_path, "w") as out:
        out.write(pid.read())
    os._exit(0)


@pytest.mark.device
def test_a_job_whose_requester_ended_is_killed(tmp_path):
    run = device.run_with_budget(requests_a_long_job_then_ends, str(tmp_path / "pid"), budget_mb=64)
    assert run.verdict == "crashed"  # it ended without a result, as it meant to
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 5
    while fork_server._alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not fork_server._alive(pid)  # killed long before its minute
