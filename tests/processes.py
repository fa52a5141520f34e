"""Helpers for tests that run real server processes."""

import subprocess


def stop(proc, timeout_s=20):
    """Terminates ``proc``, killing it if it has not exited after ``timeout_s``; waits for it."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
