"""The capture's private TorchDispatchMode: each op called once, its result returned untouched.

Every aten op reaches :meth:`CaptureMode.__torch_dispatch__`, which calls the
op and only then hands it to the session for recording; a failure inside the
recording is counted and swallowed, never raised into the user's step.
"""

import sys

from torch._C._dynamo.eval_frame import set_eval_frame as _set_eval_frame
from torch._ops import OpOverload as _OpOverload
from torch.utils._python_dispatch import TorchDispatchMode

from tb_numerics_plugin.torch.compiled.custom_ops import instrumented
from tb_numerics_plugin.torch.compiled.frames import called_from_compiled


class CaptureMode(TorchDispatchMode):
    """Calls each op once, returns its result untouched, then records it."""

    def __init__(self, session):
        super().__init__()
        self._session = session
        # Dynamo must never compile this frame (it would, as a frame called while a
        # compiled region runs eagerly under the mode); torch's own wrapper imports
        # torch._dynamo on the first op as well.
        from torch._dynamo import decorators

        decorators.skip(type(self).__torch_dispatch__)

    @classmethod
    def _should_skip_dynamo(cls):
        # False stops torch from wrapping __torch_dispatch__ in torch._dynamo.disable
        # (three Python frames, ~1 µs per op); the method turns Dynamo's frame hook
        # off itself, which is all that wrapper does in the default stance.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        prior = _set_eval_frame(None)  # Dynamo must not trace the op call nor the recording
        try:
            # OpOverload.__call__ is one Python frame around func._op (subclasses do more)
            call = func._op if type(func) is _OpOverload else func
            out = call(*args, **kwargs) if kwargs else call(*args)
            # Ops called by compiled code (CompiledCaptureMode) are the graph's, recorded
            # by custom_ops.emit; no frame walk until a graph was instrumented.
            if not (instrumented and called_from_compiled(sys._getframe(1))):
                self._session.record_op(func, args, kwargs, out)
            return out
        finally:
            _set_eval_frame(prior)


class CompiledCaptureMode(CaptureMode):
    """The mode when compiled regions keep compiled (``compiled/``).

    ``torch.compile`` compiles under it (``ignore_compile_internals``) instead
    of running eagerly; the ops compiled code calls through the dispatcher
    (extern kernels, fallbacks) still reach the mode at run time and are
    passed through unrecorded: the graph's own record comes from ``compiled.custom_ops.emit``.
    """

    @classmethod
    def ignore_compile_internals(cls):
        return True
