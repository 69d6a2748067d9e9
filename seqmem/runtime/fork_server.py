"""Fresh processes without the import: a server that has imported TensorFlow forks one per job.

`runtime.device.run_with_budget` needs a fresh process per job, as TensorFlow
reads the emulated device's settings once. Starting Python and importing
TensorFlow takes about 4 s; the server does it once, with oneDNN off (which
TensorFlow reads on import), and forks a child per job. TensorFlow reads the
arena's settings when it first allocates, not on import, so each child starts
with a fresh arena under its own job's environment.

The protocol: the server listens on a Unix socket in a private folder and says
`ready PATH` on its stdout. A client connects and writes one JSON request line.
For each, the server forks a supervisor, which forks the worker, then writes
into the job's folder the worker's pid (`pid`) and, once it has ended, its exit
status (`exit_status`: the code, or minus the signal that ended it), each file
written whole. The worker takes the job's environment, working directory and
import path, sends its stdout to /dev/null and its stderr to the folder's
`stderr`, and calls the job's function. A worker's own jobs (`optimize`'s
scratch probe in a batch search's probe) go to the server that forked it, named
in the worker's `SEQMEM_FORK_SERVER`, not to a server of its own. A worker
whose requester has ended (a probe past its timeout, a search interrupted) is
killed by its supervisor, and so, in turn, are the jobs it asked for. The server
exits when its stdin closes, that is, with the process that started it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Optional

__all__ = ["run_forked"]

# What the server imports before it forks, and the environment it imports it in (on top of the parent's).
_PRELOADED = ("tensorflow", "seqmem.runtime.optimize")
_IMPORT_ENV = {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
_POLL_S = 0.02
_WATCH_S = 0.05  # how often a supervisor looks at its worker and at the process that asked for it
_REPORT_S = 30.0  # how long a supervisor may take to report on a worker it was told to kill
_SERVER_ENV = "SEQMEM_FORK_SERVER"  # in a worker: the socket of the server that forked it

_lock = threading.Lock()
_server: Optional[subprocess.Popen] = None
_socket_path = ""


def run_forked(target: str, args: Sequence[str], env: Mapping[str, str], folder: str,
               timeout_s: float) -> Optional[int]:
    """Run `target(*args)` ("module:function", string arguments) in a child forked from the server, with
    environment `env`, this process's working directory and import path; its stderr goes to
    `folder`/stderr. Returns the child's exit status (minus the signal that ended it), or None when it ran
    past `timeout_s` seconds and was killed. Raises RuntimeError if the server cannot start, or when `env`
    disagrees with what the server imported TensorFlow under (`_IMPORT_ENV`)."""
    onednn = env.get("TF_ENABLE_ONEDNN_OPTS")
    if onednn != _IMPORT_ENV["TF_ENABLE_ONEDNN_OPTS"]:
        raise RuntimeError(f"forked jobs run with TF_ENABLE_ONEDNN_OPTS=0, which TensorFlow reads on import; the "
                           f"job's environment has {onednn!r}")
    request = {"target": target, "args": list(args), "env": dict(env), "cwd": os.getcwd(),
               "path": [os.getcwd()] + [p for p in sys.path if p], "folder": folder, "requester": os.getpid()}
    line = (json.dumps(request) + "\n").encode()
    try:
        _send(os.environ.get(_SERVER_ENV) or _started_socket(), line)
    except OSError:  # the server died since the last job (or since this worker's was forked): start another
        with _lock:
            _stop()
        os.environ.pop(_SERVER_ENV, None)
        _send(_started_socket(), line)
    status_path = os.path.join(folder, "exit_status")
    timed_out = not _wait_for(status_path, timeout_s)
    if timed_out:
        if _wait_for(os.path.join(folder, "pid"), _REPORT_S):
            with open(os.path.join(folder, "pid")) as pid:
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.kill(int(pid.read()), signal.SIGKILL)
        if not _wait_for(status_path, _REPORT_S):
            raise RuntimeError(f"seqmem's fork server did not report on a job within {_REPORT_S:.0f} s of its "
                               f"{timeout_s:.0f} s timeout")
    with open(status_path) as status:
        code = int(status.read())
    return None if timed_out else code


def _wait_for(path: str, seconds: float) -> bool:
    """Whether `path` exists within `seconds`."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _send(socket_path: str, line: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(socket_path)
        client.sendall(line)


def _started_socket() -> str:
    """The socket of this process's server, started (and ready: it has imported `_PRELOADED`) if it was not
    running."""
    global _server, _socket_path
    with _lock:
        if _server is not None and _server.poll() is None:
            return _socket_path
        env = {**os.environ, **_IMPORT_ENV}
        for name in ("TF_CPU_ALLOCATOR_USE_BFC", "TF_CPU_BFC_MEM_LIMIT_IN_MB", _SERVER_ENV):
            env.pop(name, None)
        with tempfile.TemporaryFile() as stderr:
            server = subprocess.Popen([sys.executable, "-m", "seqmem.runtime.fork_server"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=stderr, env=env)
            said = server.stdout.readline()
            if not said.startswith(b"ready "):
                server.wait()
                stderr.seek(0)
                tail = stderr.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"seqmem's fork server exited on start ({server.returncode}):\n{tail}")
        _server, _socket_path = server, said[len(b"ready "):].decode().strip()
        return _socket_path


def _stop() -> None:
    """Kill this process's server, if any, and remove its socket's folder (call with `_lock` held)."""
    global _server
    if _server is not None:
        _server.kill()
        _server.wait()
        shutil.rmtree(os.path.dirname(_socket_path), ignore_errors=True)
        _server = None


def _serve() -> None:
    """Server side: import `_PRELOADED`, listen, say where, then fork a supervisor per request until stdin
    closes; the socket's folder is removed on the way out."""
    for module in _PRELOADED:
        importlib.import_module(module)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the supervisors are reaped by the kernel
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the import's messages are past; a server has nothing to say
    folder = tempfile.mkdtemp(prefix="seqmem-fork-server-")  # private: mode 0700
    socket_path = os.path.join(folder, "socket")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(socket_path)
            listener.listen(64)
            sys.stdout.buffer.write(f"ready {socket_path}\n".encode())
            sys.stdout.flush()
            while True:
                readable, _, _ = select.select([sys.stdin.fileno(), listener], [], [])
                if sys.stdin.fileno() in readable and not os.read(sys.stdin.fileno(), 1024):
                    return  # stdin closed: the process that started the server has ended
                if listener in readable:
                    _fork_supervisor(listener, socket_path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _fork_supervisor(listener: socket.socket, socket_path: str) -> None:
    """Read one request from the next client and fork its supervisor."""
    connection, _ = listener.accept()
    with connection, connection.makefile("rb") as stream:
        line = stream.readline()
    if not line.endswith(b"\n"):
        return  # the client went away mid-request
    if os.fork() == 0:
        try:
            listener.close()
            _supervise({**json.loads(line), "server": socket_path})
        finally:  # whatever happened, a supervisor must never go on serving requests
            os._exit(0)


def _supervise(request: dict) -> None:
    """Fork the worker, record its pid and then its exit status in the request's folder. A worker whose
    requester has ended (killed, or past its own timeout) is killed: nobody waits for its result."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    folder = request["folder"]
    worker = os.fork()
    if worker == 0:
        _work(request)
    _write_whole(os.path.join(folder, "pid"), str(worker))
    while True:
        ended, status = os.waitpid(worker, os.WNOHANG)
        if ended:
            break
        if not _alive(request["requester"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
        time.sleep(_WATCH_S)
    _write_whole(os.path.join(folder, "exit_status"), str(os.waitstatus_to_exitcode(status)))


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (until its parent reaps it: a supervisor reaps its worker at once)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        pass
    return True


def _work(request: dict) -> None:
    """Worker side: take the job's environment, directory, path and streams, run it; never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[_SERVER_ENV] = request["server"]
        os.chdir(request["cwd"])
        sys.path[:] = request["path"]
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.dup2(os.open(os.path.join(request["folder"], "stderr"), os.O_WRONLY | os.O_CREAT, 0o600), 2)
        sys.stdin.close()
        module, function = request["target"].split(":")
        getattr(importlib.import_module(module), function)(*request["args"])
        code = 0
    except BaseException:  # noqa: BLE001 - reported on the worker's stderr, as a fresh interpreter would
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _write_whole(path: str, text: str) -> None:
    with open(path + ".partial", "w") as file:
        file.write(text)
    os.replace(path + ".partial", path)


if __name__ == "__main__":
    _serve()
