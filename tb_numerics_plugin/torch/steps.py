"""Training steps: step marks, trace windows, and the cheap mode between windows.

``DumpHandle.step()`` marks the start of a training step. The open execution
is finished first, so that each execution (and its traces) belongs to the
step during which it opened; from then on every record carries the step
(extension field 101, docs/format.md).

With ``trace_steps`` the capture records only the steps of its windows.
Between windows it is *paused*: the global module and optimizer hooks are
removed and the dispatch mode is left, so an uncaptured step runs at the cost
of plain torch. Only when another ``TorchDispatchMode`` was entered above ours
(it cannot be left out of order) does the mode stay, passing ops through
unrecorded (the paused session holds the recording token). The next step mark
inside a window installs the hooks and the mode again.
"""

import re
import threading

from torch.utils._python_dispatch import _get_current_dispatch_mode

from tb_numerics_plugin.torch.mode import CaptureMode, CompiledCaptureMode
from tb_numerics_plugin.torch.native import NativeHook

_RANGE = re.compile(r"^(\d+)\s*-\s*(\d+)$")
_EVERY = re.compile(r"^every\s*:\s*(\d+)$")


class StepWindows:
    """The steps ``trace_steps`` selects: single steps, ranges and "every N".

    ``step in windows`` tells whether a step is traced.
    """

    def __init__(self, steps=(), ranges=(), every=()):
        self.steps = frozenset(steps)
        self.ranges = tuple(ranges)
        self.every = tuple(every)

    def __contains__(self, step):
        if step is None:
            return False
        return (step in self.steps or any(step in r for r in self.ranges)
                or any(step % n == 0 for n in self.every))

    def __repr__(self):
        parts = [str(s) for s in sorted(self.steps)]
        parts += ["%d-%d" % (r.start, r.stop - 1) if r.step == 1 else repr(r) for r in self.ranges]
        parts += ["every:%d" % n for n in self.every]
        return "StepWindows(%s)" % ",".join(parts)


def _bad(value, why):
    return ValueError("trace_steps: %s (got %r); expected None, steps and ranges such as "
                      "[2, 5, range(10, 21)], or a string such as \"2,5,10-20\" or \"every:100\""
                      % (why, value))


def parse_trace_steps(value):
    """Turns ``trace_steps`` into :class:`StepWindows`, or None (every step traced).

    Args:
      value: None; an int; a ``range``; a string of comma-separated items
        ``N``, ``A-B`` (inclusive) or ``every:N`` (steps divisible by N); or
        an iterable of ints, ranges and such strings.

    Raises:
      ValueError: anything else, a negative step, an empty range or selection,
        ``every:0``.
    """
    if value is None:
        return None
    steps, ranges, every = set(), [], []
    items = [value] if isinstance(value, (int, range, str)) else value
    try:
        items = list(items)
    except TypeError:
        raise _bad(value, "not a step, range, string or iterable") from None
    for item in items:
        if isinstance(item, str):
            for text in item.split(","):
                _parse_text(value, text.strip(), steps, ranges, every)
        elif isinstance(item, bool) or not isinstance(item, (int, range)):
            raise _bad(value, "item %r is not an int, range or string" % (item,))
        elif isinstance(item, range):
            if len(item) == 0 or item.start < 0 or item.step < 1:
                raise _bad(value, "range %r is empty, negative or descending" % (item,))
            ranges.append(item)
        elif item < 0:
            raise _bad(value, "step %d is negative" % item)
        else:
            steps.add(int(item))
    if not (steps or ranges or every):
        raise _bad(value, "no step selected")
    return StepWindows(steps, ranges, every)


def _parse_text(value, text, steps, ranges, every):
    if text.isdigit():
        steps.add(int(text))
        return
    m = _RANGE.match(text)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        if b < a:
            raise _bad(value, "range %r ends before it starts" % text)
        ranges.append(range(a, b + 1))
        return
    m = _EVERY.match(text)
    if m and int(m.group(1)) > 0:
        every.append(int(m.group(1)))
        return
    raise _bad(value, "cannot read %r" % text)


def check_step(step):
    """Validates the ``step`` argument of ``DumpHandle.step``.

    Raises:
      ValueError: not a non-negative int.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError("step must be a non-negative int or None, not %r" % (step,))
    return int(step)


class StepControl:
    """The step half of ``capture.Session`` (a mixin sharing the session's state).

    Uses the session's ``acquire``, ``release``, ``gate``, ``fail``, ``switch``,
    ``_register_hooks``, ``_handles``, ``_mode``, ``_thread``, ``scopes``, ``trends`` and the
    stop checks of ``stop.NonFiniteWatch``.
    """

    def _init_steps(self, windows):
        self.step = None
        self._windows = windows
        self._paused = False

    @property
    def paused(self):
        """True between trace windows (nothing is recorded)."""
        return self._paused

    def mark_step(self, step):
        """Starts training step ``step``: finishes the open execution, raises a pending
        stop (``stop_on_nonfinite``), then opens or closes the trace window.

        The numerics series (``trends.py``) writes the summary of the step that
        ends. From another thread only the number changes (and the series step):
        the hooks and the dispatch mode belong to the capturing thread.
        """
        if threading.get_ident() != self._thread:
            self.step = step
            self.trends.mark(step)
            return
        if not self._paused and self.acquire():
            try:
                self.switch(None, open_new=False)
            except Exception as exc:
                self.fail("step mark", exc)
            finally:
                self.release()
        self.raise_pending_stop()
        self.step = step
        self.trends.mark(step)
        self.forget_nonfinite()
        inside = self._windows is None or step in self._windows
        if inside and self._paused:
            self._resume()
        elif not inside and not self._paused:
            self._pause()

    def _activate(self):
        """Installs the hooks and enters the dispatch mode or the native hook of
        ``capture_path`` (unless it never left)."""
        self._handles = self._register_hooks()
        if self._mode is None:
            if self.capture_path == "native":
                self._mode = NativeHook(self)
            else:
                self._mode = (CompiledCaptureMode if self.compiled_capture else CaptureMode)(self)
            self._mode.__enter__()

    def _deactivate(self):
        """Removes the hooks and leaves the dispatch mode when it is the innermost one
        (the native hook, which is not stacked, always)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        mode = self._mode
        if mode is not None and (type(mode) is NativeHook or _get_current_dispatch_mode() is mode):
            self._mode = None
            try:
                mode.__exit__(None, None, None)
            except Exception as exc:
                self.fail("leaving the dispatch mode", exc)

    def _pause(self):
        # The token stays taken until _resume: ops that still reach a mode left
        # installed pass through unrecorded, and so does the flush thread's hook.
        self.acquire()
        self.gate.clear()
        self._paused = True
        self.scopes.reset()
        self._deactivate()

    def _resume(self):
        self.scopes.reset()
        self._activate()
        self._paused = False
        self.release()
