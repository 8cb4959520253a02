"""Threads from the cores a process has (affinity, a container's CPU quota, its processes), the user's choice
winning, and OpenMP's short spinning set before torch loads. The cgroup files and the affinity are faked."""

import logging
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO

from trunk.training import threads as T


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "max 100000\n"}, None),  # cgroup v2, no limit
        ({"cpu.max": "150000 100000\n"}, 1.5),  # docker --cpus=1.5
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1, no limit
        ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),
        ({"cpu.max": "garbage\n"}, None),  # unreadable: no quota known
        ({}, None),  # no cgroup files (macOS, Windows)
    ],
)
def test_a_containers_cpu_quota_is_read_from_its_cgroup(files, quota, tmp_path):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert T.cgroup_cpu_quota(tmp_path) == quota


def test_threads_follow_the_cores_a_process_has_and_omp_num_threads_wins(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    quota = "a CPU quota of 1.5 cores (cgroup) on 4 of the machine's 64 cores (CPU affinity)"
    assert T.usable_cores(tmp_path) == (2, quota)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert T.usable_cores(tmp_path) == (4, "4 of the machine's 64 cores (CPU affinity)")

    monkeypatch.setattr(T, "usable_cores", lambda: (4, "4 cores"))
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        T.fit_threads(2)  # two processes (DDP on CPU) share the four cores
        assert torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
        T.fit_threads(1)  # the next run in this process chooses again: the value above was Trunk's, not the user's
        assert torch.get_num_threads() == 4 and os.environ["OMP_NUM_THREADS"] == "4"
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice stays
        torch.set_num_threads(3)
        T.fit_threads(1)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_load_lowers_torchs_thread_count_only_past_the_usable_cores(monkeypatch, caplog):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(T, "usable_cores", lambda: (1, "a CPU quota of 1 cores (cgroup) on 64 cores"))
        with caplog.at_level(logging.INFO):
            T.cap_threads()  # torch's 2 exceed the container's 1
        assert torch.get_num_threads() == 1
        assert "Threads: 1, not torch's 2 (a CPU quota of 1 cores" in caplog.text
        monkeypatch.setattr(T, "usable_cores", lambda: (4, "4 cores"))
        T.cap_threads()  # fewer than the cores: the program's own choice stays
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        monkeypatch.setattr(T, "usable_cores", lambda: (1, "1 core"))
        T.cap_threads()  # the user said so
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


SPIN = """
import os, sys
from trunk import cli
sys.argv = ["trunk", "export", "--help"]
try:
    cli.main()
except SystemExit:
    pass
print(os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"))
"""


@pytest.mark.parametrize(
    ("env", "printed"),
    [({}, "1000 None"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "None ACTIVE"), ({"GOMP_SPINCOUNT": "0"}, "0 None")],
)
def test_the_trunk_command_shortens_openmp_spinning_unless_the_user_chose(env, printed):
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", SPIN], env={**clean, **env}, capture_output=True, text=True, cwd=REPO,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == printed


def test_openmps_environment_is_set_before_torch_loads():
    """libgomp reads GOMP_SPINCOUNT once, when torch loads it: the module that sets it must not import torch."""
    code = "import sys; import trunk.cli, trunk.training.threads; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"
