"""Flushing the dump when a scheduler or the user stops the program.

SIGTERM and SIGINT get a handler that flushes every active capture and then
does what the previous handler would have done (call it, or re-deliver the
signal with the default action), so a training script's own handlers and
KeyboardInterrupt keep working. Handlers can only be set from the main thread;
elsewhere nothing is installed and the atexit flush still applies.
"""

import os
import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalFlusher:
    """Installs chaining SIGTERM/SIGINT handlers until :meth:`restore`.

    Args:
      flush: callable run first on each signal; its exceptions are swallowed.
    """

    def __init__(self, flush):
        self._flush = flush
        self._previous = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except (ValueError, OSError):  # e.g. an embedded interpreter
                continue

    def _handle(self, signum, frame):
        try:
            self._flush()
        except Exception:  # the signal's own effect matters more than our flush
            pass
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def restore(self):
        """Puts the previous handlers back where ours is still the installed one."""
        for signum, previous in self._previous.items():
            try:
                if signal.getsignal(signum) == self._handle:
                    signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                continue
        self._previous = {}
