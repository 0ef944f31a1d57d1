"""DistributedLauncher: environment detection and the mapping to torch variables."""

import os
import socket
import sys
from argparse import Namespace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from processes import start

from brain_trainer import ConfigError, DistributedConfig, DistributedLauncher
from brain_trainer.parallel.launcher import detect_environment, expand_nodelist, held_port, tasks_on_node, torch_environment

ALL_VARIABLES = (
    "TORCHELASTIC_RUN_ID", "GROUP_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
    "SLURM_JOB_NODELIST", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK",
)  # fmt: skip

TORCHRUN = dict(TORCHELASTIC_RUN_ID="abc", GROUP_RANK="1", RANK="5", WORLD_SIZE="8", LOCAL_RANK="1",
                LOCAL_WORLD_SIZE="4", MASTER_ADDR="job-worker-0.job-workers", MASTER_PORT="29400")  # fmt: skip
SLURM = dict(SLURM_PROCID="6", SLURM_NTASKS="8", SLURM_LOCALID="2", SLURM_NODEID="1",
             SLURM_JOB_NODELIST="node[01-04,07]", SLURM_TASKS_PER_NODE="4(x2)")  # fmt: skip
MANUAL = dict(RANK="3", WORLD_SIZE="4", MASTER_ADDR="10.0.0.1")


@pytest.fixture
def clean_env(monkeypatch):
    """The test process's own launcher variables removed, restored afterwards."""
    for key in ALL_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "variables, expected",
    [
        (TORCHRUN, "torchrun"),
        ({"GROUP_RANK": "0"}, "torchrun"),
        ({**SLURM, **MANUAL}, "slurm"),
        (SLURM, "slurm"),
        ({"SLURM_PROCID": "0"}, "single"),  # an interactive salloc shell without srun
        (MANUAL, "manual"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "single"),
        ({}, "single"),
    ],
)
def test_detect_environment_from_process_environment(clean_env, variables, expected):
    for key, value in variables.items():
        clean_env.setenv(key, value)
    assert DistributedLauncher(DistributedConfig()).detect_environment() == expected
    assert detect_environment(variables) == expected  # the pure function agrees on a plain mapping


def test_torchrun_variables_pass_through_unchanged():
    out = torch_environment(TORCHRUN, DistributedConfig())
    assert out == {key: TORCHRUN[key] for key in out}
    assert set(out) == {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def test_slurm_mapping():
    out = torch_environment(SLURM, DistributedConfig(master_port=29511))
    assert out == dict(RANK="6", WORLD_SIZE="8", LOCAL_RANK="2", LOCAL_WORLD_SIZE="4",
                       MASTER_ADDR="node01", MASTER_PORT="29511")  # fmt: skip


def test_slurm_explicit_master_wins_and_tasks_per_node_follows_the_node():
    env = {**SLURM, "SLURM_TASKS_PER_NODE": "2,4(x2)", "SLURM_NODEID": "2", "SLURM_LOCALID": "3",
           "MASTER_ADDR": "head", "MASTER_PORT": "4000", "SLURM_NTASKS": "10", "SLURM_PROCID": "9"}  # fmt: skip
    out = torch_environment(env, DistributedConfig())
    assert (out["MASTER_ADDR"], out["MASTER_PORT"], out["LOCAL_WORLD_SIZE"]) == ("head", "4000", "4")


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("gpu7", ["gpu7"]),
        ("a1,b[8-10]", ["a1", "b8", "b9", "b10"]),
        ("rack[1-2]-n[0-1]", ["rack1-n0", "rack1-n1", "rack2-n0", "rack2-n1"]),
        ("x[3],y", ["x3", "y"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["node[01-04", "node[a-b]", "node[5-2]", ",", "node]1"])
def test_bad_nodelist_names_the_variable(nodelist):
    with pytest.raises(ConfigError, match=r"^SLURM_JOB_NODELIST: .*"):
        expand_nodelist(nodelist)


def test_tasks_per_node_runs():
    assert [tasks_on_node("2(x3),1", n) for n in range(4)] == [2, 2, 2, 1]
    with pytest.raises(ConfigError, match=r"SLURM_NODEID: must be < the 4 nodes"):
        tasks_on_node("2(x3),1", 4)


def test_manual_mapping_derives_local_rank_from_nodes():
    out = torch_environment(MANUAL, DistributedConfig(num_nodes=2, master_port=29600))
    assert out == dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                       MASTER_ADDR="10.0.0.1", MASTER_PORT="29600")  # fmt: skip


def test_single_process_gets_rank_zero_of_one_on_port_0():
    # Its store binds whatever port the kernel gives it: no port is chosen first and bound later.
    assert torch_environment({}, DistributedConfig()) == dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                                                              LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                                                              MASTER_PORT="0")  # fmt: skip
    with pytest.raises(ConfigError, match=r"^MASTER_PORT: must be >= 1, got 0$"):  # the other ranks could not find it
        torch_environment({**MANUAL, "MASTER_PORT": "0"}, DistributedConfig())


def test_a_held_port_is_nobody_elses_until_a_server_listens_on_it():
    with held_port() as port:
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
        # A server that sets SO_REUSEADDR, as HTTPServer and torch's TCPStore do, still gets it.
        server = ThreadingHTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler)
        server.server_close()


@pytest.mark.parametrize(
    "env, message",
    [
        ({**SLURM, "SLURM_PROCID": "six"}, "SLURM_PROCID: must be an integer, got 'six'"),
        ({**SLURM, "SLURM_PROCID": "8"}, "RANK: must be < WORLD_SIZE (8), got 8"),
        ({**SLURM, "SLURM_NTASKS": "0"}, "SLURM_NTASKS: must be >= 1, got 0"),
        ({**SLURM, "SLURM_LOCALID": "4"}, "LOCAL_RANK: must be < LOCAL_WORLD_SIZE (4), got 4"),
        ({**SLURM, "SLURM_TASKS_PER_NODE": "four"}, "SLURM_TASKS_PER_NODE: cannot parse 'four'"),
        ({**MANUAL, "MASTER_PORT": "70000"}, "MASTER_PORT: must be <= 65535, got 70000"),
        ({**MANUAL, "WORLD_SIZE": "-1"}, "WORLD_SIZE: must be >= 1, got -1"),
        ({**TORCHRUN, "LOCAL_WORLD_SIZE": ""}, "LOCAL_WORLD_SIZE: must be set in the environment"),
    ],
)
def test_bad_environment_gets_one_clear_error(env, message):
    with pytest.raises(ConfigError) as info:
        torch_environment(env, DistributedConfig())
    assert [str(e) for e in info.value.errors] == [message]


def test_manual_world_size_must_split_over_nodes():
    with pytest.raises(ConfigError, match=r"WORLD_SIZE: must be a multiple of distributed.num_nodes \(3\), got 4"):
        torch_environment(MANUAL, DistributedConfig(num_nodes=3))


def test_launch_exports_variables_then_runs_in_this_process(clean_env):
    for key, value in SLURM.items():
        clean_env.setenv(key, value)
    seen = []

    def train(args):
        seen.append((args.tag, os.getpid(), {key: os.environ[key] for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}))

    DistributedLauncher(DistributedConfig()).launch(train, Namespace(tag="run"))
    assert seen == [("run", os.getpid(), {"RANK": "6", "WORLD_SIZE": "8", "MASTER_ADDR": "node01"})]


def test_launch_into_a_given_mapping_leaves_the_process_alone(clean_env):
    environ = dict(MANUAL)
    DistributedLauncher(DistributedConfig(), environ=environ).launch(lambda args: None, Namespace())
    assert environ["LOCAL_RANK"] == "3" and "RANK" not in os.environ


def test_a_manual_launch_takes_its_layout_from_the_config(clean_env):
    layout = DistributedConfig(num_nodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29600)
    assert DistributedLauncher(layout, environ={}).detect_environment() == "manual"
    assert torch_environment({}, layout) == dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                                                 MASTER_ADDR="10.0.0.1", MASTER_PORT="29600")  # fmt: skip
    # Two processes per node: the second one of node 1 is rank 3 of 4.
    per_node = torch_environment({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, layout)
    assert (per_node["RANK"], per_node["WORLD_SIZE"], per_node["LOCAL_RANK"]) == ("3", "4", "1")
    # One trainer.yaml for every node: NODE_RANK and MASTER_* in the environment win.
    node0 = torch_environment({"NODE_RANK": "0", "MASTER_ADDR": "head", "MASTER_PORT": "1234"}, layout)
    assert (node0["RANK"], node0["MASTER_ADDR"], node0["MASTER_PORT"]) == ("0", "head", "1234")
    with pytest.raises(ConfigError, match=r"^NODE_RANK: must be < distributed.num_nodes \(2\), got 2$"):
        torch_environment({"NODE_RANK": "2"}, layout)


def test_two_nodes_launched_by_hand_train_together(tmp_path):
    """`python -m brain_trainer` started by hand on two "nodes": the config's layout forms one group."""
    env = {k: v for k, v in os.environ.items() if k not in ALL_VARIABLES}
    argv = [sys.executable, "-m", "brain_trainer", "--config", tmp_path / "trainer.yaml"]
    # Held until node 0's store listens on it: nobody takes the port the config names in between.
    with held_port() as port:
        config = {
            "training": {"steps": 3, "micro_batch_size": 2, "seq_len": 16, "log_interval": 1},
            "distributed": {"strategy": "ddp", "num_nodes": 2, "master_addr": "127.0.0.1", "master_port": port},
            "data": {"source": "synthetic", "num_samples": 64},
            "checkpoint": {"enabled": False},
            "metrics": {"port": 0},
        }
        (tmp_path / "trainer.yaml").write_text(yaml.safe_dump(config))
        with (start(argv, timeout=300, env={**env, "NODE_RANK": "0", "OMP_NUM_THREADS": "1"}) as node0,
              start(argv, timeout=300, env={**env, "NODE_RANK": "1", "OMP_NUM_THREADS": "1"}) as node1):
            codes = [node0.wait(), node1.wait()]
    assert codes == [0, 0], [node0.output, node1.output]
    assert "with ddp on 2 rank(s)" in node0.output and "step 3/3" in node0.output
