"""precision: auto picks bf16 only where the hardware computes it natively; the CPU's capability is faked
both ways, so no test depends on the real machine's speed."""

import typing
import warnings

import pytest
import torch
import yaml
from conftest import REPO

from trunk.cli.fit import LIGHTNING_PRECISION, TrunkTrainer, run_cli
from trunk.datamodules.text import Preprocessor
from trunk.inference.predictor import Predictor
from trunk.models import TrunkConfig
from trunk.tasks import SequenceClassification, TrunkModule
from trunk.training import precision as P

AVX2 = "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse sse2 avx f16c avx2 fma\n"
AVX512 = "model name\t: Intel Xeon Platinum 8168\nflags\t\t: fpu sse avx avx2 avx512f avx512bw\n"
AVX512_BF16 = "model name\t: AMD EPYC 9654\nflags\t\t: fpu avx avx2 avx512f avx512_bf16 avx512_vnni\n"
AMX = "model name\t: Intel Xeon Platinum 8480+\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
ARM = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 bf16\n"


def lightning_accepts(precision: str) -> bool:
    def values(t):
        return [v for arg in typing.get_args(t) for v in (values(arg) if typing.get_args(arg) else [arg])]
    return precision in values(LIGHTNING_PRECISION)


@pytest.fixture
def cpu(monkeypatch):
    """Fake this process's CPU: ``cpu(cpuinfo_text, slowdown)``; the probe, if asked, measures ``slowdown``."""
    probes = []

    def fake(text: str, slowdown: float = 40.0) -> None:
        info = P.read_cpu_info(text)
        monkeypatch.setattr(P, "cpu_info", lambda: info)
        monkeypatch.setattr(P, "bf16_slowdown", lambda: probes.append(slowdown) or slowdown)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        P._warn_emulated_bf16.cache_clear()

    yield fake, probes
    P._warn_emulated_bf16.cache_clear()


@pytest.mark.parametrize(
    "text, capability, native",
    [
        (AVX2, "AVX2", False),
        (AVX512, "AVX512", False),
        (AVX512_BF16, "AVX512-BF16", True),
        (AMX, "AMX", True),
        (ARM, None, None),
    ],
)
def test_the_cpu_capability_is_read_from_its_flags(text, capability, native):
    info = P.read_cpu_info(text)
    assert info.native_bf16 is native
    if capability:  # ARM has no flags line: torch names its capability, and the probe decides
        assert info.capability == capability and str(info) == f"{info.name} ({capability})"


@pytest.mark.parametrize(
    "text, chosen", [(AVX2, "32-true"), (AVX512, "32-true"), (AVX512_BF16, "bf16-mixed"), (AMX, "bf16-mixed")]
)
def test_auto_follows_the_flags_without_measuring(cpu, text, chosen):
    fake, probes = cpu
    fake(text)
    precision, why = P.choose_precision("cpu")
    assert precision == chosen and lightning_accepts(precision)
    assert ("has bf16 matrix units" in why) == (chosen == "bf16-mixed")
    assert probes == []  # the flags settle it: no probe


@pytest.mark.parametrize("slowdown, chosen", [(0.4, "bf16-mixed"), (1.0, "32-true"), (37.0, "32-true")])
def test_auto_measures_where_the_flags_do_not_say(cpu, slowdown, chosen):
    fake, probes = cpu
    fake(ARM, slowdown)
    precision, why = P.choose_precision("auto")
    assert precision == chosen and probes == [slowdown]
    assert f"took {slowdown:.2g}x the time of an fp32 one" in why


@pytest.mark.parametrize("capability, chosen", [((8, 0), "bf16-mixed"), ((9, 0), "bf16-mixed"), ((7, 5), "32-true")])
def test_auto_on_gpus_follows_their_bf16_tensor_cores(monkeypatch, capability, chosen):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    for accelerator in ("gpu", "cuda", "auto"):
        assert P.choose_precision(accelerator)[0] == chosen
    assert lightning_accepts(chosen)


def test_explicit_bf16_on_an_emulating_cpu_runs_as_asked_and_warns_once(cpu):
    fake, _ = cpu
    fake(AVX2, slowdown=37.0)
    with pytest.warns(
        UserWarning, match=r"AMD EPYC 7B13 \(AVX2\), has no bf16 matrix units.*took 37x.*--trainer.precision=auto"
    ):
        assert P.resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert P.resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
        fake(AMX)
        assert P.resolve_precision("bf16-true", "cpu") == "bf16-true"  # native: nothing to say
        assert P.resolve_precision("32-true", "cpu") == "32-true"


@pytest.mark.parametrize("text, chosen", [(AVX2, "32-true"), (AMX, "bf16-mixed")])
def test_the_trainer_runs_the_chosen_precision_and_says_so(cpu, caplog, text, chosen):
    fake, _ = cpu
    fake(text)
    with caplog.at_level("INFO"):
        trainer = TrunkTrainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    assert trainer.precision == chosen  # Lightning took it
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Precision:")]
    assert len(lines) == 1 and lines[0].startswith(f"Precision: {chosen} (auto: this CPU, ")


def test_auto_is_the_default_and_every_recipe_uses_it(tiny_cli_args, cpu, tmp_path):
    fake, _ = cpu
    fake(AVX2)
    cli = run_cli(["fit", *tiny_cli_args, "--trainer.max_steps=2", "--trainer.limit_val_batches=1"])
    assert cli.trainer.precision == "32-true"
    saved = yaml.safe_load(next((tmp_path / "run").rglob("config.yaml")).read_text())
    assert saved["trainer"]["precision"] == "32-true"  # the run's config records what ran
    for recipe in sorted((REPO / "configs").glob("*.yaml")):
        assert yaml.safe_load(recipe.read_text())["trainer"].get("precision", "auto") == "auto", recipe.name


def test_inference_uses_the_same_rule(cpu, monkeypatch):
    fake, _ = cpu
    model = TrunkModule(
        {"s": SequenceClassification()},
        trunk=TrunkConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32),
        task_info={"s": {"label_names": ["a", "b"]}},
    )

    class Texts:
        def preprocessor(self):
            return Preprocessor(list, self.encode_inputs, lambda text: 0, "a text", "text")

        def encode_inputs(self, texts, ids=None):
            return {
                "input_ids": torch.ones(len(texts), 3, dtype=torch.long),
                "attention_mask": torch.ones(len(texts), 3, dtype=torch.long),
            }

    seen = []
    monkeypatch.setattr(
        model.objectives["s"], "predict", lambda trunk, batch: seen.append(torch.is_autocast_enabled("cpu")) or [{}]
    )
    for text, chosen in ((AVX2, "32-true"), (AMX, "bf16-mixed")):
        fake(text)
        predictor = Predictor(model, {"s": Texts()})
        assert predictor.precision == chosen
        predictor.predict(["x"], task="s")
    assert seen == [False, True]
    fake(AVX2)
    with pytest.warns(UserWarning, match="has no bf16 matrix units"):
        assert Predictor(model, {"s": Texts()}, precision="bf16-mixed").precision == "bf16-mixed"
    with pytest.raises(
        ValueError, match=r"precision='16-mixed': inference runs in one of \['auto', '32-true', 'bf16-mixed'\]"
    ):
        Predictor(model, {"s": Texts()}, precision="16-mixed")
