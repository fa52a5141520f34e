"""Where raw health statistics get computed: C on CPU, our CUDA kernels (else Triton) on
CUDA, torch elsewhere.

A :class:`HealthBatch` collects the raw rows of one execution. Each row is
written on the tensor's own device into a preallocated buffer, so no op causes
a device→host copy; :meth:`HealthBatch.fetch` copies every buffer to the host
once (per execution, or when a buffer fills up).

On CUDA our kernels (``kernels_cuda.py``) take one launch per tensor from C,
where Triton takes two from Python (about 50 µs of host time per tensor on an
H200 host); Triton is the fallback where they cannot load, then pure torch.
"""

import numpy as np
import torch

from tb_numerics_plugin.torch import health, kernels_cuda
from tb_numerics_plugin.torch.health import C_CODES, dense_view

try:  # built by setup.py; optional so a machine without a compiler still works
    from tb_numerics_plugin.torch import _health as _c_health
except ImportError:  # pragma: no cover - depends on the build
    _c_health = None

BACKENDS = ("auto", "c", "cuda", "triton", "torch")


def c_kernel_available():
    """True when the C extension was built."""
    return _c_health is not None


def c_api():
    """The C API of the built kernel (``_health.h``), a capsule, for the C recorder."""
    return _c_health.C_API


# What the pure-torch fallback costs on CPU, measured by bench/capture_overhead.py
# (docs/benchmarks.md, "Capture overhead"): the step time with the C kernel is ~1.5x
# the uncaptured step, with pure torch 10-12x.
_NO_C_KERNEL = (
    "the C health kernel (tb_numerics_plugin.torch._health) was not built, most likely because "
    "no C compiler was found when tb-numerics was installed; CPU health then runs in pure "
    "torch, about 10x the uncaptured step time instead of about 1.5x. To build it: install a "
    "C compiler (e.g. `apt-get install gcc`) and reinstall with "
    "`pip install --force-reinstall --no-deps --no-binary tb-numerics tb-numerics`")


def check_backend(backend):
    """Validates a health backend before a capture starts.

    Raises:
      ValueError: unknown backend, or "c" without the C kernel (the message says
        how to build it).
    """
    if backend not in BACKENDS:
        raise ValueError("health_backend must be one of %s, not %r" % (", ".join(BACKENDS),
                                                                      backend))
    if backend == "c" and _c_health is None:
        raise ValueError("health_backend='c': " + _NO_C_KERNEL)
    if backend == "cuda" and not kernels_cuda.ready(torch.device("cuda")):
        raise ValueError("health_backend='cuda': the CUDA health kernels cannot be used: "
                         + kernels_cuda.failure())


def describe_backend(backend):
    """``(summary, warning or None)``: what computes health under ``backend`` on this machine."""
    cpu = "C kernel" if backend != "torch" and _c_health is not None else "pure torch"
    if backend in ("auto", "cuda") and kernels_cuda.cuda_kernels() is not None:
        cuda = "CUDA kernels (PTX)"
    elif backend in ("auto", "triton") and triton_available():
        cuda = "Triton"
    else:
        cuda = "pure torch"
    summary = "CPU tensors: %s; CUDA tensors: %s" % (cpu, cuda)
    warning = _NO_C_KERNEL if backend == "auto" and _c_health is None else None
    return summary, warning


def triton_available():
    """True when Triton and a CUDA device are both usable."""
    if not torch.cuda.is_available():
        return False
    try:
        from tb_numerics_plugin.torch import _triton_health  # noqa: F401
    except ImportError:
        return False
    return True


def c_raw_stats(tensor, level, out=None):
    """Raw row of a CPU tensor through the C kernel.

    Args:
      tensor: CPU tensor of a dtype in ``health.HEALTH_DTYPES``.
      level: ``health.LEVEL_*``: how much of the row to compute.
      out: optional float64 numpy row of ``health.RAW_WIDTH`` to fill.

    Returns:
      the numpy row.

    Raises:
      RuntimeError: the extension is missing.
    """
    if _c_health is None:
        raise RuntimeError("tb_numerics_plugin.torch._health was not built")
    row = np.empty(health.RAW_WIDTH) if out is None else out
    t = dense_view(tensor.detach())
    _c_health.stats(t.data_ptr(), t.numel(), C_CODES[t.dtype], row.ctypes.data, level)
    return row


class _HostRows:
    """Rows filled in place on the host by the C kernel (a ``_health.HostRows``).

    The recorder fills them too, without calling :meth:`add` (``_record_health.c``),
    while they are registered in their batch: ``c.block`` is their index among its
    blocks, -1 when they are in none.
    """

    def __init__(self, capacity):
        self.c = _c_health.HostRows(capacity)
        self.rows = np.frombuffer(self.c, dtype=np.float64).reshape(capacity, health.RAW_WIDTH)

    @property
    def used(self):
        """Rows filled."""
        return self.c.used

    def add(self, tensor, level):
        """Computes the row of a CPU tensor into the next free row; returns its index
        (reserved before the kernel runs, which releases the GIL for large tensors)."""
        t = tensor if tensor.is_contiguous() else dense_view(tensor)
        return self.c.add(t.data_ptr(), t.numel(), C_CODES[t.dtype], level)

    def host(self):
        """Returns the filled rows (a copy: the buffer is reused)."""
        return self.rows[: self.c.used].copy()

    def restart(self, block):
        """Empties the rows (after :meth:`host`) and registers them as ``block`` (or -1)."""
        self.c.used = 0
        self.c.block = block


class _DeviceRows:
    """Rows written on the device (Triton or torch), copied to the host on fetch."""

    def __init__(self, capacity, device, use_triton):
        self.rows = torch.empty((capacity, health.RAW_WIDTH), dtype=torch.float64, device=device)
        self.used = 0
        self._triton = None
        if use_triton:
            from tb_numerics_plugin.torch import _triton_health

            self._triton = _triton_health

    def add(self, tensor, level):
        """Queues the row of a device tensor (kernels launched, no sync); returns its index."""
        row = self.used
        self.used = row + 1
        if self._triton is not None:
            self._triton.raw_stats_into(tensor, level, self.rows[row])
        else:
            self.rows[row].copy_(health.torch_raw_stats(tensor, level))
        return row

    def host(self):
        """Copies the filled rows to the host: the one device sync per buffer."""
        return self.rows[: self.used].cpu().numpy()


class HealthBatch:
    """Raw health rows of many tensors, fetched to the host in one copy per buffer.

    Args:
      backend: "auto" (C on CPU when built; on CUDA the CUDA kernels when they load,
        else Triton when usable; else torch), "c" (C on CPU, torch on CUDA), "cuda" or
        "triton" (that one on CUDA, C on CPU when built) or "torch" (torch everywhere).
      capacity: rows per buffer; a full buffer is copied to the host early.

    Raises:
      ValueError: unknown backend.
    """

    def __init__(self, backend="auto", capacity=2048):
        check_backend(backend)
        self._backend = backend
        self._capacity = capacity
        self._open = {}  # device -> buffer being filled
        self._buffers = []  # every buffer since the last fetch; a token's first item indexes it
        # the CPU rows, reused from fetch to fetch: the recorder holds on to them
        self._host = None
        if backend != "torch" and _c_health is not None:
            self._host = _HostRows(capacity)
        self._cuda = None  # the first CUDA device's rows (kernels_cuda.CudaRows), reused

    def cpu_rows(self, level):
        """The ``_health.HostRows`` of CPU tensors, for the recorder to fill in C at
        ``level`` (``Encoder.cpu_rows``), or None without the C kernel."""
        if self._host is None:
            return None
        self._host.c.level = level
        return self._host.c

    def cuda_rows(self, level):
        """The ``_health.DeviceRows`` of the first CUDA device's tensors, for the recorder
        to queue at ``level``, or None before a CUDA tensor came (or without the CUDA
        kernels)."""
        if self._cuda is None:
            return None
        self._cuda.c.level = level
        return self._cuda.c

    def _new_buffer(self, device):
        kind = device.type
        if kind == "cpu" and self._host is not None:
            self._host.restart(len(self._buffers))
            return self._host
        backend = self._backend
        if kind == "cuda" and backend in ("auto", "cuda") and kernels_cuda.ready(device):
            if self._cuda is None:
                self._cuda = kernels_cuda.CudaRows(self._capacity, device)
            if self._cuda.device == device:
                self._cuda.restart(len(self._buffers))
                return self._cuda
            return kernels_cuda.CudaRows(self._capacity, device)  # another device's
        use_triton = kind == "cuda" and backend in ("auto", "triton") and triton_available()
        return _DeviceRows(self._capacity, device, use_triton)

    def add(self, tensor, level):
        """Queues the raw row of ``tensor`` (computed now, on its device).

        Returns:
          a token for :meth:`fetch`'s result.
        """
        device = tensor.device
        buf = self._open.get(device)
        if buf is None or buf.used == self._capacity:
            if buf is not None:
                index = self._buffers.index(buf)
                self._buffers[index] = _Fetched(buf.host())
            buf = self._open[device] = self._new_buffer(device)
            self._buffers.append(buf)
        row = buf.add(tensor, level)
        last = self._buffers[-1] is buf
        return (len(self._buffers) - 1 if last else self._buffers.index(buf), row)

    def add_rows(self, rows):
        """Queues raw rows computed elsewhere (a compiled graph's ``[n, 12]`` rows).

        Returns:
          the block index: row ``i`` is ``fetch()[index][i]``.
        """
        if rows.device.type == "cpu":
            block = _Fetched(rows.detach().numpy().copy())
        else:  # copied when fetched: no sync now
            block = _DeviceBlock(rows.detach().clone())
        self._buffers.append(block)
        return len(self._buffers) - 1

    def fetch(self):
        """Copies every queued row to the host (one copy per buffer) and resets.

        Returns:
          a list indexed by a token's first item of numpy arrays indexed by its second.
        """
        if not self._buffers:  # nothing queued since the last fetch (NO_TENSOR: never)
            return []
        blocks = [b.host() for b in self._buffers]
        self._open, self._buffers = {}, []
        if self._host is not None:
            self._host.restart(-1)
        if self._cuda is not None:
            self._cuda.restart(-1)
        return blocks


class _DeviceBlock:
    """Rows left on their device until the segment's fetch copies them."""

    def __init__(self, rows):
        self.rows = rows
        self.used = rows.shape[0]

    def host(self):
        """Copies the rows to the host."""
        return self.rows.cpu().numpy()


class _Fetched:
    """A buffer already copied to the host because it filled up."""

    def __init__(self, rows):
        self.rows = rows
        self.used = len(rows)

    def host(self):
        """Returns the rows fetched earlier."""
        return self.rows
