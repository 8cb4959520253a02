"""Faults caused for real: SIGKILL at random steps, SIGTERM / SIGINT, NaN, torn and corrupted files.

Runs are real ``trunk fit`` processes (tiny model, fp32, CPU), killed by a callback from tests/faults.py.
"""

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import REPO, logged_metrics
from test_multitask import TRUNK, ner_task, sentiment_task

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH = 16 + 25  # 256 sentiment rows at 16, 200 NER sentences at 8


def fit_args(root: Path, sentiment_files, ner_files, epochs: int = 2) -> list[str]:
    """A two-task run (the sampler's state matters) with a checkpoint every 5 steps."""
    return [
        "fit",
        *TRUNK,
        *sentiment_task(sentiment_files),
        *ner_task(ner_files),
        "--data.tokenizer_vocab_size=300",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        f"--trainer.max_epochs={epochs}",
        "--trainer.precision=32",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}",
        "--trainer.callbacks=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.monitor=val/score",
        "--trainer.callbacks.mode=max",
        "--trainer.callbacks.save_last=true",
        "--seed_everything=0",
        "--fault_tolerance.save_every_steps=5",
        "--data.sampling=temperature",
    ]


def python(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python ARGS`` with tests/ importable (the fault callbacks live in tests/faults.py)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def trunk(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return python(["-m", "trunk.cli", *args], cwd, env)


def signal_at(step: int, signum: int = signal.SIGKILL) -> list[str]:
    return [
        "--trainer.callbacks+=faults.SignalAt",
        f"--trainer.callbacks.step={step}",
        f"--trainer.callbacks.signum={int(signum)}",
    ]


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, weights_only=True)["state_dict"]


def last(root: Path) -> Path:
    return root / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


def logged_steps(run: Path) -> list[int]:
    lines = (run / "lightning_logs/version_0/metrics.csv").read_text().splitlines()
    return sorted(int(line.split(",")[lines[0].split(",").index("step")]) for line in lines[1:])


def test_killed_at_random_steps_and_resumed_ends_bit_identical(sentiment_files, ner_files, tmp_path):
    """SIGKILL mid-epoch, at an epoch's last step and in the second epoch; each time resume with
    --ckpt_path last. The final weights equal the uninterrupted run's exactly."""
    total = 2 * STEPS_PER_EPOCH
    rng = random.Random()
    # the first kill after the first periodic save (every 5 steps): before it there is nothing to resume from
    kills = [rng.randint(6, STEPS_PER_EPOCH - 2), STEPS_PER_EPOCH, rng.randint(STEPS_PER_EPOCH + 2, total - 1)]
    straight = trunk(fit_args(tmp_path / "straight", sentiment_files, ner_files), tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]

    root = tmp_path / "killed"
    for i, step in enumerate(kills):
        resume = ["--ckpt_path=last"] if i else []
        killed = trunk([*fit_args(root, sentiment_files, ner_files), *resume, *signal_at(step)], tmp_path)
        assert killed.returncode == -signal.SIGKILL, (kills, killed.stderr[-3000:])
        saved = torch.load(last(root), weights_only=True)["global_step"]
        assert step - 5 <= saved <= step, (kills, saved)  # at most 5 steps lost
    resumed = trunk([*fit_args(root, sentiment_files, ner_files), "--ckpt_path=last"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    expected, got = weights(last(tmp_path / "straight")), weights(last(root))
    assert torch.load(last(root), weights_only=True)["global_step"] == total
    assert all(torch.equal(expected[k], got[k]) for k in expected), f"kills at {kills}"
    # one run directory: the resumed runs kept the first one's logs, best score and checkpoints
    assert [p.name for p in (root / "lightning_logs").iterdir()] == ["version_0"]
    assert logged_steps(root) == logged_steps(tmp_path / "straight"), kills  # the killed runs' rows survive the resumes
    best = lambda r: sorted(p.name for p in (r / "lightning_logs/version_0/checkpoints").glob("epoch=*"))  # noqa: E731
    assert best(root) == best(tmp_path / "straight"), kills
    assert "Test metrics:" in resumed.stdout
    assert logged_metrics(root)["test/score"] == logged_metrics(tmp_path / "straight")["test/score"]


def test_a_row_logged_after_the_last_save_is_logged_once_after_the_resume(sentiment_files, ner_files, tmp_path):
    """The save of step 15 comes before the batch that logs step 15 (rows every 8 steps: 7, 15, ...); killed at 17,
    the resume runs that batch again, so the kept history must not hold its row too (it did: `<=` for `<`)."""
    straight = trunk(fit_args(tmp_path / "straight", sentiment_files, ner_files, epochs=1), tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    root = tmp_path / "killed"
    killed = trunk([*fit_args(root, sentiment_files, ner_files, epochs=1), *signal_at(17)], tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert torch.load(last(root), weights_only=True)["global_step"] == 15
    assert 15 in logged_steps(root)  # the row the resume logs again
    resumed = trunk([*fit_args(root, sentiment_files, ner_files, epochs=1), "--ckpt_path=last"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert logged_steps(root) == logged_steps(tmp_path / "straight")


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_sigint_save_print_the_resume_command_and_exit_non_zero(
    signum, code, sentiment_files, ner_files, tmp_path
):
    root = tmp_path / "run"
    result = trunk([*fit_args(root, sentiment_files, ner_files), *signal_at(7, signum)], tmp_path)
    assert result.returncode == code, result.stderr[-3000:]
    # the step it was at, not the last periodic one
    assert (torch.load(last(root), weights_only=True)["global_step"] == 7)
    assert f"Received {signal.Signals(signum).name}" in result.stderr
    command = next(line for line in result.stderr.splitlines() if line.startswith("  trunk fit"))
    assert command.endswith(f"--ckpt_path={last(root)}") and "--trainer.max_epochs=2" in command
    assert "Test metrics:" not in result.stdout  # an interrupted run is not tested


def test_a_ctrl_c_a_library_swallowed_while_loading_stops_the_run_before_it_trains(sentiment_files, ner_files,
                                                                                    tmp_path):
    """torch's C extension clears a KeyboardInterrupt raised as it imports numpy: the Ctrl+C is still honoured when
    the run starts (exit 130, one line, nothing trained or saved), not lost."""
    root = tmp_path / "run"
    stopped = python([str(REPO / "tests/ctrl_c_in_torch_import.py"), *fit_args(root, sentiment_files, ner_files)],
                     tmp_path)
    assert stopped.returncode == 130 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert "Stopped before fit began; nothing to save." in stopped.stderr
    assert not list(root.rglob("*.ckpt"))


def test_a_run_stopped_inside_a_script_prints_its_own_resume_command(sentiment_files, ner_files, tmp_path):
    """A script that runs the CLI (benchmarks/transfer.py, a notebook) has argv of its own: the command printed is
    the run's, and running it finishes the run."""
    root = tmp_path / "run"
    args = [*fit_args(root, sentiment_files, ner_files, epochs=1), *signal_at(7, signal.SIGTERM)]
    script = "import json, sys; from trunk.cli.fit import run_cli; run_cli(json.loads(sys.argv[1]))"
    stopped = python(["-c", script, json.dumps(args), "--script-option"], tmp_path)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    command = next(line for line in stopped.stderr.splitlines() if line.startswith("  trunk fit"))
    assert "--script-option" not in command and "--trainer.max_epochs=1" in command, command
    resume = shlex.split(command)[2:]
    assert resume[-1] == f"--ckpt_path={last(root)}"
    # the printed command minus the fault that stopped it
    resume = [a for a in resume if a not in signal_at(7, signal.SIGTERM)]
    resumed = trunk(["fit", *resume], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(last(root), weights_only=True)["global_step"] == STEPS_PER_EPOCH


def test_after_a_run_inside_a_script_its_signals_are_the_scripts_again(sentiment_files, ner_files, tmp_path):
    """A run's SIGTERM and SIGINT handling ends with the run: a script that trained (or whose run failed) and goes on
    stops on a SIGTERM as it did before, and a Ctrl+C raises KeyboardInterrupt. (Lightning's teardown put back the
    handlers it found, which were the run's: the script went on, printing 'saving a checkpoint after this step'.)
    After a run that fails, Lightning's teardown comes last and leaves the run's handler: it passes signals on."""
    script = """if True:
        import json, os, signal, sys
        from trunk.cli.fit import run_cli
        # as in a script started from a terminal (pytest-xdist's workers start theirs with SIGINT ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        args = json.loads(sys.argv[1])
        run_cli(args)
        found = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        assert found == (signal.default_int_handler, signal.SIG_DFL), found
        try:  # a run that fails while it trains (diverged, as in the test below)
            run_cli([*args, "--model.optimizer.lr=1e4", "--model.optimizer.warmup=0",
                     "--trainer.default_root_dir=diverged"])
        except BaseException as failure:
            print("failed:", type(failure).__name__, flush=True)
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            print("Ctrl+C: KeyboardInterrupt", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 5) if hasattr(signal, "sigtimedwait") else __import__("time").sleep(5)
        print("still running after SIGTERM", flush=True)
    """
    done = python(["-c", script, json.dumps(fit_args(tmp_path / "run", sentiment_files, ner_files, epochs=1))],
                  tmp_path)
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["failed: TrainingDiverged", "Ctrl+C: KeyboardInterrupt"], done.stdout
    assert "Received SIGTERM" not in done.stderr


def test_the_resume_command_drops_the_old_ckpt_path_in_either_spelling():
    from trunk.training.fault_tolerance import without_option

    args = [
        "--config",
        "r.yaml",
        "--ckpt_path",
        "last",
        "--trainer.max_steps=9",
        "--ckpt_path=x.ckpt",
        "--ckpt_paths_x=1",
    ]
    assert without_option(args, "--ckpt_path") == ["--config", "r.yaml", "--trainer.max_steps=9", "--ckpt_paths_x=1"]


def test_a_diverging_run_stops_naming_the_step_and_saves_no_nan(sentiment_files, ner_files, tmp_path):
    root = tmp_path / "run"
    result = trunk(
        [*fit_args(root, sentiment_files, ner_files), "--model.optimizer.lr=1e4", "--model.optimizer.warmup=0"],
        tmp_path,
    )
    assert result.returncode == 1
    message = next(line for line in result.stderr.splitlines() if line.startswith("error:"))
    assert (
        message.startswith("error: Training stopped at step ")
        and "not finite" in message
        and "skip_bad_batches" in message
    )
    assert "Traceback" not in result.stderr
    for ckpt in root.rglob("*.ckpt"):
        assert all(torch.isfinite(w).all() for w in weights(ckpt).values() if w.is_floating_point()), ckpt


def test_bad_steps_are_skipped_up_to_the_budget(sentiment_files, ner_files, tmp_path):
    """A NaN gradient injected at step 3: dropped with skip_bad_batches=1 (the run finishes, weights finite), fatal
    without."""
    poison = ["--trainer.callbacks+=faults.NaNGradientAt", "--trainer.callbacks.step=3"]
    args = [*fit_args(tmp_path / "run", sentiment_files, ner_files, epochs=1), *poison]
    stopped = trunk(args, tmp_path)
    assert stopped.returncode == 1 and "error: Training stopped at step 3 (task " in stopped.stderr
    skipped = trunk(
        [*args, "--fault_tolerance.skip_bad_batches=1", "--trainer.default_root_dir=" + str(tmp_path / "skip")],
        tmp_path,
    )
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    assert "Non-finite loss or gradients at step 3" in skipped.stderr
    final = weights(last(tmp_path / "skip"))
    assert all(torch.isfinite(w).all() for w in final.values() if w.is_floating_point())


def test_the_last_step_is_saved_and_extending_max_steps_replans_the_schedule(sentiment_files, ner_files, tmp_path):
    """max_steps 30 ends mid-epoch, away from any validation: the final steps are still saved. Resumed with
    max_steps 60, the schedule is planned for 60 steps, so the new steps train (the old plan would hold lr at 0)."""
    root = tmp_path / "run"
    args = [*fit_args(root, sentiment_files, ner_files), "--trainer.max_epochs=-1"]  # steps decide, as in pretraining
    assert trunk([*args, "--trainer.max_steps=30"], tmp_path).returncode == 0
    first = torch.load(last(root), weights_only=True)
    assert first["global_step"] == 30
    more = trunk([*args, "--trainer.max_steps=60", "--ckpt_path=last"], tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    ckpt = torch.load(last(root), weights_only=True)
    assert ckpt["global_step"] == 60
    changed = sum(not torch.equal(first["state_dict"][k], ckpt["state_dict"][k]) for k in first["state_dict"])
    assert changed > len(first["state_dict"]) // 2
    assert ckpt["lr_schedulers"][0]["_last_lr"][0] == 0.0  # the cosine ends at the new end


# -- files -------------------------------------------------------------------------------------------


def test_a_write_killed_midway_leaves_the_previous_file_whole(tmp_path):
    """A real SIGKILL while a checkpoint is being written: the old file is intact, no partial file replaces it."""
    target = tmp_path / "last.ckpt"
    torch.save({"step": 1}, target)
    script = (
        "import os, signal, torch\n"
        "from trunk.core.atomic import atomic_write\n"
        "def write(tmp):\n"
        "    with open(tmp, 'wb') as f:\n"
        "        f.write(b'half a checkpoint'); f.flush()\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        f"atomic_write({str(target)!r}, write)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert result.returncode == -signal.SIGKILL
    assert torch.load(target, weights_only=True) == {"step": 1}


def flip_byte_in_largest_tensor(path: Path) -> None:
    """Flip one bit in the middle of the largest tensor's bytes inside a torch zip checkpoint."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    header = info.header_offset
    name_len, extra_len = (
        int.from_bytes(data[header + 26 : header + 28], "little"),
        int.from_bytes(data[header + 28 : header + 30], "little"),
    )
    data[header + 30 + name_len + extra_len + info.file_size // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_bit_flip_inside_a_checkpoint_tensor_is_refused(sentiment_files, ner_files, tmp_path):
    root = tmp_path / "run"
    assert trunk(fit_args(root, sentiment_files, ner_files, epochs=1), tmp_path).returncode == 0
    flip_byte_in_largest_tensor(last(root))
    result = trunk([*fit_args(root, sentiment_files, ner_files, epochs=2), "--ckpt_path=last"], tmp_path)
    assert result.returncode != 0
    assert f"'{last(root)}' is corrupted: its tensors do not match the digest" in result.stderr
    assert "Traceback" not in result.stderr.split("error:")[-1]


def test_a_stalled_process_under_ddp_is_an_error_on_every_process_not_a_hang(sentiment_files, ner_files, tmp_path):
    args = [a for a in fit_args(tmp_path / "run", sentiment_files, ner_files) if not a.startswith("--trainer.devices")]
    ddp = ["--config", str(REPO / "configs/trainer/ddp_cpu.yaml"), "--fault_tolerance.ddp_timeout_minutes=0.25"]
    result = trunk(
        [
            *args,
            *ddp,
            "--trainer.callbacks+=faults.StallAt",
            "--trainer.callbacks.step=3",
            "--trainer.callbacks.seconds=30",
        ],
        tmp_path,
    )
    assert result.returncode != 0
    errors = [
        line for line in result.stderr.splitlines() if line.startswith("error: a collective between the processes")
    ]
    assert len(errors) == 2, result.stderr[-3000:]  # each process says it, neither hangs
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize("stage", ["validate", "sanity", "test"])
def test_sigterm_during_a_long_evaluation_stops_within_a_batch(stage, sentiment_files, ner_files, tmp_path):
    """SIGTERM halfway through a validation of 1 s a batch (inside fit, in the sanity check, or in `trunk test`): the
    process exits 143 after the current batch, not after the pass. Inside fit it saves the step before the
    validation, and the resumed run ends bit-identical to an uninterrupted one."""
    import time

    stamp = tmp_path / "signalled"
    slow = ["--trainer.callbacks+=faults.SignalDuringValidation", f"--trainer.callbacks.stamp={stamp}",
            f"--trainer.callbacks.stage={stage}", "--trainer.callbacks.seconds=1.0", "--trainer.callbacks.batch=1"]
    root = tmp_path / "run"
    args = fit_args(root, sentiment_files, ner_files, epochs=1)
    # 16 + 10 batches of 1 s; a validation after step 10, with 31 steps to train after it
    evaluation = [
        "--data.tasks.sentiment.eval_batch_size=4",
        "--data.tasks.ner.eval_batch_size=4",
        "--trainer.val_check_interval=10",
        "--trainer.num_sanity_val_steps=2",
    ]
    if stage == "test":
        assert trunk([*args, "--trainer.max_steps=3"], tmp_path).returncode == 0
        args = ["test", *args[1:], f"--ckpt_path={last(root)}"]
    result = trunk([*args, *evaluation, *slow], tmp_path)
    ended = time.time()
    assert result.returncode == 143, result.stderr[-3000:]
    signalled, step = stamp.read_text().split()
    assert ended - float(signalled) < 10, f"stopped {ended - float(signalled):.1f} s after the signal"
    if stage != "validate":
        assert "nothing to save" in result.stderr
        return
    saved = torch.load(last(root), weights_only=True)
    assert saved["global_step"] == int(step)
    resumed = trunk([*fit_args(root, sentiment_files, ner_files, epochs=1), *evaluation, "--ckpt_path=last"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    straight = trunk([*fit_args(tmp_path / "straight", sentiment_files, ner_files, epochs=1), *evaluation], tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    a, b = weights(last(root)), weights(last(tmp_path / "straight"))
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_a_preempted_ddp_run_resumes_bit_identical_with_every_processs_random_state(
    sentiment_files, ner_files, tmp_path
):
    """Two gloo processes with dropout: SIGTERM to the first at step 7 (both save and stop), resume with --ckpt_path
    last. Each process restores its own random state, so the dropout masks and the final weights equal the uninterrupted
    run's."""

    def ddp_args(root: Path) -> list[str]:
        args = [
            a for a in fit_args(root, sentiment_files, ner_files, epochs=1) if not a.startswith("--trainer.devices")
        ]
        return [*args, "--config", str(REPO / "configs/trainer/ddp_cpu.yaml"), "--model.trunk.dropout=0.2"]

    straight = trunk(ddp_args(tmp_path / "straight"), tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    root = tmp_path / "run"
    stopped = trunk([*ddp_args(root), *signal_at(7, signal.SIGTERM)], tmp_path)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    saved = torch.load(last(root), weights_only=False)
    assert saved["global_step"] == 7
    states = saved["callbacks"]["FaultTolerance"]["ranks"]
    assert len(states) == 2 and not torch.equal(states[0]["torch"], states[1]["torch"])  # the processes' own states
    resumed = trunk([*ddp_args(root), "--ckpt_path=last"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = weights(last(root)), weights(last(tmp_path / "straight"))
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_slurm_preemption_notice_saves_requeues_and_the_requeued_job_resumes_by_itself(
    sentiment_files, ner_files, tmp_path
):
    """SIGUSR1 (SLURM's notice, `#SBATCH --signal=USR1@90`) at step 7: the step is saved, `scontrol requeue <job>` is
    called (a fake scontrol on PATH records it), the exit status is 138. The same command in the requeued job
    (SLURM_RESTART_COUNT=1) resumes from last.ckpt by itself and ends with the uninterrupted run's weights."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.log"
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (bin_dir / "scontrol").chmod(0o755)
    slurm = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    root = tmp_path / "run"
    args = fit_args(root, sentiment_files, ner_files, epochs=1)
    noticed = trunk([*args, *signal_at(7, signal.SIGUSR1)], tmp_path, env=slurm)
    assert noticed.returncode == 128 + signal.SIGUSR1, noticed.stderr[-3000:]
    assert calls.read_text().split() == ["requeue", "4242"] and "Requeued SLURM job 4242" in noticed.stderr
    assert torch.load(last(root), weights_only=True)["global_step"] == 7
    requeued = trunk(args, tmp_path, env={**slurm, "SLURM_RESTART_COUNT": "1"})  # the job's command, unchanged
    assert requeued.returncode == 0 and "resuming" in requeued.stderr, requeued.stderr[-3000:]
    straight = trunk(fit_args(tmp_path / "straight", sentiment_files, ner_files, epochs=1), tmp_path)
    a, b = weights(last(root)), weights(last(tmp_path / "straight"))
    assert straight.returncode == 0 and all(torch.equal(a[k], b[k]) for k in b)


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "trunk.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_runs_sharing_a_folder_never_share_a_version(sentiment_files, ner_files, tmp_path):
    """Two new fits with one default_root_dir, started together, get a version each; a resume of a folder that a live
    run holds is refused naming it; a lock left by a killed run is taken over; no lock outlives its run."""
    root = tmp_path / "run"
    def stall(step: int, seconds: int = 15) -> list[str]:  # the run holds its folder a while longer
        return ["--trainer.callbacks+=faults.StallAt", f"--trainer.callbacks.step={step}", "--trainer.callbacks.rank=0",
                f"--trainer.callbacks.seconds={seconds}"]

    first, second = (start([*fit_args(root, sentiment_files, ner_files, epochs=1), *stall(3)], tmp_path) for _ in "ab")
    for process in (first, second):
        assert process.wait(timeout=600) == 0, process.stderr.read()[-3000:]
    versions = sorted(p.name for p in (root / "lightning_logs").iterdir())
    assert versions == ["version_0", "version_1"]
    for version in versions:  # each its own files: one run's whole epoch, one validation row
        folder = root / "lightning_logs" / version
        assert torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == STEPS_PER_EPOCH
        rows = (folder / "metrics.csv").read_text().splitlines()
        assert sum(",val/score" in f",{rows[0]}" and row.split(",")[rows[0].split(",").index("val/score")] != ""
                   for row in rows[1:]) == 1
    resume = [*fit_args(root, sentiment_files, ner_files, epochs=2), f"--ckpt_path={last(root)}"]
    holding = start([*resume, *stall(STEPS_PER_EPOCH + 2, seconds=600)], tmp_path)
    lock = last(root).parent.parent / ".trunk.lock"
    deadline = time.monotonic() + 120
    while not lock.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    refused = trunk(resume, tmp_path)
    assert refused.returncode != 0 and f"'{lock.parent}' is in use by process {holding.pid}" in refused.stderr
    assert "Traceback" not in refused.stderr.split("error:")[-1]
    holding.kill()  # its lock stays, naming a dead process: the next run takes it over
    holding.wait(timeout=60)
    assert json.loads(lock.read_text())["pid"] == holding.pid
    taken_over = trunk(resume, tmp_path)
    assert taken_over.returncode == 0, taken_over.stderr[-3000:]
    assert not list(root.rglob(".trunk.lock"))  # released at the end


def test_of_many_processes_racing_for_a_folder_one_holds_it_and_a_killed_holder_frees_it_at_once(tmp_path):
    """Eight processes take one folder's lock at the same moment, over a lock file a killed run left: exactly one
    holds it, the others are told its process; when that one is killed, the next takes the folder at once."""
    stale = tmp_path / "run" / ".trunk.lock"
    stale.parent.mkdir()
    stale.write_text(json.dumps({"pid": 999_999_999, "host": "gone", "started": "yesterday"}))
    go = tmp_path / "go"
    racer = "\n".join([
        "import json, sys, time",
        "from pathlib import Path",
        "from trunk.core.locks import try_lock",
        "print('ready', flush=True)",
        "while not Path(sys.argv[2]).exists(): pass",  # all start together
        "owner = try_lock(Path(sys.argv[1]))",
        "print(json.dumps(owner), flush=True)",
        "time.sleep(600 if owner is None and sys.argv[3] == 'hold' else 0)",
    ])

    def run(hold: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", racer, str(stale), str(go), hold], text=True,
                                stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})

    racers = [run("hold") for _ in range(8)]
    try:
        assert all(p.stdout.readline().strip() == "ready" for p in racers)
        go.touch()
        answers = {p.pid: json.loads(p.stdout.readline()) for p in racers}
        winners = [pid for pid, owner in answers.items() if owner is None]
        assert len(winners) == 1, answers
        assert all(owner["pid"] == winners[0] for owner in answers.values() if owner is not None)
        assert json.loads(stale.read_text())["pid"] == winners[0]
        os.kill(winners[0], signal.SIGKILL)
        next(p for p in racers if p.pid == winners[0]).wait(timeout=60)
        after = run("release")
        assert after.stdout.readline().strip() == "ready" and json.loads(after.stdout.readline()) is None
        assert after.wait(timeout=60) == 0 and not stale.exists()  # released at exit
    finally:
        for p in racers:
            p.kill()
            p.wait()


def test_a_validation_stopped_by_sigterm_runs_again_when_the_run_resumes(sentiment_files, ner_files, tmp_path):
    """SIGTERM in the epoch's closing validation (the run's last): the resumed run validates that step again, in
    full, so the run's validations, best score and best checkpoint are the uninterrupted run's."""
    stamp = tmp_path / "signalled"
    slow = ["--trainer.callbacks+=faults.SignalDuringValidation", f"--trainer.callbacks.stamp={stamp}",
            "--trainer.callbacks.stage=validate", "--trainer.callbacks.seconds=0.2", "--trainer.callbacks.batch=1"]
    evaluation = ["--data.tasks.sentiment.eval_batch_size=8", "--data.tasks.ner.eval_batch_size=8"]
    root = tmp_path / "run"
    result = trunk([*fit_args(root, sentiment_files, ner_files, epochs=1), *evaluation, *slow], tmp_path)
    assert result.returncode == 143, result.stderr[-3000:]
    resumed = trunk([*fit_args(root, sentiment_files, ner_files, epochs=1), *evaluation, "--ckpt_path=last"],
                    tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    straight = trunk([*fit_args(tmp_path / "straight", sentiment_files, ner_files, epochs=1), *evaluation], tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    validated, expected = logged_metrics(root), logged_metrics(tmp_path / "straight")
    assert "val/score" in validated and validated["val/score"] == pytest.approx(expected["val/score"], abs=1e-6)
