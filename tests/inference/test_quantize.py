"""int8 inference (trunk.inference.quantize): the layer's error within what its scales allow, a quantized model's
answers beside the float one's, deltas still applied, training refused, the CPU's int8 units read from its flags, and
the ONNX graphs ONNX Runtime quantizes agreeing with PyTorch's int8."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from torch import nn

from trunk.cli import export_main, run_cli
from trunk.inference.quantize import Int8Linear, quantize_trunk
from trunk.tasks import load
from trunk.training.precision import read_cpu_info


def test_an_int8_layer_is_within_the_rounding_of_its_scales():
    """Rows of inputs whose sizes differ by 10^4 (as a trained transformer's tokens do): each output is off by no more
    than rounding both sides to their scales allows, sum_k |x_k| dw/2 + |w_k| dx/2 + dx dw/4, with dw one weight row's
    step and dx one token's (a scale per token keeps a small token's precision; one per tensor would not)."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 40)
    x = torch.randn(3, 7, 96) * torch.logspace(-2, 2, 7)[None, :, None]
    layer = Int8Linear.from_float(linear)
    with torch.no_grad():
        got, expected = layer(x), linear(x)
    dw = linear.weight.abs().amax(1) / 127  # (out,)
    dx = x.abs().amax(-1, keepdim=True) / 127  # (3, 7, 1)
    bound = (x.abs().sum(-1, keepdim=True) * dw / 2 + dx / 2 * linear.weight.abs().sum(1) + 96 * dx * dw / 4)
    assert ((got - expected).abs() <= bound * 1.0001 + 1e-6).all()
    assert (got - expected).abs().max() > 0  # it is int8 arithmetic, not the float layer
    assert torch.allclose(layer.weight, linear.weight, atol=float(dw.max()) / 2 + 1e-7)  # what a DoRA delta reads


def test_a_quantized_layer_refuses_to_train():
    layer = Int8Linear.from_float(nn.Linear(8, 4))
    with pytest.raises(RuntimeError, match="quantized to int8, which is for inference only"):
        layer(torch.randn(2, 8, requires_grad=True))


@pytest.fixture
def trained(tiny_cli_args, sentiment_files):
    """A tiny sentiment model after an epoch, and the test sentences."""
    fit = run_cli(["fit", *tiny_cli_args, "--trainer.precision=32-true"])
    with open(sentiment_files["test"]) as f:
        texts = [row["text"] for row in csv.DictReader(f)]
    return fit.trainer.checkpoint_callback.best_model_path, texts, tiny_cli_args


def test_an_int8_model_answers_as_the_float_one(trained):
    """Probabilities within 0.005: each int8 layer is off by under 1% of its output's range (the bound above), and
    after the block's norm and a two-label softmax at this model's small logits, much less. So the labels agree
    wherever the float model is not within 0.005 of a tie (most of the inputs here)."""
    ckpt, texts, _ = trained
    floats = load(ckpt, precision="32-true").predict(texts)
    int8 = load(ckpt, precision="32-true", quantize="int8").predict(texts)
    clear = [abs(a["probs"]["positive"] - 0.5) > 0.005 for a in floats]
    assert sum(clear) > len(texts) / 2
    for a, b, margin in zip(floats, int8, clear):
        assert abs(a["probs"]["positive"] - b["probs"]["positive"]) < 0.005
        assert a["label"] == b["label"] or not margin
    assert floats != int8  # computed in int8


def test_predict_and_test_quantize_on_request_and_training_refuses_it(trained, tmp_path):
    ckpt, texts, args = trained
    out = tmp_path / "int8.jsonl"
    run_cli(["predict", *args, f"--ckpt_path={ckpt}", "--quantize=int8", f"--predictions.output={out}"])
    written = [json.loads(line) for line in out.read_text().splitlines()]
    expected = load(ckpt, precision="auto", quantize="int8").predict(texts)
    assert [r["label"] for r in written] == [r["label"] for r in expected]
    tested = run_cli(["test", *args, f"--ckpt_path={ckpt}", "--quantize=int8"]).trainer.callback_metrics
    assert 0.0 <= tested["test/score"] <= 1.0
    with pytest.raises(SystemExit, match="--quantize int8 is for inference only"):
        run_cli(["fit", *args, "--quantize=int8"])
    with pytest.raises(SystemExit):  # jsonargparse lists the choices
        run_cli(["predict", *args, f"--ckpt_path={ckpt}", "--quantize=int4"])
    with pytest.raises(ValueError, match="quantize='int4': choose 'int8'"):
        load(ckpt, quantize="int4")


def test_a_task_delta_is_still_added_to_an_int8_trunk(tiny_cli_args):
    """LoRA with DoRA's rescaling (which reads the layer's weight) on every projection, made large: on the int8 trunk
    the delta moves the trunk's output as it does on the float one, to within a tenth of what it moves."""
    cli = run_cli([*tiny_cli_args, "--model.peft={sentiment: {method: lora, r: 4, dora: true}}"], run=False)
    model = cli.model.eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith((".B", ".magnitude")):
                parameter.normal_(0, 0.5)
    ids = torch.randint(5, model.trunk.cfg.vocab_size, (4, 12))
    mask = torch.ones_like(ids)

    @torch.inference_mode()
    def outputs(model) -> tuple[torch.Tensor, torch.Tensor]:
        with model.route("sentiment"):
            with_delta = model.trunk(ids, mask)
        return with_delta, model.trunk(ids, mask)

    with_delta, alone = outputs(model)
    said = quantize_trunk(model, "int8")
    assert "for the trunk's 10 linear layers" in said
    assert isinstance(model.trunk.backbone.blocks[0].ff.fc_in, Int8Linear)
    int8_with_delta, int8_alone = outputs(model)
    moved = (with_delta - alone).norm()
    assert moved > 0.1 * with_delta.norm()
    assert (int8_with_delta - with_delta).norm() < 0.1 * moved
    assert (int8_alone - alone).norm() < 0.1 * moved and not torch.equal(int8_alone, alone)


@pytest.mark.parametrize(
    ("flags", "native", "units"),
    [
        ("flags : fpu avx2 avx512f avx512_vnni avx512_bf16", True, "AVX512-VNNI"),
        ("flags : fpu avx2 amx_int8 avx512_vnni", True, "AMX-INT8, AVX512-VNNI"),
        ("flags : fpu avx2 avx_vnni", True, "AVX-VNNI"),
        ("flags : fpu sse4_2 avx2", False, ""),
        ("Features : fp asimd asimddp i8mm", True, "I8MM, DOTPROD"),
        ("Features : fp asimd", False, ""),
        ("", None, ""),
    ],
)
def test_the_cpus_int8_units_are_read_from_its_flags(flags, native, units):
    cpu = read_cpu_info(f"model name : Some CPU\n{flags}\n")
    assert cpu.native_int8 is native and cpu.int8 == units


def test_quantizing_without_int8_units_warns_with_the_measured_factor(monkeypatch, tiny_cli_args):
    from trunk.training import precision

    monkeypatch.setattr(precision, "cpu_info", lambda: read_cpu_info("model name : Old CPU\nflags : fpu avx2\n"))
    model = run_cli(tiny_cli_args, run=False).model
    with pytest.warns(UserWarning, match=r"quantize=int8: this CPU, Old CPU \(AVX2\), has no int8 dot-product units "
                                         r"\(VNNI or AMX\): an int8 matmul ran [\d.]+x as fast as an fp32 one here, so "
                                         "int8 will not be faster here"):
        quantize_trunk(model, "int8")


def test_int8_onnx_graphs_agree_with_int8_pytorch_and_are_refused_when_stale_or_missing(trained, tmp_path):
    pytest.importorskip("onnxruntime")
    ckpt, texts, _ = trained
    export_main([ckpt, str(tmp_path / "plain"), "--onnx"])
    with pytest.raises(FileNotFoundError, match="holds no int8 ONNX graphs: write them with `trunk export CKPT"):
        load(tmp_path / "plain", runtime="onnx", quantize="int8")
    with pytest.raises(SystemExit, match="--quantize int8 writes int8 ONNX graphs, so it needs --onnx"):
        export_main([ckpt, str(tmp_path / "nothing"), "--quantize", "int8"])

    directory = tmp_path / "exported"
    export_main([ckpt, str(directory), "--onnx", "--quantize", "int8"])
    graphs = directory / "onnx"
    assert (graphs / "sentiment.int8.onnx").stat().st_size < (graphs / "sentiment.onnx").stat().st_size
    onnx_int8 = load(directory, runtime="onnx", quantize="int8")
    through_onnx = onnx_int8.predict(texts)
    # ONNX Runtime takes the process's threads (torch's count), not every core of the machine
    assert {s.get_session_options().intra_op_num_threads for s in onnx_int8.runtime.sessions.values()} == {
        torch.get_num_threads()}
    in_torch = load(directory, precision="32-true", quantize="int8").predict(texts)
    in_float = load(directory, runtime="onnx").predict(texts)
    for a, b, c in zip(through_onnx, in_torch, in_float):  # ONNX Runtime scales its inputs per tensor: a coarser step
        assert abs(a["probs"]["positive"] - b["probs"]["positive"]) < 0.02
        assert abs(a["probs"]["positive"] - c["probs"]["positive"]) < 0.02

    listing = json.loads((graphs / "tasks.json").read_text())
    listing["sentiment"]["weights_sha256"] = "0" * 64  # graphs written from other weights
    (graphs / "tasks.json").write_text(json.dumps(listing))
    with pytest.raises(ValueError, match=r"The ONNX graphs of \['sentiment'\] .* were written from other weights"):
        load(directory, runtime="onnx", quantize="int8")


def test_auto_takes_the_fastest_form_measured_and_the_exact_one_of_a_near_tie(timed):
    from trunk.inference.calibrate import choose_form
    from trunk.models.trunk import TrunkConfig

    cfg = TrunkConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)
    timed.seconds = {"fp32": 1.0, "bf16": 0.6, "int8": 0.5, "int8 + bf16": 0.55}
    precision, quantize, said = choose_form(cfg, "cpu")
    assert (precision, quantize) == ("32-true", "int8") and timed.calls == 1
    assert said.startswith("int8 (auto: measured on this model's shape") and "bf16 1.67x, int8 2.00x" in said
    assert choose_form(cfg, "cpu")[2].startswith("int8 (auto: cached") and timed.calls == 1
    # int8 within 3% of bf16: bf16, the more exact
    other = TrunkConfig(d_model=64, n_layers=2, n_heads=2, d_ff=64)
    timed.seconds = {"fp32": 1.0, "bf16": 0.6, "int8": 0.59, "int8 + bf16": 0.7}
    assert choose_form(other, "cpu")[:2] == ("bf16-mixed", None)
    # an explicit int8 takes the faster int8 form, and warns that bf16 is faster, with both factors
    third = TrunkConfig(d_model=64, n_layers=2, n_heads=4, d_ff=64)
    timed.seconds = {"fp32": 1.0, "bf16": 0.4, "int8": 0.9, "int8 + bf16": 0.8}
    with pytest.warns(UserWarning, match=r"quantize=int8: on this CPU, .* this model's trunk runs 1.25x fp32 in "
                                         r"int8 \+ bf16 but 2.50x in bf16 \(measured\): leave quantize out"):
        assert choose_form(third, "cpu", quantize="int8")[:2] == ("bf16-mixed", "int8")
    # explicit precisions are kept; a GPU's auto is its rule, untimed
    assert choose_form(cfg, "cpu", precision="32-true") == ("32-true", None, None)
    calls = timed.calls
    assert choose_form(cfg, "meta")[1] is None and timed.calls == calls


def test_a_cpu_without_bf16_or_int8_units_predicts_in_fp32_untimed(timed, monkeypatch):
    from trunk.inference import calibrate
    from trunk.models.trunk import TrunkConfig

    monkeypatch.setattr(calibrate, "cpu_bf16_is_native", lambda: (False, "no bf16 units"))
    monkeypatch.setattr(calibrate, "int8_is_native", lambda: (False, "no int8 units"))
    monkeypatch.setattr(calibrate, "choose_precision", lambda device: ("32-true", "this CPU has no bf16 units"))
    said = calibrate.choose_form(TrunkConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64), "cpu")
    assert said == ("32-true", None, "32-true (auto: this CPU has no bf16 units)") and timed.calls == 0


def test_the_calibration_is_cached_per_machine_and_another_machines_is_measured_anew(timed, caplog):
    from trunk.inference.calibrate import calibrate
    from trunk.models.trunk import TrunkConfig

    cfg = TrunkConfig(d_model=32, n_layers=3, n_heads=2, d_ff=64)
    first = calibrate(cfg)  # measured for real: every form this CPU has units for, in seconds
    assert set(first.seconds) == {"fp32", "bf16", "int8", "int8 + bf16"} and not first.cached
    assert all(0 < s < 5 for s in first.seconds.values())
    again = calibrate(TrunkConfig(d_model=32, n_layers=12, n_heads=2, d_ff=64))  # depth does not change the ratios
    assert again.cached and again.seconds == first.seconds and timed.calls == 1

    cache = json.loads(timed.path.read_text())
    timed.path.write_text(json.dumps({**cache, "cpu": "Intel Xeon (AMX)"}))
    timed.seconds = {"fp32": 1.0, "bf16": 0.5, "int8": 0.7, "int8 + bf16": 0.6}
    with caplog.at_level("INFO"):
        fresh = calibrate(cfg)
    assert not fresh.cached and fresh.seconds == timed.seconds and timed.calls == 2
    assert "holds the times of Intel Xeon (AMX) with torch" in caplog.text and "ignored, measuring anew" in caplog.text
    assert json.loads(timed.path.read_text())["cpu"] != "Intel Xeon (AMX)"  # rewritten for this machine

    timed.path.write_text("{not json")
    with caplog.at_level("INFO"):
        assert not calibrate(cfg).cached
    assert "cannot be read" in caplog.text and calibrate(cfg).cached


def test_load_and_predict_quantize_when_int8_measures_fastest_and_keep_the_rule_when_told(trained, timed, tmp_path,
                                                                                            monkeypatch):
    ckpt, texts, args = trained
    timed.seconds = {"fp32": 1.0, "bf16": 0.7, "int8": 0.5, "int8 + bf16": 0.6}
    auto = load(ckpt)
    assert auto.precision == "32-true"
    assert isinstance(auto.model.trunk.backbone.blocks[0].ff.fc_in, Int8Linear)
    floats = load(ckpt, precision="32-true").predict(texts)
    for a, b in zip(floats, auto.predict(texts)):
        assert abs(a["probs"]["positive"] - b["probs"]["positive"]) < 0.005
    out = tmp_path / "auto.jsonl"
    run_cli(["predict", *args, f"--ckpt_path={ckpt}", f"--predictions.output={out}"])
    written = [json.loads(line) for line in out.read_text().splitlines()]
    int8 = [r["probs"]["positive"] for r in load(ckpt, precision="32-true", quantize="int8").predict(texts)]
    assert [r["probs"]["positive"] for r in written] == pytest.approx(int8, abs=1e-6)
    assert int8 != [r["probs"]["positive"] for r in floats]

    timed.seconds = {"fp32": 1.0, "bf16": 0.5, "int8": 0.7, "int8 + bf16": 0.6}
    monkeypatch.setenv("TRUNK_CACHE", str(tmp_path / "other-cache"))
    assert load(ckpt).precision == "bf16-mixed"
    monkeypatch.setenv("TRUNK_CALIBRATE", "0")
    calls = timed.calls
    ruled = load(ckpt)
    assert timed.calls == calls and not any(isinstance(m, Int8Linear) for m in ruled.model.modules())
