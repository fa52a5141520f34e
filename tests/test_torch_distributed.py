"""torch.distributed: each rank writes its own file set into one dump root."""

import subprocess
import sys
import textwrap

from tb_numerics_plugin.analysis import analyze_run
from tb_numerics_plugin.reader import Logdir
from processes import free_port

WORKER = textwrap.dedent('''
    import sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from tb_numerics_plugin import torch as tbn

    dump_root = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    with tbn.enable_dump_debug_info(dump_root, "FULL_HEALTH", circular_buffer_size=-1):
        for _ in range(2):
            x = torch.randn(3, 4)
            if rank == 1:
                x[0, 0] = float("inf")  # only rank 1 goes bad
            model(x).sum().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
    dist.destroy_process_group()
''')


def test_two_gloo_ranks_write_two_file_sets_that_the_reader_merges(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    dump = tmp_path / "dump"
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2",
               "RANK": str(rank), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script), str(dump)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()[-3000:]
    run = Logdir(str(dump)).run(".")
    run.update()
    assert len(run.hosts) == 2 and all(h.endswith(("rank0", "rank1")) for h in run.hosts)
    rank0, rank1 = sorted(run.hosts)
    assert len(run.tfdbg_run_ids) == 1  # one job, one run id, agreed without talking
    assert run.num_graph_execution_traces(rank0) > 0
    # rank 0's own inputs are finite: its first bad value arrives through all_reduce
    bad0 = run.execution(int(run.bad_execution_indices(rank0)[0]), rank0)
    assert bad0["op_type"].startswith("c10d.allreduce")
    first = run.graph_execution_trace(int(run.bad_trace_indices(rank1)[0]), rank1)
    assert first["op_type"] == "aten.addmm.default"
    assert "task:1" in first["device_name"]
    summary = analyze_run(run)
    assert sorted(summary["hosts"]) == [rank0, rank1]
