"""export_hf.py --onnx: onnx/model.onnx for every head and layout, equal to our model in onnxruntime
on texts of many lengths; a graph planted wrong (a weight changed, a NaN) is refused and nothing is
written; without onnxruntime, one line saying what to install."""
import builtins
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import numpy_helper

import checkpoints
import export_hf
import onnx_export
from conftest import one_error_line
from model import ModelConfig

LAYOUTS = {
    "bert": {"norm": "postln", "position": "learned", "feed_forward": "gelu"},
    "preln-rope-geglu": {"norm": "preln", "position": "rope", "feed_forward": "geglu"},
    "rmsnorm-sinusoidal": {"norm": "rmsnorm", "position": "sinusoidal", "feed_forward": "gelu"},
}
HEADS = {"mlm": {}, "sst2": {"num_labels": 2}, "stsb": {"num_labels": 1}, "ner": {"num_labels": 5},
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


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("task", HEADS)
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
