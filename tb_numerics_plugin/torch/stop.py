"""``stop_on_nonfinite``: stop training at the first non-finite value that matters.

Two stages, so that a masked -inf (an attention mask that softmax turns
finite) never stops training and a healthy step pays almost nothing:

1. A cheap trigger, from health rows the capture fetches anyway at execution
   boundaries (never a device sync per op): the tensor ids whose health shows
   inf/NaN are remembered for the current step, and a trigger fires when one
   of them is the root model's output (forward post-hook), the loss backward
   starts from (the first node autograd evaluates), a gradient or parameter an
   optimizer step reads (pre-hook), or a parameter it wrote (post-hook).
2. The real decision: the writer is flushed, the dump read back with the
   project's reader and :func:`analysis.analyze_run` decides with the lineage
   rule (docs/lineage.md). When this process's file set holds a propagating
   non-finite tensor, the story is printed to stderr and
   :class:`NonFiniteError` is raised from the training step: at once from a
   forward or optimizer hook, else at the next root forward, optimizer step or
   ``step()`` mark. Otherwise training continues.
"""

import logging
import math
import os
import sys

from tb_numerics_plugin.torch.tags import TENSOR_ID, producer_tag

_log = logging.getLogger("tb_numerics_plugin.torch")
_BAD_IDS_MAX = 100000  # tensor ids remembered per step before the oldest are dropped
_TABLE_ROWS = 12


class NonFiniteError(RuntimeError):
    """Raised from the training step when ``stop_on_nonfinite`` finds a propagating
    inf/NaN.

    Attributes:
      step: the training step during which it was found (None before any mark).
      report: the ``analyze_run`` dict of the dump (``report["first_bad_tensor"]``
        is the story), or None when the dump could not be analyzed.
    """

    def __init__(self, message, step=None, report=None):
        super().__init__(message)
        self.step = step
        self.report = report


class NonFiniteWatch:
    """The stop half of ``capture.Session`` (a mixin sharing the session's state).

    Uses the session's ``acquire``, ``release``, ``fail``, ``switch``, ``writer``,
    ``step``, ``encoder.nonfinite``, ``scopes`` (``param_name``, ``reset``) and ``_seq_ops``.
    """

    def _init_watch(self, enabled):
        self.watch_nonfinite = bool(enabled)
        self._bad_ids = set()
        self._stop_reason = None
        self._reader_run = None

    def forget_nonfinite(self):
        """Drops the remembered bad tensor ids (a new step starts)."""
        self._bad_ids.clear()

    def note_nonfinite(self, seg, rows):
        """Remembers the tensor ids of a finished segment whose health shows inf/NaN."""
        bad = self._bad_ids
        if len(bad) > _BAD_IDS_MAX:
            bad.clear()
        nonfinite = self.encoder.nonfinite
        for _, _, tensor_id, payload, *_ in seg.traces:
            if nonfinite(payload, rows):
                bad.add(tensor_id)
        for _, _, _, outs, *_ in seg.eager:
            for payload, _, _, tensor_id in outs:
                if nonfinite(payload, rows):
                    bad.add(tensor_id)

    # ---- triggers (called with the recording token held) --------------------
    def check_root_outputs(self, seg):
        """Trigger: a root forward returned a non-finite value."""
        bad = self._bad_ids
        if bad and any(i in bad for i in seg.output_ids):
            self._stop_reason = "the output of %s" % seg.name

    def check_loss(self, node):
        """Trigger: backward starts from a non-finite loss (``node``: the first node)."""
        if not self._bad_ids or node is None:
            return
        fwd = self._seq_ops.get(node._sequence_nr())
        if fwd is not None and fwd[2] in self._bad_ids:
            self._stop_reason = "the loss backward started from (%s)" % fwd[0]

    def check_optimizer(self, optimizer, grads):
        """Trigger: an optimizer step reads (``grads=True``) or wrote a non-finite value.

        Returns:
          whether the trigger fired.
        """
        bad = self._bad_ids
        if not bad:
            return False
        verb = "read by" if grads else "written by"
        for group in optimizer.param_groups:
            for p in group["params"]:
                pairs = ((p.grad, "gradient"), (p, "parameter")) if grads else ((p, "parameter"),)
                for t, what in pairs:
                    tag = producer_tag(t) if t is not None else None
                    if tag is not None and tag[TENSOR_ID] in bad:
                        name = self.scopes.param_name(p) or "#%d" % tag[TENSOR_ID]
                        self._stop_reason = "the %s %s %s %s.step" % (
                            what, name, verb, type(optimizer).__name__)
                        return True
        return False

    # ---- stopping -------------------------------------------------------------
    def raise_pending_stop(self):
        """Decides a fired trigger (without holding the token): raises NonFiniteError when
        the dump holds a propagating non-finite tensor, else forgets the trigger.

        Returns:
          True when it decided to go on: the execution in progress was closed and the
          scopes reset (a hook that returns into the call opens it again); else False.
        """
        reason, self._stop_reason = self._stop_reason, None
        if reason is None or not self.watch_nonfinite:
            return False
        held = self.acquire()  # the analysis's own work must not be recorded
        try:
            if held:
                self.switch(None, open_new=False)
                self.scopes.reset()  # raised from a boundary: no call is open any more
            self.writer.flush()
            report, ours = self._analyze_dump()
        except Exception as exc:  # analysis is best effort: the trigger alone says "non-finite"
            self.fail("stop_on_nonfinite analysis", exc)
            report, ours = None, True
        finally:
            if held:
                self.release()
        if not ours:
            _log.info("tb-numerics: a non-finite value reached %s at step %s, but every path "
                      "of it is masked (docs/lineage.md): training continues", reason, self.step)
            return True
        self.watch_nonfinite = False  # one stop per capture
        story = format_story(reason, self.step, report, self._reader_run, self._host_label(),
                             os.path.dirname(self.writer.prefix))
        sys.stderr.write(story)
        sys.stderr.flush()
        raise NonFiniteError(_message(reason, self.step, report), step=self.step, report=report)

    def _host_label(self):
        return os.path.basename(self.writer.prefix).split(".", 2)[2]

    def _analyze_dump(self):
        """Returns (analyze_run dict, whether this file set holds a propagating inf/NaN)."""
        from tb_numerics_plugin.analysis import alerts, analyze_run
        from tb_numerics_plugin.reader import Logdir

        if self._reader_run is None:
            self._reader_run = Logdir(os.path.dirname(self.writer.prefix)).run(".")
        run = self._reader_run
        run.update()
        report = analyze_run(run)
        label = self._host_label()
        ours = label in run.hosts and alerts.counts(run, label)["InfNan"] > 0
        return report, ours


def _where(first):
    src = first.get("source") or first.get("user_source")
    return "%s:%s" % (src["file"], src["line"]) if src else "an unknown line"


def _message(reason, step, report):
    first = report and report.get("first_bad_tensor")
    if not first:
        return "non-finite value in %s at step %s (the dump could not name its origin)" % (
            reason, step)
    return "non-finite value in %s at step %s; first bad tensor: %s (%s) at %s: %s" % (
        reason, step, first["op_type"], first["op_name"], _where(first), first["explanation"])


def _number(health, key):
    value = health.get(key) if health else None
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return "%.3e" % value if math.isfinite(value) else str(value)


def format_story(reason, step, report, run, host, dump_dir):
    """The text printed to stderr when training stops: the first bad tensor (op,
    module, source line, explanation) and the last traced tensors up to it, in the
    layout of HF's ``DebugUnderflowOverflow`` frames (abs-min/abs-max with
    FULL_NUMERICS, inf/NaN counts with every health mode)."""
    lines = ["", "tb-numerics: stop_on_nonfinite: a non-finite value reached %s at step %s."
             % (reason, step)]
    first = report and report.get("first_bad_tensor")
    if not first:
        lines.append("The dump could not name the first bad tensor: tb-numerics report %s"
                     % dump_dir)
        return "\n".join(lines) + "\n"
    src = first.get("source") or first.get("user_source") or {}
    lines.append("First bad tensor: %s  %s  (module %s, step %s)" % (
        first["op_type"], first["op_name"], first.get("module") or "-",
        first.get("step", step)))
    lines.append("  at %s" % _where(first))
    if src.get("code"):
        lines.append("    %s" % src["code"].strip())
    lines.append("  " + first["explanation"])
    if run is not None and first["kind"] == "graph_execution_trace" and first["host"] == host:
        end = first["index"] + 1
        digests = run.graph_execution_trace_digests(max(0, end - _TABLE_ROWS), end, host)
        lines.append("Last traced tensors up to it "
                     "(abs min nonzero / abs max with FULL_NUMERICS):")
        lines.append("  %8s %6s %10s %10s %7s %7s %7s  %s" % (
            "trace", "step", "abs min", "abs max", "nan", "-inf", "+inf", "op name (op type)"))
        for d in digests:
            h = d["health"] or {}
            step_of = d.get("step")
            lines.append("  %8d %6s %10s %10s %7s %7s %7s  %s (%s)" % (
                d["index"], "-" if step_of is None else step_of,
                _number(h, "abs_min_nonzero"), _number(h, "abs_max"),
                h.get("nan", "-"), h.get("neg_inf", "-"), h.get("pos_inf", "-"),
                d["op_name"], d["op_type"]))
    lines.append("Training stopped: tb_numerics_plugin.torch.NonFiniteError. Full report: "
                 "tb-numerics report %s" % dump_dir)
    return "\n".join(lines) + "\n"
