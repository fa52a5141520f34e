"""Serving the frontend's files: explicit MIME types, nothing outside its directory.

TensorBoard answers with ``X-Content-Type-Options: nosniff``, so a module
served with a guessed or missing type would not run: every type is set
here explicitly, and files of other types are not served at all.
"""

import importlib.util
import os

from tensorboard.backend import http_util
from werkzeug import wrappers

_FRONTEND_PACKAGE = "tb_numerics_plugin.frontend"
MIME_TYPES = {
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".html": "text/html",
    ".json": "application/json",
    ".svg": "image/svg+xml",
}
_NOT_FOUND = "Not found"


def _package_dir():
    """Directory of ``tb_numerics_plugin``, found without importing anything heavy."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_frontend_dir():
    """Returns the directory holding the frontend's files, or None.

    Looked up, in order: the ``tb_numerics_plugin.frontend`` package as the
    import system sees it (a wheel, or an install that maps it), the
    ``frontend`` directory inside the package (wheel layout), and the
    repository's top-level ``frontend/`` (a source checkout or an editable
    install, whose finder does not expose the data-only package).

    Returns:
      str or None: an absolute, symlink-resolved directory path.
    """
    candidates = []
    try:
        spec = importlib.util.find_spec(_FRONTEND_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        candidates.extend(spec.submodule_search_locations or [])
    package = _package_dir()
    candidates.append(os.path.join(package, "frontend"))
    candidates.append(os.path.join(os.path.dirname(package), "frontend"))
    for candidate in candidates:
        if os.path.isdir(candidate):
            return os.path.realpath(candidate)
    return None


def resolve(root, relative):
    """Returns the file ``relative`` names under ``root``, or None if it may not be served.

    Refused: empty names, absolute paths, backslashes, NUL, ``.``/``..`` or
    empty segments, hidden files, unknown extensions, anything that is not a
    regular file, and anything whose resolved path (symlinks followed) lies
    outside ``root``.

    Args:
      root: the frontend directory (absolute, symlink-resolved).
      relative: the path after ``static/`` in the request, already URL-decoded.

    Returns:
      str or None: the absolute path of a servable file.
    """
    if root is None or not relative or "\\" in relative or "\0" in relative:
        return None
    if relative.startswith("/"):
        return None
    segments = relative.split("/")
    if any(s in ("", ".", "..") or s.startswith(".") for s in segments):
        return None
    if os.path.splitext(relative)[1].lower() not in MIME_TYPES:
        return None
    path = os.path.realpath(os.path.join(root, *segments))
    if os.path.commonpath([root, path]) != root or not os.path.isfile(path):
        return None
    return path


class StaticFiles:
    """A WSGI app serving ``<prefix><file>`` from the frontend directory.

    Args:
      prefix: the URL path part before the file name, ending in ``/``
        (e.g. ``/data/plugin/numerics/static/``).
      root: the directory to serve; :func:`find_frontend_dir` if None.
    """

    def __init__(self, prefix, root=None):
        self._prefix = prefix
        self._root = root if root is not None else find_frontend_dir()

    @wrappers.Request.application
    def __call__(self, request):
        path = request.path
        relative = path[len(self._prefix):] if path.startswith(self._prefix) else ""
        target = resolve(self._root, relative)
        if target is None:
            return http_util.Respond(request, _NOT_FOUND, "text/plain", code=404)
        with open(target, "rb") as f:
            content = f.read()
        mime = MIME_TYPES[os.path.splitext(target)[1].lower()]
        return http_util.Respond(request, content, mime)
