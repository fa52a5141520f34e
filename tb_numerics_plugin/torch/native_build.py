"""Building and loading the native hook's extension (``native.py``, ``_native.cpp``).

The extension is compiled against the installed torch on first use
(``torch.utils.cpp_extension``: about a minute on two cores, needs a C++
compiler and ninja) into ``$TB_NUMERICS_CACHE/native`` (else
``~/.cache/tb_numerics/native``), in a directory named after its sources, the
torch and Python versions and the flags, and imported from there afterwards
(no compiler needed then).

Builds in several processes at once (the ranks of one job) take turns: each
runs under an flock of ``BUILD_LOCK`` in that directory, which the kernel
releases when its holder dies, however it dies; a process that finds another
one building says so and waits, then imports what it built. torch's own build
lock, up to torch 2.13 a file it creates, removes when done, and waits on for
ever while it exists, is left behind by a build that was killed; found while
holding the flock, it is stale, whatever its age, and removed. Without
``fcntl`` (not POSIX) a torch lock older than ``STALE_LOCK_S`` is taken as
stale. torch 2.14 holds an OS lock of that file instead, which needs none of
this.

A build that failed (no compiler, no Python headers, a compile error) leaves
``FAILED`` with its reason: later processes report that reason without
building again, which would cost each enable that long again;
``tb-numerics build-native`` (``build(retry=True)``) tries again.
"""

import contextlib
import hashlib
import importlib.util
import logging
import os
import sys
import time

try:
    import fcntl
except ImportError:  # not POSIX: torch's build lock alone, aged out
    fcntl = None

import torch

_log = logging.getLogger("tb_numerics_plugin.torch")
_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(_HERE, name)
           for name in ("_native.cpp", "_native_tags.cpp", "_native_facts.cpp",
                        "_native_values.cpp", "_native_saved.cpp")]
HEADERS = [os.path.join(_HERE, name) for name in ("_native.h", "_native_facts.h")]
CACHE_ENV = "TB_NUMERICS_CACHE"
BUILD_LOCK = "build.flock"
FAILED = "failed.txt"
STALE_LOCK_S = 600

# NDEBUG as torch's own build: torch's headers declare debug-only members
# (RecordFunction's, from the hook's first version), and a layout that differs
# from libtorch's corrupts memory.
_CFLAGS = ["-O2", "-DNDEBUG"]


def cache_dir():
    """Where built extensions are kept: ``$TB_NUMERICS_CACHE``, else ``~/.cache/tb_numerics``."""
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "tb_numerics")
    return os.path.join(root, "native")


def build_name():
    """The extension's name: its sources, the torch and Python versions and the flags."""
    sources = []
    for path in SOURCES + HEADERS:
        with open(path, "rb") as f:
            sources.append(f.read())
    key = b"\0".join(sources + [torch.__version__.encode(), sys.version.encode()]
                     + [flag.encode() for flag in _CFLAGS])
    return "tb_numerics_native_" + hashlib.sha256(key).hexdigest()[:16]


def build(retry=False):
    """The extension's module, imported where it was built before, else built.

    Args:
      retry: build again where an earlier build failed.

    Raises:
      RuntimeError: an earlier build failed (not ``retry``), or this one did; OSError and
        others where the cache cannot be written.
    """
    name = build_name()
    directory = os.path.join(cache_dir(), name)
    built = os.path.join(directory, name + ".so")
    if os.path.exists(built):  # built before: no compiler or ninja needed to import it
        return _import_built(name, built)
    os.makedirs(directory, exist_ok=True)
    failed = os.path.join(directory, FAILED)
    with _builder_lock(directory) as builder_locked:
        if os.path.exists(built):  # built by the process this one waited for
            return _import_built(name, built)
        if retry and os.path.exists(failed):
            os.remove(failed)
        earlier = _read(failed)
        if earlier is not None:
            raise RuntimeError("an earlier build failed and is not tried again (%s; "
                               "`tb-numerics build-native` tries again): %s" % (failed, earlier))
        if lock_file_blocks():
            _drop_stale_lock(os.path.join(directory, "lock"), builder_locked)
        try:
            return _compile(name, directory)
        except Exception as exc:
            _write(failed, "%s: %s" % (type(exc).__name__, str(exc).strip()[:2000]))
            raise


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:  # none: no earlier build failed
        return None


def _write(path, text):
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:  # then the next process builds again
        _log.info("tb-numerics: cannot note the failed build in %s: %s", path, exc)


def _import_built(name, built):
    spec = importlib.util.spec_from_file_location(name, built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _builder_lock(directory):
    """Held while this process builds in ``directory``; yields whether it is an flock (a
    live build in another process is waited for here, with a warning)."""
    if fcntl is None:
        yield False
        return
    with open(os.path.join(directory, BUILD_LOCK), "a") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log.warning("tb-numerics: another process is building the native capture hook in "
                         "%s; waiting for it", directory)
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def lock_file_blocks():
    """Whether torch's extension build waits while its lock file exists (its ``FileBaton``,
    up to torch 2.13), rather than on an OS lock of that file, which dies with its holder
    (torch 2.14's ``FileLock``): only then does a lock left by a killed build hang later
    builds."""
    from torch.utils import cpp_extension

    return hasattr(cpp_extension, "FileBaton")


def _drop_stale_lock(path, builder_locked):
    try:
        age = time.time() - os.path.getmtime(path)
    except OSError:  # no lock: no build in progress
        return
    if builder_locked or age > STALE_LOCK_S:
        _log.warning("tb-numerics: removing %s, a build lock left %.0f s ago by a build that "
                     "did not finish", path, age)
        try:
            os.remove(path)
        except OSError:  # another process removed it first
            pass


def _compile(name, directory):
    from torch.utils import cpp_extension

    # a `pip install ninja` puts ninja beside the interpreter, which may not be on PATH
    here = os.path.dirname(sys.executable)
    if os.path.exists(os.path.join(here, "ninja")) and here not in os.environ.get(
            "PATH", "").split(os.pathsep):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")

    # a warning: the program waits for it (about a minute on two cores), and should say why
    _log.warning("tb-numerics: building the native capture hook for torch %s in %s (once per "
                 "torch version, about a minute; `tb-numerics build-native` does it ahead of "
                 "time, TB_NUMERICS_CAPTURE=python skips it)", torch.__version__, directory)
    return cpp_extension.load(name, SOURCES, extra_cflags=_CFLAGS,
                              build_directory=directory, verbose=False)
