"""Several processes training one model, through JAX's distributed runtime.

`start` joins this process to the others (`jax.distributed.initialize`, with gloo collectives on
the CPU); `agree` checks, with a JAX collective, that every process holds the same graph and
settings; `launch` starts P processes on this machine (``jgrind launch``).

What JAX 0.10.2 does on its own, and why this module adds to it:

- A coordinator that cannot be reached, or processes that never all arrive: the client's
  ``connect`` retries until ``initialization_timeout``, then JAX terminates the process from C++
  (a fatal log and a stack trace; measured: after about twice the timeout). `start` instead
  probes the coordinator's port itself and keeps a timer: after ``timeout_s`` it prints one line
  and exits with status 2.
- A process that dies: the coordination service notices its missing heartbeats after
  ``heartbeat_timeout_seconds`` and then terminates every other process the same way (measured
  with a 5 s timeout: 5-7 s after the kill). A collective in flight with the dead process fails
  sooner, as a `jax.errors.JaxRuntimeError` ("Gloo ... Connection closed by peer": about 1 s
  on one machine). The missed-heartbeat callback that would let Python see the service's
  verdict cannot be used from Python in this JAX (it fails to convert its status argument), so
  `start` runs a watchdog of its own on JAX's key-value store: each process bumps a counter
  there every second; a process whose counter stands still for ``heartbeat_timeout_s``, or a
  coordinator that stops answering, makes the others print one line naming it and exit with
  status 2. JAX's own heartbeat timeout is set longer, as a backstop.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional, Sequence

__all__ = ["ProcessError", "Processes", "agree", "current", "fail", "free_port", "launch",
           "start", "stop", "CONNECT_TIMEOUT_S", "HEARTBEAT_TIMEOUT_S", "EXIT_FAILED"]

CONNECT_TIMEOUT_S = 60.0  # how long `start` waits for the coordinator and every process
HEARTBEAT_TIMEOUT_S = 30.0  # a process silent this long is taken for dead
EXIT_FAILED = 2  # the exit status of a run stopped by another process's failure (as bad input)
_BEAT_S = 1.0  # how often the watchdog signs this process alive and looks at the others
_ALIVE = "jgrind/alive/"  # the watchdog's keys in JAX's key-value store: one per process
_DONE = "done"  # a process's last value: it finished and waits for the others at shutdown


class ProcessError(RuntimeError):
    """Processes that cannot start or work together; the message is one line for the user."""


@dataclasses.dataclass(frozen=True)
class Processes:
    """This process's place among the others, once `start` returned."""

    process_id: int
    num_processes: int
    coordinator: str
    local_devices: int  # the devices this process drives
    devices: int  # the devices of every process together

    def __str__(self) -> str:
        return (f"process {self.process_id} of {self.num_processes} (coordinator "
                f"{self.coordinator}): {self.local_devices} of {self.devices} devices")


_current: Optional[Processes] = None
_watchdog: Optional["_Watchdog"] = None


def current() -> Optional[Processes]:
    """The processes `start` joined, or None in a single-process run."""
    return _current


def start(coordinator: Optional[str] = None, num_processes: Optional[int] = None,
          process_id: Optional[int] = None, *, timeout_s: float = CONNECT_TIMEOUT_S,
          heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
          local_device_ids: Optional[Sequence[int]] = None) -> Processes:
    """Join this process to ``num_processes`` others through the coordinator at ``coordinator``
    (``HOST:PORT``; process 0 runs it there), as process ``process_id``. Must run before JAX
    uses a device. What is left None comes from the environment variables JAX reads
    (``JAX_COORDINATOR_ADDRESS``; a Slurm or Open MPI job's own variables).

    Within ``timeout_s`` every process must have connected, else this one prints one line on
    stderr and exits with `EXIT_FAILED` (a timer, since JAX itself would abort the process
    later). Afterwards a process that stops for ``heartbeat_timeout_s`` (killed, crashed, hung)
    makes this one exit the same way, naming it (`_Watchdog`). On the CPU the collectives are
    gloo's, unless ``jax_cpu_collectives_implementation`` is set already."""
    global _current, _watchdog
    import jax
    from jax._src import distributed, xla_bridge
    if _current is not None or distributed.global_state.client is not None:
        raise ProcessError("the processes are started already (start runs once per process)")
    if xla_bridge.backends_are_initialized():
        raise ProcessError("JAX has started its devices already; start the processes first "
                           "(before anything touches jax.devices() or an array)")
    if timeout_s <= 0 or heartbeat_timeout_s <= 0:
        raise ProcessError(f"timeouts must be above 0 s (given: connect {timeout_s:g} s, "
                           f"heartbeat {heartbeat_timeout_s:g} s)")
    coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
    if coordinator is not None:
        _host_port(coordinator)
    if num_processes is not None and num_processes < 1:
        raise ProcessError(f"--num-processes {num_processes}: at least 1")
    if process_id is not None and num_processes is not None \
            and not 0 <= process_id < num_processes:
        raise ProcessError(f"--process-id {process_id}: with --num-processes {num_processes} "
                           f"it is 0 to {num_processes - 1}")
    if jax.config.jax_cpu_collectives_implementation in (None, "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    who = "this process" if process_id is None else f"process {process_id}"
    if coordinator is not None and process_id not in (None, 0):
        _wait_for_port(coordinator, timeout_s, who)
    deadline = time.monotonic() + timeout_s
    timer = threading.Timer(timeout_s, fail, args=(
        f"{who} timed out after {timeout_s:g} s waiting for all "
        f"{num_processes if num_processes is not None else 'the'} processes to connect to the "
        f"coordinator at {coordinator}: check that every process was started with the same "
        "--coordinator and --num-processes and its own --process-id, and raise "
        "--connect-timeout if some start late",))
    timer.daemon = True
    timer.start()
    try:
        jax.distributed.initialize(
            coordinator, num_processes, process_id,
            local_device_ids=list(local_device_ids) if local_device_ids is not None else None,
            # JAX's own limits, longer than ours: its expiry aborts the process from C++
            initialization_timeout=int(max(deadline - time.monotonic(), 1)) + 30,
            heartbeat_timeout_seconds=int(heartbeat_timeout_s) + 30)
    except (ValueError, TypeError, RuntimeError) as err:  # JAX's checks of its arguments
        raise ProcessError(f"cannot start the processes: {_first_line(err)}") from None
    finally:
        timer.cancel()
    _current = Processes(process_id=jax.process_index(), num_processes=jax.process_count(),
                         coordinator=distributed.global_state.coordinator_address,
                         local_devices=jax.local_device_count(), devices=jax.device_count())
    _watchdog = _Watchdog(distributed.global_state.client, _current, heartbeat_timeout_s)
    import atexit
    atexit.register(stop)  # runs before JAX's own shutdown, registered when jax was imported
    return _current


def agree(fingerprint: str, what: str = "graph and settings") -> None:
    """Raise `ProcessError`, in every process, unless every process passes the same
    ``fingerprint`` (any string that stands for ``what``). Compared with a JAX collective
    (`jax.experimental.multihost_utils.process_allgather` of a SHA-256 digest), so it is also
    a barrier. Nothing to do in a single-process run."""
    import jax
    import numpy as np
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils
    digest = np.frombuffer(hashlib.sha256(fingerprint.encode()).digest(), np.uint8)
    everyone = np.asarray(multihost_utils.process_allgather(digest))  # [processes, 32]
    distinct, groups = np.unique(everyone, axis=0, return_inverse=True)
    if len(distinct) == 1:
        return
    groups = np.asarray(groups).reshape(-1)
    # the processes that differ from the largest group (from process 0's on a tie)
    counts = np.bincount(groups)
    common = groups[0] if counts[groups[0]] == counts.max() else int(np.argmax(counts))
    odd = [p for p in range(len(groups)) if groups[p] != common]
    short = lambda p: bytes(everyone[p][:4]).hex()  # noqa: E731
    names = ", ".join(f"{p} ({short(p)})" for p in odd)
    reference = int(np.flatnonzero(groups == common)[0])
    several = len(odd) > 1
    raise ProcessError(f"process{'es' if several else ''} {names} hold{'' if several else 's'} "
                       f"other {what} than process {reference} ({short(reference)}): start "
                       "every process with the same dataset, settings and flags")



def stop() -> None:
    """Leave the processes: the watchdog stops and marks this process done, so that the
    others do not take a process that finished first for a dead one; then JAX's shutdown (a
    barrier: it returns once every process got here)."""
    global _watchdog, _current
    if _watchdog is not None:
        _watchdog.close()
        _watchdog = None
    if _current is not None:
        import jax
        jax.distributed.shutdown()
        _current = None


def fail(line: str) -> None:
    """Print ``jgrind: error: LINE`` and end the process with `EXIT_FAILED` at once, from any
    thread: with another process gone, JAX's shutdown at exit would wait for it and then abort
    with a stack trace."""
    sys.stdout.flush()
    os.write(2, f"jgrind: error: {line}\n".encode())
    os._exit(EXIT_FAILED)


class _Watchdog:
    """Every `_BEAT_S`, sets this process's counter in JAX's key-value store (held by the
    coordinator) and reads the others'. A counter that has not moved for ``timeout_s``: that
    process is gone, and `fail` names it. A store that cannot be reached: the coordinator
    (process 0) is gone."""

    def __init__(self, client, me: Processes, timeout_s: float):
        self._client, self._me, self._timeout = client, me, timeout_s
        self._closed = threading.Event()
        self._lock = threading.Lock()  # `close` and a beat never overlap
        self._thread = threading.Thread(target=self._run, name="jgrind-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        beats, seen = 0, {}  # process -> (its last value, when it changed)
        me = self._me
        while not self._closed.wait(0 if beats == 0 else _BEAT_S):
            with self._lock:
                if self._closed.is_set():
                    return
                try:
                    self._client.key_value_set(f"{_ALIVE}{me.process_id}", str(beats),
                                               allow_overwrite=True)
                    values = dict(self._client.key_value_dir_get(_ALIVE))
                except Exception as err:  # noqa: BLE001 - any failure of the store's RPC
                    fail(f"process {me.process_id} lost the coordinator at {me.coordinator} "
                         f"(process 0): {_first_line(err)}; process 0 has stopped or cannot "
                         "be reached")
            beats += 1
            now = time.monotonic()
            for other in range(me.num_processes):
                if other == me.process_id:
                    continue
                value = values.get(f"{_ALIVE}{other}")
                if value == _DONE:
                    continue
                if other not in seen or seen[other][0] != value:
                    seen[other] = (value, now)
                elif now - seen[other][1] > self._timeout:
                    fail(f"process {other} of {me.num_processes} has shown no sign of life for "
                         f"{self._timeout:g} s (killed, crashed or hung; see its output): "
                         f"process {me.process_id} stops too")

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            try:
                self._client.key_value_set(f"{_ALIVE}{self._me.process_id}", _DONE,
                                           allow_overwrite=True)
            except Exception:  # noqa: BLE001 - the coordinator gone: nothing to tell it
                pass


def _host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ProcessError(f"--coordinator {address!r}: expected HOST:PORT, e.g. "
                           "10.0.0.1:12345 (process 0's address and a free port there)")
    return host.strip("[]"), int(port)


def _wait_for_port(address: str, timeout_s: float, who: str) -> None:
    """Return once something listens at ``address``; `ProcessError` after ``timeout_s``."""
    host, port = _host_port(address)
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, timeout_s)):
                return
        except OSError as err:
            last = err.strerror or str(err)
        if time.monotonic() >= deadline:
            raise ProcessError(
                f"{who} cannot reach the coordinator at {address} within {timeout_s:g} s "
                f"({last}): check that process 0 runs there with the same --coordinator, "
                "that HOST and PORT are right, and that no firewall blocks the port")
        time.sleep(0.2)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def free_port() -> int:
    """A TCP port on this machine that is free now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- jgrind launch ---------------------------------------------------------------------------
PROCESS_FLAGS = ("--coordinator", "--num-processes", "--process-id")
_GRACE_S = 10.0  # how long stopped processes get to clean up before SIGKILL


def launch(arguments: Sequence[str], num_processes: int, devices_per_process: int = 1, *,
           program: Sequence[str] = (sys.executable, "-m", "jgrind.cli")) -> int:
    """Run ``program arguments --coordinator 127.0.0.1:PORT --num-processes P --process-id I``
    for I in 0..P-1 on this machine, each with ``devices_per_process`` devices (CPU:
    ``JAX_NUM_CPU_DEVICES``; GPU: ``JAX_LOCAL_DEVICE_IDS``, the I-th group of that many),
    their output prefixed with ``[I]``. SIGINT and SIGTERM are passed on to every process.
    When one exits with another status than 0, the others get SIGTERM (SIGKILL after
    `_GRACE_S`) and this returns `EXIT_FAILED` after one line naming the process and why.
    Returns 0 when all succeed, 128 + the signal when interrupted."""
    if num_processes < 1:
        raise ProcessError(f"-n {num_processes}: at least 1 process")
    if devices_per_process < 1:
        raise ProcessError(f"--devices-per-process {devices_per_process}: at least 1")
    given = [flag for flag in PROCESS_FLAGS
             if any(a == flag or a.startswith(flag + "=") for a in arguments)]
    if given:
        raise ProcessError(f"jgrind launch fills in {', '.join(given)} itself; leave "
                           f"{'them' if len(given) > 1 else 'it'} out of the command")
    coordinator = f"127.0.0.1:{free_port()}"
    children: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    last_error: dict[int, str] = {}
    for index in range(num_processes):
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   JAX_NUM_CPU_DEVICES=str(devices_per_process),
                   JAX_LOCAL_DEVICE_IDS=",".join(
                       str(index * devices_per_process + d) for d in range(devices_per_process)))
        command = [*program, *arguments, "--coordinator", coordinator,
                   "--num-processes", str(num_processes), "--process-id", str(index)]
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
        children.append(child)
        for stream, sink in ((child.stdout, sys.stdout), (child.stderr, sys.stderr)):
            pump = threading.Thread(target=_pump, args=(stream, sink, index, last_error),
                                    daemon=True)
            pump.start()
            pumps.append(pump)

    asked: list[int] = []  # the signal the user sent, if any

    def forward(signum, frame):
        if not asked:
            asked.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        failed = _wait_all(children, asked)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for pump in pumps:
            pump.join(timeout=5)
    if asked:
        return 128 + asked[0]
    if failed is None:
        return 0
    index, status = failed
    why = _status_words(status)
    detail = last_error.get(index)
    print(f"jgrind: error: process {index} of {num_processes} failed ({why}"
          + (f": {detail}" if detail else "") + "); stopped the others", file=sys.stderr)
    return EXIT_FAILED


def _wait_all(children: list, asked: list) -> Optional[tuple[int, int]]:
    """Wait for every child; on the first that fails (unless the user interrupted), stop the
    rest. Returns (its index, its status), or None when all succeeded."""
    failed = None
    stop_at = None
    while True:
        statuses = [child.poll() for child in children]
        if failed is None and not asked:
            bad = [(i, s) for i, s in enumerate(statuses) if s not in (None, 0)]
            if bad:
                # of several at once, one killed by a signal is the likelier cause
                failed = min(bad, key=lambda item: (item[1] >= 0, item[0]))
                for child in children:
                    if child.poll() is None:
                        child.send_signal(signal.SIGTERM)
                stop_at = time.monotonic() + _GRACE_S
        if all(s is not None for s in statuses):
            return failed
        if stop_at is not None and time.monotonic() > stop_at:
            for child in children:
                if child.poll() is None:
                    child.kill()
            stop_at = None
        time.sleep(0.05)


def _pump(stream, sink, index: int, last_error: dict) -> None:
    """Copy a child's output to ``sink`` line by line, prefixed with its index; remember its
    last ``jgrind: error:`` line."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        if line.startswith("jgrind: error: "):
            last_error[index] = line.removeprefix("jgrind: error: ")
        sink.write(f"[{index}] {line}\n")
        sink.flush()
    stream.close()


def _status_words(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"
