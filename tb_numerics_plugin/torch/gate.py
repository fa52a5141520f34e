"""Turn-taking between the recording thread and the writer's flush thread.

The flush thread (``FileSetWriter.on_timer``) writes an execution that a
stalled program left open (a hang, a blocked collective, a ``time.sleep``), so
that a kill loses none of it. Only one thread may touch the capture's state at
a time: they take turns through ``gate``, a token whose ``take`` is a single
atomic step: ``_record.Token``, a flag the C entries read and write without a
Python call, or in Python ``PyToken``, a one-key dict whose ``pop`` is one
step. Either costs the per-op path far less than a lock, and a signal handler
that interrupts the recording in the same thread finds the token gone instead
of deadlocking.
"""

import os
import time
import weakref

# Flush-thread beats (half a flush interval each) without a new op before an
# open graph execution is written as far as it got; a run of eager ops needs one.
GRAPH_STALL_BEATS = 10

_SESSIONS = weakref.WeakSet()


class PyToken:
    """The recording token where the ``_record`` extension is missing (``_record.Token``
    otherwise): free when made; ``take`` answers whether it was free and leaves it
    taken, ``give`` frees it, ``clear`` takes it from whoever held it."""

    __slots__ = ("_slot",)

    def __init__(self):
        self._slot = {0: True}  # dict.pop is one step under the GIL

    def take(self):
        return self._slot.pop(0, None) is not None

    def give(self):
        self._slot[0] = True

    def clear(self):
        self._slot.clear()


try:
    from tb_numerics_plugin.torch._record import Token
except ImportError:  # the extension was not built
    Token = PyToken


class RecordingGate:
    """The gate half of ``capture.Session`` (a mixin sharing the session's state).

    Uses the session's ``_segment``, ``switch`` and ``fail``.
    """

    def _init_gate(self):
        self.gate = Token()  # the recording token
        self._timer_holds = False
        self._stall = (None, 0)  # (progress mark of the open segment, beats without progress)
        _SESSIONS.add(self)

    def acquire(self):
        """Takes the recording token; False when this thread already holds it (a signal
        handler that interrupted the recording) or the capture has stopped.

        Waits while the flush thread holds the token (it writes a stalled execution).
        """
        gate = self.gate
        if gate.take():
            return True
        while self._timer_holds:
            time.sleep(0.0002)
            if gate.take():
                return True
        return gate.take()  # the flush thread may have just handed it back

    def release(self):
        """Gives the recording token back."""
        self.gate.give()

    def on_timer(self):
        """Run by the writer's flush thread before each timed flush.

        Writes the open segment once it stalled: a run of eager ops after one
        beat without progress; a graph execution after ``GRAPH_STALL_BEATS``
        (so a slow op does not split every forward), written as far as it got
        and continued as a second execution of the same name.
        """
        seg = self._segment
        if seg is None or not (seg.ops or seg.eager):
            self._stall = (None, 0)
            return
        mark = (seg.serial, len(seg.ops), len(seg.eager), len(seg.traces))
        beats = self._stall[1] + 1 if self._stall[0] == mark else 0
        self._stall = (mark, beats)
        if beats < (GRAPH_STALL_BEATS if seg.is_graph else 1):
            return
        self._timer_holds = True  # before the pop: a recording thread that misses the token waits
        try:
            if not self.gate.take():
                return  # the program is recording: not stalled after all
            try:
                if self._segment is seg and mark == (seg.serial, len(seg.ops), len(seg.eager),
                                                     len(seg.traces)):
                    if seg.is_graph:
                        self.switch(seg.name, seg.stack_ids)
                    else:
                        self.switch(None, open_new=False)
            except Exception as exc:
                self.fail("flush timer", exc)
            finally:
                self.release()
        finally:
            self._timer_holds = False
        self._stall = (None, 0)


def _after_fork_in_child():
    # A forked child (a DataLoader worker) inherits the dispatch mode but not the flush
    # thread, and its writer copy writes nothing: recording there would only cost time.
    for session in list(_SESSIONS):
        session._timer_holds = False
        session.gate.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
