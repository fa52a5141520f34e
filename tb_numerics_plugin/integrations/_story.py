"""The first-bad-tensor story of a dump, as a few lines for stderr (no torch, no TF)."""

from tb_numerics_plugin import schema
from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.reader import Logdir


def analyze(dump_root):
    """``analyze_run`` of the run at ``dump_root`` itself, read from disk now."""
    run = Logdir(dump_root).run(".")
    run.update()
    return analyze_run(run)


def lines(report, headline):
    """Text lines telling ``report``'s first bad tensor (an ``analyze_run`` dict)."""
    out = ["tb-numerics: " + headline]
    fb = report and report.get("first_bad_tensor")
    if not fb:
        out.append("  no propagating inf/NaN found in the dump (mode %s)"
                   % (report or {}).get("tensor_debug_mode", "?"))
        return out
    where = "graph execution trace" if fb["kind"] == "graph_execution_trace" else "execution"
    graph = " in graph %s" % fb["graph_name"] if fb.get("graph_name") else ""
    step = " at step %d" % fb["step"] if fb.get("step") is not None else ""
    out.append("  first bad tensor: %s #%d: %s:%d (%s)%s%s" % (
        where, fb["index"], fb["op_name"], fb["output_slot"], fb["op_type"], graph, step))
    if fb.get("health"):
        out.append("    health: " + schema.counts_phrase(fb["health"]))
    out.append("    why:    " + fb["explanation"])
    for label, src in (("where: ", fb.get("source")), ("called from:", fb.get("user_source"))):
        if src and (label == "where: " or src != fb.get("source")):
            out.append("    %s %s:%d in %s" % (label, src["file"], src["line"], src["func"]))
            out.append("      %d | %s" % (src["line"], src["code"]))
    return out
