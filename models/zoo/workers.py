"""The zoo's data-parallel step: two `MultiWorkerMirroredStrategy` workers on this machine.

    python -m models.zoo.workers [--model mobilenet_v2] [--batch 32] [--budget-mb 60] [--steps 3] [--workers 2]
                                 [--reserved-arena]

Two worker processes (or `--workers`), each forked from
seqmem's fork server, joined by `TF_CONFIG` on 127.0.0.1, each with its own
emulated device of `--arena-mb` MiB (one inter-op thread, op determinism;
reserved up front, as a GPU's arena, with `--reserved-arena`).
Each builds the same model under the strategy (same seed: a Keras image model,
or `nmt`, the NMT benchmark's LSTM encoder-decoder with tfa attention), draws
its own `--batch` examples (seeded by its index), and trains a `tf.function` calling
`strategy.run` (gradients all-reduced across the workers) for `--steps` calls:
as written, or, with `--budget-mb`, through `seqmem.optimize` under
`strategy.scope()`. Prints one JSON line per worker: the fields of the zoo's
jobs (`models.zoo.jobs`: losses, peaks, a digest of the variables; the
prediction and loss found; for an optimized run the plan's digest, decisions
and `optimize` seconds), or the error a worker stopped with.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import socket
import sys
import tempfile
import traceback
from typing import Any, Callable, Optional, Sequence

__all__ = ["FAMILY", "MODELS", "NMT_SHAPE", "STEPS", "run_model", "run_workers"]

MODELS = ("mobilenet_v2", "resnet50", "small_cnn", "nmt")
NMT_SHAPE = (30, 128, 1000)  # the NMT step's sentence length, units and vocabulary
FAMILY = "data parallel (2 MultiWorkerMirroredStrategy workers)"
STEPS = {"mobilenet_v2_2_workers": ("mobilenet_v2", 32)}  # the zoo's: name -> (model, images per worker)
_WORKERS = 2


def run_workers(model: str, batch: int, arena_mb: int, budget_mb: Optional[float], steps: int,
                hold_mb: Sequence[int] = (), timeout_s: float = 600, keras_fit: bool = False,
                workers: int = _WORKERS, reserved_arena: bool = False) -> list[dict[str, Any]]:
    """Run `workers` workers (see the module docstring; two by default), each a process forked from seqmem's
    fork server, and return each one's result, by index. hold_mb: MiB each worker allocates on its device
    after training (none by default), for one more call (to show what a worker that runs out of memory does
    to the other; `_call_holding`; every worker makes that call when any holds memory): its outcome in the
    result's "after_hold". A worker still running after `timeout_s` seconds is killed and reported as
    {"error": "timeout"}. reserved_arena: each worker's arena reserved up front (`seqmem.runtime.device`)."""
    from seqmem.runtime import device, fork_server

    hold_mb = list(hold_mb) or [0] * workers
    ports = _free_ports(workers)
    env = device.fresh_process_env(arena_mb, reserved_arena=reserved_arena)
    with tempfile.TemporaryDirectory() as folder:
        folders = [os.path.join(folder, f"worker{index}") for index in range(workers)]
        argvs = [["--worker", str(index), "--ports", ",".join(map(str, ports)), "--model", model, "--batch",
                  str(batch), "--arena-mb", str(arena_mb), "--steps", str(steps), "--hold-mb", str(hold_mb[index]),
                  "--out", os.path.join(folders[index], "result.json")]
                 + ([] if budget_mb is None else ["--budget-mb", str(budget_mb)]) + ["--call-holding"] * any(hold_mb)
                 + ["--keras-fit"] * keras_fit + ["--reserved-arena"] * reserved_arena for index in range(workers)]
        for path in folders:
            os.mkdir(path)

        def run(argv: list[str], path: str) -> Optional[int]:
            return fork_server.run_forked("models.zoo.workers:forked_worker", argv, env, path, timeout_s)

        with concurrent.futures.ThreadPoolExecutor(workers) as pool:  # a thread waits on each worker
            statuses = list(pool.map(run, argvs, folders))
        return [_result(status, path) for status, path in zip(statuses, folders)]


def _result(exit_status: Optional[int], folder: str) -> dict[str, Any]:
    """A worker's result from its job folder: what it wrote, or why there is none."""
    stderr = ""
    if os.path.exists(os.path.join(folder, "stderr")):
        with open(os.path.join(folder, "stderr"), errors="replace") as log:
            stderr = log.read()[-2000:]
    if exit_status is None:
        return {"error": "timeout", "message": stderr}
    if not os.path.exists(os.path.join(folder, "result.json")):
        return {"error": f"exit {exit_status}", "message": stderr}
    with open(os.path.join(folder, "result.json")) as file:
        return json.load(file)


def run_model(name: str, fraction: float, runs: int, steps: int, arena_mb: int = 4096,
              reserved_arena: bool = False) -> dict[str, Any]:
    """A zoo row (`models.zoo.__main__.run_model`'s form) for data-parallel step `name` (`STEPS`): the two
    workers as written in arenas of `arena_mb`, then `runs` times optimized to `fraction` of the higher of
    their peaks, in arenas of the budget itself (reserved up front with `reserved_arena`). Each outcome is
    both workers' (`_both`)."""
    model, batch = STEPS[name]
    original = _both(run_workers(model, batch, arena_mb, None, steps, reserved_arena=reserved_arena))
    row: dict[str, Any] = {"model": name, "family": FAMILY, "batch": batch, "original": original}
    if "peak_bytes" not in original:
        return row
    row["budget_mb"] = budget_mb = math.floor(fraction * original["peak_bytes"] / (1 << 20))
    row["optimized"] = [_both(run_workers(model, batch, budget_mb, budget_mb, steps, reserved_arena=reserved_arena))
                        for _ in range(runs)]
    return row


def _both(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Two workers' results as one: worker 0's, with the higher peak (of each call too) and, where they
    differ, digests that say so (a variable digest or plan digest of "workers differ"); the first worker's
    error, if any."""
    failed = [(index, result) for index, result in enumerate(results) if "error" in result or "infeasible" in result]
    if failed:
        index, result = failed[0]
        if "infeasible" in result:
            return result
        return {"verdict": result["error"], "message": f"worker {index}: {result.get('message', '')}"}
    merged = dict(results[0], peak_bytes=max(result["peak_bytes"] for result in results))
    if all("peaks" in result for result in results):
        merged["peaks"] = [max(call) for call in zip(*(result["peaks"] for result in results))]
    for key in ("digest", "plan_digest", "losses"):
        if len({str(result.get(key)) for result in results}) > 1:
            merged[key] = "workers differ"
    return merged


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _worker(index: int, ports: list[int], model: str, batch: int, arena_mb: int, budget_mb: Optional[float],
            steps: int, hold_mb: int, call_holding: bool, keras_fit: bool, reserved_arena: bool) -> dict[str, Any]:
    """One worker's run; the emulated device is configured before TensorFlow starts."""
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
                                          "task": {"type": "worker", "index": index}})
    from seqmem.runtime import device

    device.configure_emulated_device(arena_mb, reserved_arena=reserved_arena, reserve=False)
    import tensorflow as tf

    from models.zoo.jobs import analyzed, optimized_step, predicted, trained
    from models.zoo.steps import ZooStep

    tf.config.experimental.enable_op_determinism()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    device.reserve_arena()  # after the strategy, whose collectives are configured before the first op
    if keras_fit:
        with strategy.scope():
            network, optimizer = _model(model), tf.keras.optimizers.SGD(0.01, momentum=0.9)
            optimizer.build(network.trainable_variables)
        return _fitted(network, optimizer, strategy, batch, budget_mb, steps, device)
    task = _task(model, batch, index, strategy)

    def replica_step(*inputs):
        with tf.GradientTape() as tape:
            loss = task.loss(*inputs)
        gradients = tape.gradient(loss, task.trainable)
        task.optimizer.apply_gradients(zip(gradients, task.trainable))
        return loss

    @tf.function
    def step(*inputs):
        return strategy.reduce("SUM", strategy.run(replica_step, args=inputs), axis=None)

    built = ZooStep(step, task.inputs, task.variables)
    if budget_mb is None:
        analysis = analyzed(built)
        calls = trained(built, steps)
        result = {**predicted(built, analysis), **calls}  # after the calls that count: it calls the step twice more
    else:
        with strategy.scope():
            optimized, fields = optimized_step(built, budget_mb)
        if optimized is None:
            return fields
        built = optimized
        result = {**fields, **trained(built, steps)}
    if call_holding:
        result["after_hold"] = _call_holding(built.step, built.inputs, hold_mb)
    return result


def _fitted(network, optimizer, strategy, batch: int, budget_mb: Optional[float], steps: int, device) -> dict:
    """Keras `fit` of `network` for `steps` batches of `batch` images per worker (the same seeded data on
    every worker, which Keras shards), through `seqmem.keras.fit_within_budget` when `budget_mb` is given:
    the loss Keras logs after each batch, the peak, the variables' digest."""
    import numpy as np
    import tensorflow as tf

    from models.zoo.jobs import digest
    from seqmem.runtime.keras import fit_within_budget

    with strategy.scope():
        network.compile(optimizer, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if budget_mb is not None:
        fit_within_budget(network, budget_mb)
    rng = np.random.default_rng(0)
    count = batch * strategy.num_replicas_in_sync * steps
    data = tf.data.Dataset.from_tensor_slices((rng.standard_normal([count, 32, 32, 3]).astype(np.float32),
                                               rng.integers(0, 10, [count]).astype(np.int32)))
    losses = []
    record = tf.keras.callbacks.LambdaCallback(on_train_batch_end=lambda _, logs: losses.append(float(logs["loss"])))
    device.reset_peak()
    network.fit(data.batch(batch * strategy.num_replicas_in_sync), epochs=1, verbose=0, callbacks=[record])
    variables = tuple(network.variables) + tuple(optimizer.variables)
    return {"losses": losses, "peak_bytes": device.memory_stats().peak_bytes, "digest": digest(variables)}


def _call_holding(step, args: tuple, hold_mb: int) -> dict[str, str]:
    """One more call of `step` with `hold_mb` MiB more in use on the device: the error it (or, on the
    other worker, its collective) raised, or {} when it trained."""
    import tensorflow as tf

    held = [tf.zeros([1 << 20]) for _ in range(hold_mb // 4)]  # 4 MiB each: one block fits the arena's regions
    try:
        float(step(*args))
    except tf.errors.OpError as error:
        return {"error": type(error).__name__, "message": str(error)[:2000]}
    finally:
        del held
    return {}


@dataclasses.dataclass(frozen=True)
class _Task:
    """What a worker trains: `loss(*inputs)` of one replica (its share of the global mean), minimized over
    `trainable` by `optimizer`; `variables`: every variable the step changes (weights, optimizer slots)."""

    loss: Callable[..., Any]
    inputs: tuple
    trainable: list
    optimizer: Any
    variables: tuple


def _task(name: str, batch: int, index: int, strategy) -> _Task:
    """Model `name` built under `strategy` the same on every worker (seed 0), with worker `index`'s own
    `batch` examples: Keras images (32x32, 10 classes, SGD with momentum), or for "nmt" the NMT benchmark's
    model (`models.nmt`, tfa attention, Adam) on random sentences of `NMT_SHAPE`."""
    import numpy as np
    import tensorflow as tf

    from seqmem.runtime import device

    rng = np.random.default_rng(index)
    if name == "nmt":
        from models.nmt.model import NMTConfig, NMTModel, masked_mean

        time_steps, units, vocab = NMT_SHAPE
        tf.keras.utils.set_random_seed(0)
        with strategy.scope():
            network = NMTModel(NMTConfig(source_vocab=vocab, target_vocab=vocab, units=units, attention="tfa"))
            network.build_variables()
            optimizer = tf.keras.optimizers.Adam(1e-3)
            optimizer.build(network.trainable_variables)
        tokens = lambda: device.on_device(rng.integers(1, vocab, (batch, time_steps)).astype(np.int32))  # noqa: E731
        lengths = tf.fill([batch], time_steps)
        inputs = (tokens(), lengths, tokens(), tokens(), lengths)

        def loss(source, source_length, target_in, target_out, target_length):
            token_losses = network.token_losses(source, source_length, target_in, target_out)
            return masked_mean(token_losses, target_length) / strategy.num_replicas_in_sync
    else:
        with strategy.scope():
            network, optimizer = _model(name), tf.keras.optimizers.SGD(0.01, momentum=0.9)
            optimizer.build(network.trainable_variables)
        inputs = (device.on_device(rng.standard_normal([batch, 32, 32, 3]).astype(np.float32)),
                  device.on_device(rng.integers(0, 10, [batch]).astype(np.int32)))
        global_batch = batch * strategy.num_replicas_in_sync

        def loss(images, labels):
            logits = network(images, training=True)
            losses = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            return tf.reduce_sum(losses) / global_batch
    return _Task(loss, inputs, network.trainable_variables, optimizer,
                 tuple(network.variables) + tuple(optimizer.variables))


def _model(name: str):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    if name == "mobilenet_v2":
        return tf.keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None, classes=10,
                                                 classifier_activation=None)
    if name == "resnet50":
        return tf.keras.applications.ResNet50(input_shape=(32, 32, 3), weights=None, classes=10,
                                              classifier_activation=None)
    layers = tf.keras.layers
    return tf.keras.Sequential([layers.Input((32, 32, 3))]
                               + [layer for width in (32, 64, 64) for layer in
                                  (layers.Conv2D(width, 3, padding="same"), layers.BatchNormalization(),
                                   layers.ReLU())]
                               + [layers.GlobalAveragePooling2D(), layers.Dense(10)])


def forked_worker(*argv: str) -> None:
    """A worker in a process forked by `run_workers`: `main` with its hidden `--worker` arguments."""
    main(list(argv))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.zoo.workers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="mobilenet_v2")
    parser.add_argument("--batch", type=int, default=32, help="images per worker")
    parser.add_argument("--arena-mb", type=int, default=1024, help="each worker's emulated device, MiB")
    parser.add_argument("--budget-mb", type=float, default=None, help="optimize to this budget (default: as written)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=_WORKERS, help="worker processes")
    parser.add_argument("--keras-fit", action="store_true",
                        help="train with Keras fit (seqmem.keras.fit_within_budget with --budget-mb) instead")
    parser.add_argument("--reserved-arena", action="store_true",
                        help="reserve each worker's arena up front, as a GPU's, instead of growing it")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ports", default="", help=argparse.SUPPRESS)
    parser.add_argument("--hold-mb", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--call-holding", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("batch", "arena_mb", "steps", "workers"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.keras_fit and args.model == "nmt":
        parser.error("--keras-fit trains the Keras image models, not nmt")
    if args.worker is None:
        for index, result in enumerate(run_workers(args.model, args.batch, args.arena_mb, args.budget_mb,
                                                   args.steps, keras_fit=args.keras_fit, workers=args.workers,
                                                   reserved_arena=args.reserved_arena)):
            print(json.dumps({"worker": index, **result}))
        return 0
    try:
        result = _worker(args.worker, [int(port) for port in args.ports.split(",")], args.model, args.batch,
                         args.arena_mb, args.budget_mb, args.steps, args.hold_mb, args.call_holding, args.keras_fit,
                         args.reserved_arena)
    except Exception as error:  # reported to the launcher, which shows every worker's outcome
        where = traceback.format_exception(error)[-3:-1]  # the innermost frames, for an error that is a bug
        result = {"error": type(error).__name__, "message": (str(error) + "\n" + "".join(where))[:2000]}
    with open(args.out + ".part", "w") as file:
        json.dump(result, file)
    os.replace(args.out + ".part", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
