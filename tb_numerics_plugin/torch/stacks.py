"""Call sites of ops: the user's frames, snapshotted once into the dump.

The hot path (:meth:`StackTracker.call_site`) hops up from the dispatch frame
past framework frames (a dict lookup per code object) to the first user frame,
and looks its ``(code object, f_lasti)`` up in a cache. Only on a miss does it
walk the rest of the stack, snapshot the source files of user frames (through
``FileSetWriter.add_source_file``) and write ``StackFrameWithId`` records.

Framework code (torch, TensorFlow, NumPy, Python's standard library, this
package except its demos: ``schema.frame_kind``) is skipped unless
``include_framework`` is set: frames must point into snapshotted files, and
snapshotting torch itself would bloat every dump.
"""

import linecache
import os
import sys
import sysconfig

import torch

from tb_numerics_plugin import schema
from tb_numerics_plugin.proto import debug_event_pb2
from tb_numerics_plugin.torch.compiled.frames import generated_dir

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEMO_DIR = os.path.join(_PACKAGE_DIR, "demo") + os.sep
_FRAMEWORK_DIRS = tuple(
    os.path.normcase(os.path.realpath(p)) + os.sep
    for p in (
        os.path.dirname(torch.__file__),
        _PACKAGE_DIR,
        sysconfig.get_paths()["stdlib"],
    )
)
# User frames kept per call site, innermost last; deeper stacks are cut at the outer end.
MAX_FRAMES = 32


def is_framework_file(path):
    """True for framework files, by the one rule the reader applies too
    (:func:`tb_numerics_plugin.schema.frame_kind`), for files under the
    real directories of torch, the standard library and this package (its
    demos excepted) wherever they are installed, and for the code
    ``torch.compile`` generates."""
    if schema.frame_kind(path) == schema.FRAMEWORK:
        return True
    real = os.path.normcase(os.path.realpath(path))
    if real.startswith(os.path.normcase(os.path.realpath(_DEMO_DIR))):
        return False
    return real.startswith(_FRAMEWORK_DIRS) or real.startswith(generated_dir())


class StackTracker:
    """Maps the current call site to ``StackFrameWithId`` ids written into a dump.

    Args:
      writer: the ``FileSetWriter`` receiving source files and stack frames.
      include_framework: also keep (and snapshot) framework frames.
    """

    def __init__(self, writer, include_framework=False):
        self._writer = writer
        self._include_framework = include_framework
        # Keyed by id(code): hashing a code object hashes its bytecode and constants
        # every time (~0.3 µs, once per frame walked per op); _codes keeps every key's
        # code object alive, so an id is never reused while it is a key.
        self._is_user = {}  # id(code object) -> bool
        self._codes = {}  # id(code object) -> code object
        self._sites = {}  # (id(code object), f_lasti) -> tuple of frame ids, outermost first
        self._frame_ids = {}  # (file_index, line, func) -> frame id
        self._files = {}  # file path -> file_index, or None when unreadable

    def set_include_framework(self, include_framework):
        """Changes ``include_framework`` (a later enable): call sites are walked again."""
        if include_framework != self._include_framework:
            self._include_framework = include_framework
            self._sites.clear()

    def _user_code(self, code):
        user = self._is_user.get(id(code))
        if user is None:
            self._codes[id(code)] = code
            user = self._is_user[id(code)] = not is_framework_file(code.co_filename)
        return user

    def user_frame(self, skip=2):
        """The innermost user frame above the caller (``skip`` as :meth:`call_site`), or None."""
        return self.first_user_frame(sys._getframe(skip))

    def first_user_frame(self, f):
        """Frame ``f`` or the innermost user frame outside it, or None."""
        is_user = self._is_user  # known codes answered without a call (once per op)
        while f is not None:
            user = is_user.get(id(f.f_code))
            if user is None:
                user = self._user_code(f.f_code)
            if user:
                return f
            f = f.f_back
        return None

    def frame_site(self, f):
        """The frame ids of the user frames from user frame ``f`` outward (one
        :meth:`user_frame` found), outermost first; cached per code location."""
        if f is None:
            return ()
        key = (id(f.f_code), f.f_lasti)  # the code object is kept by _user_code
        ids = self._sites.get(key)
        if ids is None:
            ids = self._sites[key] = self._walk(f)
        return ids

    def call_site(self, skip=2):
        """Returns the frame ids of the innermost user call site, outermost first.

        Args:
          skip: frames to skip above the caller (the capture's own frames).

        Returns:
          tuple of str ids; empty when no user frame is on the stack.
        """
        return self.frame_site(self.first_user_frame(sys._getframe(skip)))

    def _walk(self, frame):
        ids = []
        f = frame
        while f is not None and len(ids) < MAX_FRAMES:
            if self._include_framework or self._user_code(f.f_code):
                frame_id = self._frame_id(f)
                if frame_id is not None:
                    ids.append(frame_id)
            f = f.f_back
        ids.reverse()
        return tuple(ids)

    def frame_ids(self, frames):
        """Returns the frame ids of ``(file, line, function)`` triples, outermost first
        (a compiled graph's source lines), keeping the frames a call site would keep."""
        ids = []
        for path, line, func in frames[-MAX_FRAMES:]:
            if not self._include_framework and is_framework_file(path):
                continue
            frame_id = self._location_id(path, line, func)
            if frame_id is not None:
                ids.append(frame_id)
        return tuple(ids)

    def _file_index(self, path):
        if path in self._files:
            return self._files[path]
        lines = [line.rstrip("\r\n") for line in linecache.getlines(path)]
        index = self._writer.add_source_file(path, lines) if lines else None
        self._files[path] = index
        return index

    def _frame_id(self, f):
        return self._location_id(f.f_code.co_filename, f.f_lineno or 0, f.f_code.co_name)

    def _location_id(self, path, line, func):
        file_index = self._file_index(path)
        if file_index is None:
            return None  # no source to point at: TF's reader needs a file per frame
        key = (file_index, line, func)
        frame_id = self._frame_ids.get(key)
        if frame_id is None:
            frame_id = self._frame_ids[key] = "%x" % len(self._frame_ids)
            event = debug_event_pb2.DebugEvent()
            loc = event.stack_frame_with_id
            loc.id = frame_id
            loc.file_line_col.file_index = file_index
            loc.file_line_col.line = line
            loc.file_line_col.func = func
            loc.file_line_col.code = linecache.getline(path, line).strip()
            self._writer.write_event(event)
        return frame_id
