"""Whose code a stack frame is: framework, model library, or the user's own
(the rule, :func:`frame_kind`, lives in :mod:`tb_numerics_plugin.schema`).

- **framework**: torch, TensorFlow, Keras, NumPy, the Python standard
  library, interpreter pseudo-files (``<string>``) and this package (its
  demos excepted);
- **model**: other installed packages (``site-packages``/``dist-packages``),
  such as transformers: the code that defines the model;
- **user**: everything else, the user's own files.

A first bad tensor's ``source`` is its innermost model-or-user frame;
``user_source`` its innermost user frame. Only framework frames fold away.
"""

from tb_numerics_plugin.schema import FRAME_KINDS as KINDS  # noqa: F401
from tb_numerics_plugin.schema import FRAMEWORK, MODEL, USER, frame_kind  # noqa: F401


def is_library(path):
    """True when ``path`` is not the user's own code (framework or installed package)."""
    return frame_kind(path) != USER


def user_frame(run, stack_frame_ids, host, kinds=(USER,)):
    """The innermost frame of a stack whose kind is in ``kinds`` (ids ordered outermost
    first, as tfdbg2 writes); by default the user's own code.

    Returns:
      ``{"file", "line", "code", "func", "file_index"}`` with ``code`` taken
      from the dump's own SourceFile snapshot (falling back to the frame's
      ``code`` field), or None when no frame is user code or ids are unknown.
    """
    try:
        frames = run.stack_frames(list(stack_frame_ids), host=host)
    except KeyError:
        frames = []
    for frame in reversed(frames):
        if frame_kind(frame["file_path"]) not in kinds:
            continue
        return {
            "file": frame["file_path"],
            "line": frame["lineno"],
            "code": _code_line(run, frame, host),
            "func": frame["func"],
            "file_index": frame["file_index"],
            "kind": frame_kind(frame["file_path"]),
        }
    return None


def _code_line(run, frame, host):
    try:
        lines = run.source_file(frame["file_index"], host=host)["lines"]
    except (IndexError, ValueError, OSError):
        lines = []
    if 1 <= frame["lineno"] <= len(lines):
        return lines[frame["lineno"] - 1].strip()
    return (frame["code"] or "").strip()


def model_frame(run, stack_frame_ids, host):
    """The innermost frame of model or user code (see the module docstring), or None."""
    return user_frame(run, stack_frame_ids, host, kinds=(MODEL, USER))
