"""export_hf.py --onnx: onnx/model.onnx for every head and layout, equal to our model in onnxruntime
on texts of many lengths; a graph planted wrong (a weight changed, a NaN) is refused and nothing is
written; without onnxruntime, one line saying what to install. --quantize int8: the int8 graph
beside it, both scored on the run's validation split."""
import builtins
import contextlib
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import numpy_helper

import checkpoints
import classify
import export_hf
from interop import onnx_export
from tasks.classification_task import ClassificationTask
from config import Config
from conftest import one_error_line
from model import BertForCausalLM, BertForSequenceClassification, ModelConfig

LAYOUTS = {
    "bert": {"norm": "postln", "position": "learned", "feed_forward": "gelu"},
    "preln-rope-geglu": {"norm": "preln", "position": "rope", "feed_forward": "geglu"},
    "rmsnorm-sinusoidal": {"norm": "rmsnorm", "position": "sinusoidal", "feed_forward": "gelu"},
}
HEADS = {"mlm": {}, "sst2": {"num_labels": 2}, "stsb": {"num_labels": 1},
         "ner": {"num_labels": 5, "label_names": ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")},
         "squad": {}, "embed": {"pooling": "mean"}}


def random_checkpoint(path: Path, vocab, task: str, layout: dict) -> Path:
    """Fresh weights of a small model of the task's head: what the graph computes is tested, not how well."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=vocab.size, max_len=96, d_model=32, heads=2, n_layer=2, d_ff=64,
                         **layout, **HEADS[task])
    model = onnx_export.model_class(task)(config)
    state = checkpoints.make_state(task=task, weights=model.state_dict(), model_config=config, vocab=vocab,
                                   config={"seq-len": 96})
    checkpoints.save(path, state)
    return path


# A head reads the encoder's output whatever the encoder's layout, so each head under one layout and each
# layout under two heads cover both (an export costs seconds of torch.export: 6 of them, not 18).
HEADS_AND_LAYOUTS = [("mlm", "bert"), ("sst2", "preln-rope-geglu"), ("stsb", "rmsnorm-sinusoidal"),
                     ("ner", "rmsnorm-sinusoidal"), ("squad", "bert"), ("embed", "preln-rope-geglu")]


def test_the_pairs_cover_every_head_and_every_layout_twice():
    assert sorted({task for task, _ in HEADS_AND_LAYOUTS}) == sorted(HEADS)
    assert sorted(layout for _, layout in HEADS_AND_LAYOUTS) == sorted([*LAYOUTS, *LAYOUTS])


@pytest.mark.parametrize("task, layout", HEADS_AND_LAYOUTS)
def test_the_graph_of_every_head_and_layout_runs_in_onnxruntime_as_our_model(vocab, tmp_path, task, layout):
    checkpoint = random_checkpoint(tmp_path / "model.pt", vocab, task, LAYOUTS[layout])
    names = export_hf.export(checkpoint, tmp_path / "hf", onnx=True)
    assert "onnx/model.onnx" in names
    session = onnxruntime.InferenceSession(str(tmp_path / "hf" / "onnx" / "model.onnx"))
    assert [each.name for each in session.get_outputs()] == list(onnx_export.output_names(task))
    assert {each.name for each in session.get_inputs()} <= set(onnx_export.INPUTS)
    # Lengths past the traced example's and a padded batch, in a fresh session: check_graph's own comparison.
    wrapper = onnx_export.exported_model(checkpoints.load(checkpoint))
    batches = onnx_export.check_batches(vocab, 96)
    assert max(ids.shape[1] for ids, _ in batches) == 96 and max(len(ids) for ids, _ in batches) > 1
    assert onnx_export.check_graph(tmp_path / "hf" / "onnx" / "model.onnx", wrapper, batches, Path("x")) < 1e-4


def test_the_graph_is_one_file_of_torch_exports_opset_with_the_batch_and_sequence_free(vocab, tmp_path):
    checkpoint = random_checkpoint(tmp_path / "model.pt", vocab, "sst2", LAYOUTS["preln-rope-geglu"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_hf.export(checkpoint, tmp_path / "hf", onnx=True)
    assert not [each for each in caught if "legacy TorchScript-based ONNX export" in str(each.message)]
    assert [path.name for path in (tmp_path / "hf" / "onnx").iterdir()] == ["model.onnx"]  # the weights inside
    graph = onnx.load(tmp_path / "hf" / "onnx" / "model.onnx", load_external_data=False)
    assert not any(onnx.external_data_helper.uses_external_data(tensor) for tensor in graph.graph.initializer)
    assert [each.version for each in graph.opset_import if each.domain == ""] == [onnx_export.OPSET] == [18]
    session = onnxruntime.InferenceSession(str(tmp_path / "hf" / "onnx" / "model.onnx"))
    assert [each.shape for each in session.get_inputs()] == [["batch", "sequence"]] * 3
    assert [each.shape for each in session.get_outputs()] == [["batch", 2]]


def test_the_exporters_own_warnings_reach_the_user(vocab, tmp_path, monkeypatch):
    """A deprecation torch.onnx.export warns of is shown, not hidden (only its notes on its own internals are)."""
    checkpoint = random_checkpoint(tmp_path / "model.pt", vocab, "sst2", LAYOUTS["bert"])
    real_export = torch.onnx.export

    def export(*args, **kwargs):
        warnings.warn("this way of exporting is deprecated", DeprecationWarning, stacklevel=2)
        return real_export(*args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", export)
    with pytest.warns(DeprecationWarning, match="this way of exporting is deprecated"):
        export_hf.export(checkpoint, tmp_path / "hf", onnx=True)


def planting(change):
    """A torch.onnx.export that writes the graph, then changes its classifier's weight with `change`."""
    real_export = torch.onnx.export

    def export(*args, **kwargs):
        real_export(*args, **kwargs)
        path = args[2]
        graph = onnx.load(path)
        weight = next(tensor for tensor in graph.graph.initializer if tensor.name.endswith("classifier.weight"))
        weight.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(weight).copy()), weight.name))
        onnx.save(graph, path)
    return export


@pytest.mark.parametrize("change, message", [
    (lambda values: values + 0.05, "differs from ours by"),
    (lambda values: np.full_like(values, np.nan), "is not finite"),
])
def test_a_graph_planted_wrong_is_refused_and_nothing_is_written(vocab, tmp_path, monkeypatch, capsys, change,
                                                                  message):
    checkpoint = random_checkpoint(tmp_path / "model.pt", vocab, "sst2", LAYOUTS["bert"])
    monkeypatch.setattr(torch.onnx, "export", planting(change))
    line = one_error_line(capsys, lambda: export_hf.main(["--cp", str(checkpoint), "-o", str(tmp_path / "hf"),
                                                          "--onnx"]))
    assert line.startswith(f"error: {tmp_path / 'hf' / 'onnx' / 'model.onnx'}: the graph's logits ")
    assert message in line and line.endswith(": not written")
    assert not (tmp_path / "hf").exists() and [path.name for path in tmp_path.iterdir()] == ["model.pt"]


def test_without_onnxruntime_the_export_says_what_to_install(vocab, tmp_path, monkeypatch, capsys):
    checkpoint = random_checkpoint(tmp_path / "model.pt", vocab, "sst2", LAYOUTS["bert"])
    real_import = builtins.__import__

    def without_onnxruntime(name, *args, **kwargs):
        if name == "onnxruntime":
            raise ImportError("No module named 'onnxruntime'", name="onnxruntime")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_onnxruntime)
    line = one_error_line(capsys, lambda: export_hf.main(["--cp", str(checkpoint), "-o", str(tmp_path / "hf"),
                                                          "--onnx"]))
    assert line == ("error: --onnx needs the onnx and onnxruntime packages (onnxruntime is missing): "
                    "pip install onnx onnxruntime")
    assert not (tmp_path / "hf").exists()


def sst2_checkpoint_with_data(tmp_path: Path, vocab, rotten_tomatoes) -> Path:
    """A checkpoint of fresh sst2 weights whose run's settings lead to SST-2's validation split."""
    import make_demo
    make_demo.write_sst2(tmp_path / "data" / "datasets", rotten_tomatoes, seed=123)
    checkpoint = random_checkpoint(tmp_path / "model.pt", vocab, "sst2", LAYOUTS["preln-rope-geglu"])
    state = checkpoints.load(checkpoint)
    state["config"] = {"task-type": "sst2", "seq-len": 96, "base-dir": str(tmp_path / "data"), "batch-size": 64}
    checkpoints.save(checkpoint, state)
    return checkpoint


def test_quantize_int8_scores_both_graphs_on_the_runs_validation_split(vocab, tmp_path, rotten_tomatoes, capsys):
    checkpoint = sst2_checkpoint_with_data(tmp_path, vocab, rotten_tomatoes)
    export_hf.main(["--cp", str(checkpoint), "-o", str(tmp_path / "hf"), "--quantize", "int8"])
    graphs = tmp_path / "hf" / "onnx"
    report = json.loads((graphs / "quantization.json").read_text())
    assert report["metric"] == "accuracy" and report["split"] == "val"
    for kind, name in (("float32", "model.onnx"), ("int8", "model_qint8.onnx")):
        assert report[kind]["file"] == f"onnx/{name}"
        assert report[kind]["megabytes"] == round((graphs / name).stat().st_size / 2 ** 20, 2)
    # the weights at a quarter of their bytes; the graph's own (names, shapes, small ops) stay as they are
    assert report["int8"]["megabytes"] < report["float32"]["megabytes"] * 0.6
    # The float32 graph scores as our model does on the same split.
    settings = checkpoints.saved_settings(checkpoints.load(checkpoint))
    task = ClassificationTask(Config(**settings), vocab, torch.device("cpu"))
    model, _, _ = checkpoints.restore_model(checkpoint, {"sst2": BertForSequenceClassification})
    ours = task.evaluate(model, task.eval_batches("val", None), contextlib.nullcontext())
    assert report["float32"]["metrics"]["examples"] == ours["examples"] > 100
    assert report["float32"]["metrics"]["accuracy"] == pytest.approx(ours["accuracy"], abs=1.5 / ours["examples"])
    assert 0 <= report["int8"]["metrics"]["accuracy"] <= 1
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"validation of {ours['examples']:,}: accuracy ") and "int8" in line
    # The int8 graph runs in the inference scripts as the float32 one does.
    classify.main(["--cp", str(graphs / "model_qint8.onnx"), "a gorgeous film", "dull"])
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_quantize_without_a_validation_split_or_of_a_pre_training_is_one_line(vocab, tmp_path, rotten_tomatoes,
                                                                              capsys):
    checkpoint = sst2_checkpoint_with_data(tmp_path, vocab, rotten_tomatoes)
    shutil.rmtree(tmp_path / "data")
    line = one_error_line(capsys, lambda: export_hf.main(["--cp", str(checkpoint), "-o", str(tmp_path / "hf"),
                                                          "--quantize", "int8"]))
    assert str(tmp_path / "data" / "datasets") in line
    mlm = random_checkpoint(tmp_path / "mlm.pt", vocab, "mlm", LAYOUTS["bert"])
    line = one_error_line(capsys, lambda: export_hf.main(["--cp", str(mlm), "-o", str(tmp_path / "hf"),
                                                          "--quantize", "int8"]))
    assert line == (f"error: {mlm}: a mlm checkpoint: --quantize scores the graphs on a fine-tuning task's "
                    f"validation split; quantize a fine-tuned model")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mlm.pt", "model.pt"]


def test_a_causal_lm_has_no_graph_and_is_one_line(vocab, tmp_path, capsys):
    """A runtime's classes load MLM, fine-tuned and encoder graphs: a causal LM is refused, nothing written."""
    config = ModelConfig(vocab_size=vocab.size, max_len=96, d_model=32, heads=2, n_layer=2, d_ff=64, causal=True,
                         **LAYOUTS["bert"])
    checkpoint = tmp_path / "clm.pt"
    checkpoints.save(checkpoint, checkpoints.make_state(task="clm", weights=BertForCausalLM(config).state_dict(),
                                                        model_config=config, vocab=vocab, config={"seq-len": 96}))
    line = one_error_line(capsys, lambda: export_hf.main(["--cp", str(checkpoint), "-o", str(tmp_path / "hf"),
                                                          "--onnx"]))
    assert line == (f"error: {checkpoint}: a clm checkpoint: --onnx exports mlm, fine-tuned and encoder models; "
                    f"export it without --onnx")
    assert not (tmp_path / "hf").exists()


def test_readmes_serving_snippet_runs_as_written_on_an_export(vocab, tmp_path, monkeypatch, capsys):
    """README's "Export and serve" Python, run on an sst2 export where it looks: a class and its probability
    for each of its two sentences, the same as our model gives."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    snippet = readme.split("## Export and serve", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    checkpoint = random_checkpoint(tmp_path / "sst2.pt", vocab, "sst2", LAYOUTS["preln-rope-geglu"])
    state = checkpoints.load(checkpoint)
    state["model"]["classifier.weight"] *= 100  # a decided classifier: fresh weights answer 0.5 for everything
    checkpoints.save(checkpoint, state)
    export_hf.export(checkpoint, tmp_path / "wiki" / "hf-sst2", onnx=True)
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "README.md", "exec"), {})
    printed = [line.split() for line in capsys.readouterr().out.splitlines()]
    model = onnx_export.exported_model(state)
    for (label, probability), sentence in zip(printed, ["a gripping film", "a dull, lifeless sequel"], strict=True):
        ids = torch.tensor([[vocab.cls_id, *vocab.encode([sentence])[0], vocab.sep_id]])
        with torch.no_grad():
            probabilities = model(ids, torch.ones_like(ids), torch.zeros_like(ids)).softmax(-1)[0]
        assert label == ("negative", "positive")[int(probabilities.argmax())]
        assert float(probability) == pytest.approx(float(probabilities.max()), abs=0.01)
