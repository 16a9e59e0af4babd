"""Many short Python processes that import the same heavy modules (torch), for the cost of a fork each.

A test that starts ranks of a training job starts a Python process per rank, and each spends ~3 s of CPU importing
torch before it does anything. A fork server imports the modules once; ``start`` forks a child of it that runs a
script as ``python script args`` would: its own environment, working folder, ``sys.argv`` and ``sys.path[0]``,
the caller's stdout and stderr at the time of the call (passed over the server's socket), and its exit status
reported back. DataLoader workers and ``torch.multiprocessing``'s fork start method fork a process that has
imported torch the same way. What differs from a fresh interpreter: the preloaded modules were imported with the
server's environment (start it with the variables they read at import, such as ``OMP_NUM_THREADS``), and the
child is the server's, not the caller's (``ForkedProcess`` stands in for ``subprocess.Popen``: ``wait``, ``poll``,
``kill``).

    with ForkServer(["torch", "torch.distributed"], env={"OMP_NUM_THREADS": "1"}) as server:
        proc = server.start([sys.executable, "worker.py", "arg"], env={**os.environ, "RANK": "0"})
        proc.wait(timeout=60)

``python -m package args`` runs too (``server.start([sys.executable, "-m", "ff_storage", ...])``), and ``preload``
imports more modules into a running server, so the children forked after it have them.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

_MAX_MSG = 1 << 20


class ForkedProcess:
    """A child of the fork server (the parts of ``subprocess.Popen`` the tests use)."""

    def __init__(self, server: ForkServer, pid: int, args: Sequence[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status if the child has exited (negative: killed by that signal), else None; never blocks."""
        if self.returncode is None:
            self.returncode = self._server._exit_code(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Waits up to ``timeout`` seconds (None: forever) for the child to exit and returns its status.

        Raises:
            subprocess.TimeoutExpired: the child is still running after ``timeout``.
        """
        if self.returncode is None:
            self.returncode = self._server._exit_code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Sends ``sig`` to the child unless it has exited (its pid may already be another process's)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL to the child, as ``subprocess.Popen.kill``."""
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM to the child, as ``subprocess.Popen.terminate``."""
        self.send_signal(signal.SIGTERM)


class ForkServer:
    """A process that imported ``preload`` and forks children on request (see the module docstring)."""

    def __init__(self, preload: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "ff_testing.forkserver", str(theirs.fileno()), *preload],
            pass_fds=(theirs.fileno(),),
            env=dict(os.environ if env is None else {**os.environ, **env}),
        )
        theirs.close()
        self._sock = ours
        self._file = ours.makefile("rb")
        self._lock = threading.Lock()  # one request at a time
        self._cond = threading.Condition()
        self._exits: dict[int, int] = {}
        self._replies: list[dict[str, Any]] = []
        self._closed = False
        self._broken = ""  # why the server may not be asked again, once a request went unanswered
        self._reader = threading.Thread(target=self._read, name="forkserver-reader", daemon=True)
        self._reader.start()

    def start(
        self,
        args: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None = None,
        *,
        stdout: IO[Any] | None = None,
        stderr: IO[Any] | None = None,
    ) -> ForkedProcess:
        """Fork a child running the script ``args[1]`` with ``args[2:]``, as ``subprocess.Popen(args)`` would.

        ``args[0]`` is the interpreter, as for ``subprocess.Popen``, and must be this one; ``args[1:3]`` may be
        ``-m package`` instead of a script. The child's stdout and stderr are the given files, else this process's
        at the time of the call.

        Raises:
            ValueError: ``args`` does not run a script or a module with this interpreter.
            RuntimeError: the server could not fork the child.
        """
        if len(args) < 2 or args[0] != sys.executable or (args[1] == "-m" and len(args) < 3):
            raise ValueError(f"the fork server runs scripts and modules of {sys.executable} only: {list(args)}")
        request = {"argv": list(args[1:]), "env": dict(env), "cwd": cwd or os.getcwd()}
        fds = [(stdout or sys.stdout).fileno(), (stderr or sys.stderr).fileno()]
        reply = self._request(request, fds)
        return ForkedProcess(self, int(reply["pid"]), args)

    def preload(self, modules: Sequence[str]) -> None:
        """Import ``modules`` in the server: the children it forks from now on start with them imported.

        Raises:
            RuntimeError: a module failed to import (the server goes on without it).
        """
        self._request({"preload": list(modules)}, [])

    def _request(self, request: dict[str, Any], fds: Sequence[int]) -> dict[str, Any]:
        body = json.dumps(request).encode()
        with self._lock:
            if self._broken:
                raise RuntimeError(f"fork server: unusable since an earlier request went unanswered ({self._broken})")
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            self._sock.sendmsg([len(body).to_bytes(4, "big") + body], ancillary)
            try:
                reply = self._next_reply(120.0)  # (a preload may import for a while on a loaded machine)
            except RuntimeError as exc:
                # Its late answer would be taken for the next request's: no request is sent after it.
                self._broken = str(exc)
                raise
        if "error" in reply:
            raise RuntimeError(f"fork server: {reply['error']}")
        return reply

    @property
    def usable(self) -> bool:
        """False once closed, exited, or a request went unanswered (a new server is needed then)."""
        return not (self._closed or self._broken or self._reader_done())

    def close(self) -> None:
        """Stop the server; children still running are killed."""
        if self._closed:
            return
        self._closed = True
        self._sock.shutdown(socket.SHUT_RDWR)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._file.close()
        self._sock.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_reply(self, timeout_s: float) -> dict[str, Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._replies or self._reader_done(), timeout_s):
                raise RuntimeError("fork server: no answer")
            if not self._replies:
                raise RuntimeError(f"fork server exited ({self._proc.poll()})")
            return self._replies.pop(0)

    def _reader_done(self) -> bool:
        return not self._reader.is_alive()

    def _exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self._reader_done(), timeout)
            return self._exits.get(pid)

    def _read(self) -> None:
        try:
            for line in self._file:
                msg = json.loads(line)
                with self._cond:
                    if "exit" in msg:
                        self._exits[int(msg["exit"])] = int(msg["code"])
                    else:
                        self._replies.append(msg)
                    self._cond.notify_all()
        except (OSError, ValueError):
            pass
        finally:
            with self._cond:
                self._cond.notify_all()


# ---- the server process ----


class _Server:
    """Forks a child per request; reports each child's pid, then its exit status (as ``Popen.returncode``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.children: set[int] = set()
        self.out = sock.makefile("wb", buffering=0)
        self.buf = b""
        self.passed: list[int] = []  # the stdio fds that came with requests (two per request)

    def send(self, msg: dict[str, Any]) -> None:
        self.out.write(json.dumps(msg).encode() + b"\n")

    def serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        sel.register(self.wake_r, selectors.EVENT_READ)
        try:
            while True:
                for key, _ in sel.select():
                    if key.fileobj == self.wake_r:
                        os.read(self.wake_r, 4096)
                    elif not self.receive(sel):
                        return
                self.reap()
        finally:
            for pid in self.children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def receive(self, sel: selectors.BaseSelector) -> bool:
        """Read from the socket and fork for each whole request; False at its end."""
        data, fds = _recv(self.sock)
        if not data:
            return False
        self.buf += data
        self.passed += fds
        while len(self.buf) >= 4 and len(self.buf) >= 4 + int.from_bytes(self.buf[:4], "big"):
            size = int.from_bytes(self.buf[:4], "big")
            request, self.buf = json.loads(self.buf[4 : 4 + size]), self.buf[4 + size :]
            if "preload" in request:
                self.send(_preload(request["preload"]))
                continue
            stdio, self.passed = self.passed[:2], self.passed[2:]
            try:
                pid = os.fork()
            except OSError as exc:
                self.send({"error": str(exc)})
                continue
            if pid == 0:
                sel.close()
                self.out.close()  # (else the socket stays open in the child through this file's reference)
                _child(request, stdio, self.sock, self.wake_r, self.wake_w)
            for fd in stdio:
                os.close(fd)
            self.children.add(pid)
            self.send({"pid": pid})
        return True

    def reap(self) -> None:
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            self.children.discard(pid)
            self.send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _recv(sock: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancdata, _, _ = sock.recvmsg(_MAX_MSG, socket.CMSG_SPACE(16 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def _preload(modules: Sequence[str]) -> dict[str, Any]:
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # reported to the caller; the server must go on
            return {"error": f"preloading {name}: {type(exc).__name__}: {exc}"}
    return {"ok": True}


def _child(request: dict[str, Any], stdio: list[int], sock: socket.socket, *fds: int) -> None:
    """In the forked child: become ``python argv...`` and exit with its status; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        for fd in fds:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        for target, fd in zip((1, 2), stdio, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        if os.environ.get("PYTHONUNBUFFERED"):  # read at interpreter start: the server's streams predate it
            for stream in (sys.stdout, sys.stderr):
                stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        # PYTHONPATH is read at interpreter start too: the child's folders go after sys.path[0], as they would
        sys.path[1:1] = [d for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d and d not in sys.path]
        argv = list(request["argv"])
        import atexit
        import runpy

        try:
            if argv[0] == "-m":  # as `python -m`: argv[0] becomes the module's file, the folder on sys.path is cwd
                sys.argv, sys.path[0] = argv[1:], os.getcwd()
                sys.modules.pop(f"{argv[1]}.__main__", None)  # preloaded: run_module runs it afresh as __main__
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv, sys.path[0] = argv, os.path.dirname(os.path.abspath(argv[0]))
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int | None):
                print(exc.code, file=sys.stderr)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream: nothing to flush
                stream.flush()
        os._exit(code)


def main() -> None:
    """The server process (``python -m ff_testing.forkserver <socket fd> <module>...``): imports, then serves."""
    fd, *preload = sys.argv[1:]
    import importlib

    for name in preload:
        importlib.import_module(name)
    _Server(socket.socket(fileno=int(fd))).serve()
    # Children are killed and nothing is left to flush: skip the interpreter's teardown of what it preloaded (with
    # torch, about a second of CPU at every test session's end).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
