"""The user's source line of an op: the innermost stack frame outside libraries."""

import re

# A frame is library code when its file lives in one of these places.
_LIBRARY_PARTS = (
    "/tensorflow/",
    "/torch/",
    "/site-packages/",
    "/dist-packages/",
    "/keras/",
    "/tf_keras/",
)
# Python's standard library: .../lib/python3.11/<module>.py (not site-packages, which
# the markers above already cover).
_STDLIB = re.compile(r"[/\\]lib[/\\]python\d+(\.\d+)?[/\\]")
# Our own capture code, unlike our demos, is library code to a user.
_OURS = "/tb_numerics_plugin/"
_OUR_DEMOS = "/tb_numerics_plugin/demo/"


def is_library(path):
    """True when ``path`` is library or interpreter code, not the user's."""
    p = path.replace("\\", "/")
    if not p or p.startswith("<") or "/<" in p:
        return True  # <string>, <frozen importlib._bootstrap>: nothing to show
    if any(part in p for part in _LIBRARY_PARTS):
        return True
    if _OURS in p and _OUR_DEMOS not in p:
        return True
    return bool(_STDLIB.search(p))


def user_frame(run, stack_frame_ids, host):
    """The innermost user frame of a stack (ids ordered outermost first, as tfdbg2 writes).

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
        if is_library(frame["file_path"]):
            continue
        return {
            "file": frame["file_path"],
            "line": frame["lineno"],
            "code": _code_line(run, frame, host),
            "func": frame["func"],
            "file_index": frame["file_index"],
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
