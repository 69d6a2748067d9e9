"""The device seqmem measures on: a real GPU, or the emulated device on CPU.

The emulated device puts every CPU tensor in a bounded BFC arena
(`TF_CPU_ALLOCATOR_USE_BFC`, `TF_CPU_BFC_MEM_LIMIT_IN_MB`): going over the
budget raises a real ResourceExhaustedError and TensorFlow reports current and
peak bytes. oneDNN is switched off (`TF_ENABLE_ONEDNN_OPTS=0`) because its
kernels crash the process when that arena is full. These variables are read
once, when TensorFlow starts, so each budget needs a fresh process:
`run_with_budget` runs a callable in one and returns its result or a verdict.
It forks that process from a server that has imported TensorFlow
(`runtime.fork_server`), which saves the import's 4 s per process.

One compute stream (`one_stream=True`, the default): TensorFlow's executor
gets one inter-op thread, so it runs one op at a time, as a GPU's single
compute stream runs kernels one after another, and the simulator follows its
order (`sim.schedule.executor_order`); `optimize` pins its planned order into
the steps it rewrites (`rewrite.pin`). Intra-op threads (inside one kernel) are
left as they are. It does not model a GPU's copy engines running beside the
compute stream: on the emulated device a swap is computed by the same threads.
`one_stream=False` keeps TensorFlow's inter-op pool, which runs independent ops
at once, in an order, and so with a peak, that varies from step to step.

The arena: TensorFlow builds the CPU BFC arena in growth mode, regions of 2, 4,
8, ... MiB opened as nothing free fits, so where region boundaries fall depends
on everything the process allocated before. `reserved_arena=True` reserves it
up front instead (`reserve_arena`): the 2 MiB region the process's first
allocation opens, and one region of all the rest, as a GPU's arena is by
default (`allow_growth` off). The simulator's allocator model follows the
process's setting (`StepAnalysis.arena_reserved`).

This module does not import TensorFlow at import time.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import tempfile
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from seqmem.errors import InfeasibleBudgetError, TensorFlowAlreadyInitializedError
from seqmem.runtime import fork_server, stall_watch

__all__ = [
    "BudgetRun",
    "MemoryStats",
    "apply_thread_settings",
    "check_budget_mb",
    "configure_emulated_device",
    "emulated_budget_mb",
    "emulated_device_env",
    "memory_device",
    "measuring_device_present",
    "memory_stats",
    "on_device",
    "reset_peak",
    "run_with_budget",
]

_ENV_BFC = "TF_CPU_ALLOCATOR_USE_BFC"
_ENV_LIMIT = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
_ENV_ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
_ENV_INTER_OP = "SEQMEM_INTER_OP_THREADS"  # read by `apply_thread_settings`, not by TensorFlow
_ENV_RESERVED_ARENA = "SEQMEM_RESERVED_ARENA"  # read by `reserve_arena`, not by TensorFlow
_SEQMEM_SETTINGS = (_ENV_INTER_OP, _ENV_RESERVED_ARENA)


def emulated_device_env(budget_mb: int, one_stream: bool = True, reserved_arena: bool = False) -> dict[str, str]:
    """Environment variables that make the CPU an emulated device of `budget_mb` MiB.

    one_stream: run one op at a time (see the module docstring); False keeps
    TensorFlow's default inter-op thread pool.
    reserved_arena: reserve the arena up front instead of growing it (see the module docstring).
    """
    check_budget_mb(budget_mb)
    env = {
        _ENV_BFC: "true",
        _ENV_LIMIT: str(int(budget_mb)),
        _ENV_ONEDNN: "0",
    }
    if one_stream:
        env[_ENV_INTER_OP] = "1"
    if reserved_arena:
        env[_ENV_RESERVED_ARENA] = "1"
    return env


def fresh_process_env(budget_mb: int, one_stream: bool = True, reserved_arena: bool = False) -> dict[str, str]:
    """This process's environment as a fresh process on an emulated device of `budget_mb` MiB takes it
    (`run_with_budget`; `fork_server.run_forked`): this one's emulated-device settings replaced."""
    env = {name: value for name, value in os.environ.items() if name not in _SEQMEM_SETTINGS}
    env.update(emulated_device_env(budget_mb, one_stream, reserved_arena))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the child's stderr is kept only for a crash's message
    return env


def apply_thread_settings() -> None:
    """Give TensorFlow the emulated device's inter-op thread count, if this process was configured with one.

    Must run before TensorFlow runs its first op; does nothing in a process not configured with one.
    """
    threads = os.environ.get(_ENV_INTER_OP)
    if not threads:
        return
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(int(threads))  # a no-op when already set


_arena_reserved = False


def reserve_arena() -> None:
    """Reserve the emulated device's arena, if this process was configured with `reserved_arena`: one
    block of the whole budget less the 2 MiB region its shape tensor opens, allocated unwritten and freed.

    Must run before anything else allocates on the device; does nothing otherwise, or a second time.
    """
    global _arena_reserved
    budget_mb = emulated_budget_mb()
    if _arena_reserved or budget_mb is None or not os.environ.get(_ENV_RESERVED_ARENA):
        return
    import tensorflow as tf

    if budget_mb > 2:  # an arena of 2 MiB or less is its first region alone
        block = tf.raw_ops.Empty(shape=[budget_mb - 2, 1 << 20], dtype=tf.uint8)
        del block
    _arena_reserved = True


def arena_reserved() -> bool:
    """Whether `reserve_arena` reserved this process's arena up front."""
    return _arena_reserved


def check_budget_mb(value: Any, name: str = "budget_mb") -> float:
    """`value` if it is a positive, finite number of MiB; ValueError naming `name` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a positive number of MiB (finite), got {value!r}")
    return value


def available_host_bytes() -> int | None:
    """Host memory available to new allocations now (Linux' MemAvailable, bytes); None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def configure_emulated_device(budget_mb: int, one_stream: bool = True, reserved_arena: bool = False,
                              reserve: bool = True) -> None:
    """Make this process's CPU an emulated device with `budget_mb` MiB of memory.

    one_stream: one op at a time; reserved_arena: the arena reserved up front (see the module docstring;
    both import TensorFlow to take effect). reserve: reserve it now, which runs an op and so starts
    TensorFlow's context; False leaves the reservation to a later `reserve_arena`, after what must come
    before the first op (a `tf.distribute` strategy's collectives). Must run before TensorFlow is imported. Raises
    TensorFlowAlreadyInitializedError if TensorFlow is already loaded with other settings (use
    `run_with_budget`, which starts a fresh process), ValueError for a non-positive budget.
    """
    wanted = emulated_device_env(budget_mb, one_stream, reserved_arena)
    if "tensorflow" in sys.modules:
        if all(os.environ.get(k) == wanted.get(k) for k in (*wanted, *_SEQMEM_SETTINGS)):
            apply_thread_settings()  # a process forked with these settings (`fresh_process_env`) before its first op
            if reserve:
                reserve_arena()
            return
        raise TensorFlowAlreadyInitializedError(
            "TensorFlow is already imported in this process, so the emulated device's memory limit can no "
            "longer take effect; call configure_emulated_device() before importing tensorflow, or use "
            "seqmem.runtime.device.run_with_budget() to run in a fresh process"
        )
    for setting in _SEQMEM_SETTINGS:
        os.environ.pop(setting, None)
    os.environ.update(wanted)
    apply_thread_settings()
    if reserve:
        reserve_arena()


def emulated_budget_mb() -> int | None:
    """The emulated device's budget in MiB if this process was configured with one, else None."""
    if os.environ.get(_ENV_BFC, "").lower() not in ("true", "1"):
        return None
    limit = os.environ.get(_ENV_LIMIT)
    return int(limit) if limit and limit.isdigit() else None


def measuring_device_present() -> bool:
    """Whether this process can measure device memory (the emulated device or a GPU)."""
    if emulated_budget_mb() is not None:
        return True
    import tensorflow as tf

    return bool(tf.config.list_logical_devices("GPU"))


@dataclass(frozen=True)
class MemoryStats:
    """Bytes in use now and at the highest point since the last reset, on `device`."""

    device: str
    current_bytes: int
    peak_bytes: int


def memory_device() -> str:
    """The device seqmem measures: "GPU:0" when a GPU is visible, else "CPU:0"."""
    import tensorflow as tf

    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def memory_stats(device: str | None = None) -> MemoryStats:
    """Current and peak bytes on `device` (default `memory_device()`).

    Raises RuntimeError when the CPU is not an emulated device (no BFC arena to read).
    """
    import tensorflow as tf

    device = device or memory_device()
    if device.startswith("CPU") and emulated_budget_mb() is None:
        raise RuntimeError(
            "CPU memory is only measured on the emulated device: call "
            "seqmem.runtime.device.configure_emulated_device(budget_mb) before importing tensorflow"
        )
    info = tf.config.experimental.get_memory_info(device)
    return MemoryStats(device=device, current_bytes=int(info["current"]), peak_bytes=int(info["peak"]))


def reset_peak(device: str | None = None) -> None:
    """Make the peak equal to the bytes in use now, on `device` (default `memory_device()`)."""
    import tensorflow as tf

    tf.config.experimental.reset_memory_stats(device or memory_device())


def on_device(array: Any) -> Any:
    """A tensor of `array` (a NumPy array or anything `np.asarray` takes) in a buffer of the device's own.

    `tf.constant` of a NumPy array sometimes keeps the array's own buffer, outside the emulated device's
    arena, and sometimes copies it in, so the same step's peak would differ from process to process.
    Parsing a serialized copy always allocates the tensor on the device, as a GPU's inputs are copied to it.
    """
    import numpy as np
    import tensorflow as tf

    array = np.asarray(array)
    serialized = tf.make_tensor_proto(array).SerializeToString()
    return tf.io.parse_tensor(serialized, out_type=tf.as_dtype(array.dtype))


@dataclass(frozen=True)
class BudgetRun:
    """Outcome of `run_with_budget`.

    verdict: "ok" (value holds the result), "oom" (ResourceExhaustedError, or
    the process sat idle: an allocation waiting for memory that nothing frees,
    see `stall_watch`), "infeasible" (seqmem's InfeasibleBudgetError: no plan
    fits; message is the error's, the smallest peak and the op that sets it),
    "error" (another exception; message has its traceback), "crashed" (the
    process died, e.g. a segfault), or "timeout".
    """

    verdict: str
    value: Any = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


def run_with_budget(
    function: Callable[..., Any],
    *args: Any,
    budget_mb: int,
    timeout_s: float = 600.0,
    one_stream: bool = True,
    stall_s: float | None = None,
    reserved_arena: bool = False,
    **kwargs: Any,
) -> BudgetRun:
    """Run `function(*args, **kwargs)` in a fresh process on an emulated device of `budget_mb` MiB.

    one_stream: one op at a time; reserved_arena: the arena reserved up front (see the module docstring).
    stall_s: stop the process once it has sat idle this many seconds and
    report "oom" (a step waiting on a full arena, in seconds instead of the
    allocator's 10 s per waiting allocation). Only for jobs in which nothing
    else could free memory while a step waits (no input pipeline, no other
    threads): then a stall is an OOM. None (the default) waits for TensorFlow.
    `function` must be importable by module and name (a module-level function),
    and its arguments and result picklable. Never raises for what happens in the
    child: an OOM, an exception, a crash or a timeout each come back as a verdict.
    Raises RuntimeError if the fork server the child comes from cannot start.
    """
    env = fresh_process_env(budget_mb, one_stream, reserved_arena)
    with tempfile.TemporaryDirectory(prefix="seqmem-budget-") as workdir:
        job_path, result_path = os.path.join(workdir, "job.pkl"), os.path.join(workdir, "result.pkl")
        with open(job_path, "wb") as job:
            pickle.dump((function, args, kwargs, stall_s), job)
        with stall_watch.expected_idle():
            exit_status = fork_server.run_forked("seqmem.runtime.device:_worker", (job_path, result_path), env,
                                                 workdir, timeout_s)
        if exit_status is None:
            return BudgetRun("timeout", message=f"no result within {timeout_s:.0f} s")
        if os.path.exists(result_path):
            with open(result_path, "rb") as result:
                return pickle.load(result)
        stderr_path = os.path.join(workdir, "stderr")  # none if the child died before it took its streams
        tail = ""
        if os.path.exists(stderr_path):
            with open(stderr_path, "rb") as stderr:
                tail = stderr.read().decode(errors="replace")[-2000:]
        return BudgetRun("crashed", message=f"exit status {_exit_status(exit_status)}\n{tail}")


def _exit_status(code: int) -> str:
    """"-11 (SIGSEGV)" for a process killed by a signal, the code alone otherwise."""
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return str(code)


def _worker(job_path: str, result_path: str) -> None:
    """Child side of `run_with_budget`: run the job, write the verdict atomically: the job's, or the stall
    watch's, which ends the process (the job's verdict is written only after the watch has stopped)."""
    with open(job_path, "rb") as job:
        function, args, kwargs, stall_s = pickle.load(job)
    import tensorflow as tf

    apply_thread_settings()
    reserve_arena()

    def stalled(idle_s: float) -> None:
        _write_result(result_path, _stall_verdict(idle_s))
        os._exit(0)  # the job's thread is stuck in TensorFlow: no clean way out

    with contextlib.ExitStack() as stack:
        if stall_s is not None:
            stack.enter_context(stall_watch.StallWatch(stalled, idle_s=stall_s))
        try:
            outcome = BudgetRun("ok", value=function(*args, **kwargs))
        except tf.errors.ResourceExhaustedError as error:
            outcome = BudgetRun("oom", message=str(error).splitlines()[0][:500])
        except InfeasibleBudgetError as error:
            outcome = BudgetRun("infeasible", message=" ".join(str(error).split())[:4000])
        except Exception:  # noqa: BLE001 - every failure is reported to the parent as a verdict
            outcome = BudgetRun("error", message=traceback.format_exc()[-4000:])
    _write_result(result_path, outcome)


def _stall_verdict(idle_s: float) -> BudgetRun:
    """The verdict on a child that sat idle `idle_s` seconds: out of memory (what a stall is, in these jobs)."""
    try:
        in_use = f"{memory_stats('CPU:0').current_bytes / (1 << 20):.1f} MB"
    except Exception:  # noqa: BLE001 - the verdict must be written whatever TensorFlow says
        in_use = "an unknown amount"
    return BudgetRun("oom", message=(
        f"stopped after {idle_s:.1f} s idle with {in_use} of the {emulated_budget_mb()} MB arena in use: an "
        f"allocation waiting for memory that nothing frees (seqmem.runtime.stall_watch)"))


def _write_result(result_path: str, outcome: BudgetRun) -> None:
    try:
        payload = pickle.dumps(outcome)
    except Exception:  # noqa: BLE001 - an unpicklable result is reported, not lost
        payload = pickle.dumps(BudgetRun("error", message="result is not picklable:\n" + traceback.format_exc()[-2000:]))
    partial = result_path + ".partial"
    with open(partial, "wb") as result:
        result.write(payload)
    os.replace(partial, result_path)
