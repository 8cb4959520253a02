"""What Trunk does on a CUDA GPU (the ``gpu`` marker; run by the GPU check, docs/gpu.md): bf16-mixed training follows
fp32's, attention takes a fused kernel, every task kind trains and predicts, checkpoints move between the GPU and the
CPU with the same answers, DDP and FSDP2 on the one GPU resume exactly, ``trunk serve`` answers, int8 is refused and
``precision: auto`` picks bf16.

Skipped without CUDA, except in the check's CPU dry run (``TRUNK_GPU_CHECK=dry``), where every test that means
something on a CPU runs there so that this file cannot rot between GPU runs; the CUDA-only ones stay skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys

import lightning as L
import pytest
import torch
from conftest import REPO
from kinds import DATA_FILES, KINDS
from test_matrix import kind_args, same_records

from trunk.cli import run_cli
from trunk.tasks import SequenceClassification, TrunkModule, load

DEVICE = "cuda" if torch.cuda.is_available() else "cpu" if os.environ.get("TRUNK_GPU_CHECK") == "dry" else None
ACCELERATOR = {"cuda": "gpu", "cpu": "cpu"}.get(DEVICE)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE is None, reason="needs CUDA (the GPU check, docs/gpu.md)")]
cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="CUDA only (the CPU dry run of the GPU check skips it)")


def checkpoint(cli) -> str:
    callback = cli.trainer.checkpoint_callback
    return callback.last_model_path or callback.best_model_path


def on_device(args: list[str], precision: str = "32-true") -> list[str]:
    """A CPU test's CLI options moved to the check's device."""
    swapped = {"--trainer.accelerator=cpu": f"--trainer.accelerator={ACCELERATOR}",
               "--trainer.precision=32-true": f"--trainer.precision={precision}"}
    return [swapped.get(arg, arg) for arg in args]


# -- bf16 ---------------------------------------------------------------------------------------------------------

class Losses(L.Callback):
    def __init__(self) -> None:
        self.values: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.values.append(float(outputs["loss"]))


def learnable_batches(n: int, seed: int = 0) -> list[dict]:
    """Padded rows whose label is their first token's id mod 3: a small trunk learns it in tens of steps."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, 100, (32, 24), generator=g)
        mask = (torch.arange(24) < torch.randint(6, 25, (32, 1), generator=g)).long()
        out.append({"task": "s", "input_ids": ids * mask, "attention_mask": mask, "labels": ids[:, 0] % 3})
    return out


def train_losses(precision: str, steps: int = 60) -> list[float]:
    torch.manual_seed(0)
    model = TrunkModule({"s": SequenceClassification(head_dropout=0.0)},
                        trunk={"vocab_size": 100, "d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128,
                               "max_len": 32, "dropout": 0.0, "attn_dropout": 0.0},
                        optimizer={"lr": 1e-3, "warmup": 5}, task_info={"s": {"label_names": ["a", "b", "c"]}})
    losses = Losses()
    trainer = L.Trainer(accelerator=ACCELERATOR, devices=1, precision=precision, max_steps=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[losses])
    trainer.fit(model, torch.utils.data.DataLoader(learnable_batches(steps), batch_size=None))
    return losses.values


def test_bf16_mixed_training_follows_fp32s_loss():
    """The same 60 steps from the same weights (the loss starts near ln 3 = 1.10 and falls below half of it):
    bf16-mixed's loss is within 0.01 of fp32's at each of the first 10 steps, and its mean over every 10 steps within
    0.05 of fp32's (rounding moves single steps more once the curves part; the windows say whether bf16 learns as
    fast)."""
    fp32, bf16 = train_losses("32-true"), train_losses("bf16-mixed")
    assert len(fp32) == len(bf16) == 60
    assert sum(fp32[-10:]) / 10 < 0.5 * fp32[0], fp32  # it learnt
    assert max(abs(a - b) for a, b in zip(fp32[:10], bf16[:10])) < 0.01, (fp32, bf16)
    windows = [abs(sum(fp32[i:i + 10]) - sum(bf16[i:i + 10])) / 10 for i in range(0, 60, 10)]
    assert max(windows) < 0.05, (windows, fp32, bf16)


@cuda_only
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_attention_takes_a_fused_kernel(padded, dtype):
    """With SDPA held to its flash and memory-efficient kernels (the math fallback refused: it raises rather than
    falling back), a forward and backward of padded rows (the unpadded path: real tokens gathered) and of full rows."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = TrunkModule({"s": SequenceClassification()}, trunk={"vocab_size": 100, "d_model": 128, "n_layers": 2,
                                                                 "n_heads": 4, "d_ff": 256, "max_len": 64},
                        task_info={"s": {"label_names": ["a", "b", "c"]}}).to("cuda")
    batch = learnable_batches(1)[0]
    if not padded:
        batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch.items()}
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]), \
            torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        loss = model.training_step(batch, 0)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.trunk.parameters() if p.requires_grad)


@cuda_only
def test_precision_auto_picks_bf16_mixed_and_says_why(tiny_cli_args, capfd):
    from trunk.training.precision import choose_precision

    assert choose_precision("gpu") == ("bf16-mixed", "this GPU has bf16 tensor cores")
    cli = run_cli([*on_device(tiny_cli_args), "--trainer.precision=auto", "--trainer.max_steps=1"], run=False)
    assert cli.trainer.precision == "bf16-mixed"
    said = "".join(capfd.readouterr())
    assert "Precision: bf16-mixed (auto: this GPU has bf16 tensor cores)." in said, said[-2000:]


# -- every kind; checkpoints across devices ------------------------------------------------------------------------

def labels_of(records) -> list:
    """What a prediction decides, without its scores: the label, tags, answer or text of each record."""
    keep = ("label", "labels", "tags", "entities", "answer", "text", "translation", "choice")
    return [{k: v for k, v in r.items() if k in keep} if isinstance(r, dict) else r for r in records]


@pytest.mark.parametrize("name", KINDS)
def test_every_kind_trains_and_predicts_and_its_checkpoints_cross_devices(name, request, tmp_path):
    """Trained on the device in bf16-mixed, then on the CPU: each checkpoint predicts on the device (the CLI's
    ``predict``, ``load(map_location=...)``) what it predicts on the CPU, in fp32 on both (bf16's rounding could tip a
    near tie of a few-step model)."""
    kind = KINDS[name]
    files = {source: request.getfixturevalue(f"{source}_files") for source in set(DATA_FILES.values()) - {None}}
    on_gpu = on_device(kind_args(kind, files, tmp_path / "gpu"), "bf16-mixed")
    fit = run_cli(["fit", *on_gpu, "--trainer.max_steps=4"])
    assert fit.model.device.type == DEVICE
    metrics = run_cli(["validate", *on_gpu, f"--ckpt_path={checkpoint(fit)}"])
    assert torch.isfinite(metrics.trainer.callback_metrics["val/t/loss"])
    if not kind.inputs:
        return
    out = tmp_path / "predictions.jsonl"
    run_cli(["predict", *on_gpu, f"--ckpt_path={checkpoint(fit)}",
             f"--predictions.output={out}"])
    assert out.read_text().strip()
    # and a checkpoint trained on the CPU (the dry run's device is the CPU: its own checkpoint is one)
    on_cpu = () if DEVICE == "cpu" else (run_cli(["fit", *kind_args(kind, files, tmp_path / "cpu"),
                                                   "--trainer.max_steps=4"]),)
    for trained in (fit, *on_cpu):
        ckpt = checkpoint(trained)
        here = load(ckpt, map_location=DEVICE, precision="32-true")
        assert here.model.device.type == DEVICE
        there = load(ckpt, precision="32-true").predict(list(kind.inputs))
        got = here.predict(list(kind.inputs))
        assert labels_of(got) == labels_of(there) and same_records(got, there, 1e-3), (got, there)


# -- strategies on the one GPU --------------------------------------------------------------------------------------

def parallel_run(mode: str, out, *extra: str) -> dict:
    done = subprocess.run([sys.executable, str(REPO / "tests" / "parallel_run.py"), mode, "20", str(out),
                           f"--accelerator={ACCELERATOR}", "--devices=1", *extra],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=True)


@pytest.fixture(scope="module")
def one_process_weights(tmp_path_factory) -> dict:
    """The weights one plain process ends with: what every strategy must reach (run once for both)."""
    return parallel_run("one", tmp_path_factory.mktemp("one") / "one.pt")


# the dry run trains DDP only: the test's code is the same for both, and the suite trains FSDP2 on CPUs
@pytest.mark.parametrize("mode", ["ddp", pytest.param("fsdp2", marks=cuda_only)])
def test_ddp_and_fsdp2_on_one_device_train_and_resume_exactly(mode, one_process_weights, tmp_path):
    """DDP (NCCL on a GPU) and FSDP2 in one process: 20 steps straight, and 10 steps saved then resumed to 20, end
    with the same weights; and where one plain process does."""
    straight = parallel_run(mode, tmp_path / "straight.pt")
    parallel_run(mode, tmp_path / "half.pt", "--stop-at=10", f"--save={tmp_path / 'half.ckpt'}")
    resumed = parallel_run(mode, tmp_path / "resumed.pt", f"--resume={tmp_path / 'half.ckpt'}")
    one = one_process_weights
    assert straight.keys() == resumed.keys() == one.keys()
    assert max((straight[k] - resumed[k]).abs().max().item() for k in straight) < 1e-6
    assert max((straight[k] - one[k]).abs().max().item() for k in straight) < 1e-5


# -- serving and int8 ---------------------------------------------------------------------------------------------

def test_serve_on_the_device_answers_as_predict_does(tiny_cli_args, tmp_path):
    pytest.importorskip("litserve")
    from test_serve import Server

    fit = run_cli(["fit", *on_device(tiny_cli_args, "bf16-mixed"), "--trainer.max_steps=4"])
    ckpt = checkpoint(fit)
    texts = ["the film was great", "a dull and tired plot"]
    expected = load(ckpt, map_location=DEVICE, precision="32-true").predict(texts)
    accelerator = "cuda" if DEVICE == "cuda" else "cpu"
    with Server(ckpt, f"--accelerator={accelerator}", "--precision=32-true") as server:
        status, answer = server.post({"inputs": texts})
    assert status == 200, answer
    assert labels_of(answer) == labels_of(expected) and same_records(answer, expected, 1e-3), (answer, expected)


@cuda_only
def test_int8_on_cuda_is_refused_in_one_line(tiny_cli_args, tmp_path):
    fit = run_cli(["fit", *on_device(tiny_cli_args), "--trainer.max_steps=2"])
    ckpt = checkpoint(fit)
    with pytest.raises(ValueError, match="quantize=int8 runs on CPUs; this model is on cuda"):
        load(ckpt, map_location="cuda", quantize="int8")
    done = subprocess.run([sys.executable, "-m", "trunk.cli", "predict", *on_device(tiny_cli_args),
                           f"--ckpt_path={ckpt}", "--quantize=int8"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "quantize=int8 runs on CPUs" in done.stderr.strip().splitlines()[-1], done.stderr[-3000:]
