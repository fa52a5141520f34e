"""Helpers for tests that run real server processes."""

import socket
import subprocess
import time


def free_port():
    """A TCP port free on the loopback interface now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, timeout_s=20):
    """Returns once something accepts connections on the loopback ``port``.

    Raises:
      TimeoutError: nothing did within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError("nothing listens on 127.0.0.1:%d after %g s" % (port, timeout_s))
            time.sleep(0.1)


def stop(proc, timeout_s=20):
    """Terminates ``proc``, killing it if it has not exited after ``timeout_s``; waits for it."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
