"""Whose code a stack frame is: framework, model library, or the user's own.

- **framework**: torch, TensorFlow, Keras, NumPy, the Python standard
  library, interpreter pseudo-files (``<string>``) and this package (its
  demos excepted);
- **model**: other installed packages (``site-packages``/``dist-packages``),
  such as transformers: the code that defines the model;
- **user**: everything else, the user's own files.

A first bad tensor's ``source`` is its innermost model-or-user frame;
``user_source`` its innermost user frame. Only framework frames fold away.
"""

import re

FRAMEWORK, MODEL, USER = "framework", "model", "user"
KINDS = (FRAMEWORK, MODEL, USER)
# A frame is framework code when its file lives in one of these places.
_FRAMEWORK_PARTS = (
    "/tensorflow/",
    "/torch/",
    "/keras/",
    "/tf_keras/",
    "/numpy/",
    "/jax/",
)
_INSTALLED_PARTS = ("/site-packages/", "/dist-packages/")
# Python's standard library: .../lib/python3.11/<module>.py (not site-packages).
_STDLIB = re.compile(r"[/\\]lib[/\\]python\d+(\.\d+)?[/\\](?!(site|dist)-packages)")
# Our own capture code, unlike our demos, is framework code to a user.
_OURS = "/tb_numerics_plugin/"
_OUR_DEMOS = "/tb_numerics_plugin/demo/"


def frame_kind(path):
    """``"framework"``, ``"model"`` or ``"user"`` for a frame's file path."""
    p = (path or "").replace("\\", "/")
    if not p or p.startswith("<") or "/<" in p:
        return FRAMEWORK  # <string>, <frozen importlib._bootstrap>: nothing to show
    if _OURS in p:
        return USER if _OUR_DEMOS in p else FRAMEWORK
    if any(part in p for part in _FRAMEWORK_PARTS) or _STDLIB.search(p):
        return FRAMEWORK
    if any(part in p for part in _INSTALLED_PARTS):
        return MODEL
    return USER


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
