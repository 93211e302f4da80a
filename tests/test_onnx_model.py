"""src/interop/onnx_model.py: the inference scripts on an export's ONNX graph: classify.py, embed.py,
ner.py, fill_mask.py and qa.py take the exported directory, or a .onnx file in its onnx/ folder, as
they take the checkpoint, and give its answers (scores within 1e-4, the same labels, tags and spans);
inputs are batched by length and come back in their order; a directory without a graph, or a file
that is none, or a graph of another head or other inputs, is one line."""
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import classify
import embed
import export_hf
import fill_mask
import ner
from interop import onnx_model
import qa
from conftest import one_error_line
from tasks.embed_task import embed_texts
from tasks.squad_task import answer_questions
from test_onnx_export import LAYOUTS, random_checkpoint
from tasks.token_task import tag_sentences

SENTENCES = ["Fine.", "A gorgeous, witty, seductive movie that never stops surprising.", "dull",
             "The plot made no sense at all, and the acting was wooden from the first scene to the last one.",
             "Ça coûte 5€ — très cher!"]
CLASSIFIERS = dict.fromkeys(("sst2", "stsb"), classify.BertForSequenceClassification)
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
ANSWER_OUTPUTS = "start_logits [batch, sequence], end_logits [batch, sequence]"


def both(tmp_path, vocab, task: str, layout: str, kinds: dict):
    """(our model, the graph's model, vocabulary, the directory's checkpoint fields) of a fresh export."""
    tmp_path.mkdir(exist_ok=True)
    checkpoint = random_checkpoint(tmp_path / "model.pt", vocab, task, LAYOUTS[layout])
    export_hf.export(checkpoint, tmp_path / "hf", onnx=True)
    ours, _, _ = onnx_model.restore_model(checkpoint, kinds)
    graph, graph_vocab, fields = onnx_model.restore_model(tmp_path / "hf", kinds)
    assert isinstance(graph, onnx_model.OnnxModel) and graph_vocab.tokens == vocab.tokens
    return ours, graph, fields


# Every layout through the graph is test_onnx_export's; here the script's answers, a head each.
@pytest.mark.parametrize("task, layout", [("sst2", "bert"), ("stsb", "preln-rope-geglu")])
def test_classify_gives_the_checkpoints_answers_through_the_graph(vocab, tmp_path, task, layout):
    ours, graph, fields = both(tmp_path, vocab, task, layout, CLASSIFIERS)
    assert fields["task"] == task
    expected, found = (classify.classify(model, vocab, SENTENCES, None, 96, batch_size=2) for model in (ours, graph))
    assert [label for label, _ in found] == [label for label, _ in expected]
    assert np.allclose([value for _, value in found], [value for _, value in expected], atol=1e-4)


def test_answers_come_back_in_the_inputs_order_whatever_their_lengths(vocab, tmp_path):
    ours, _, _ = onnx_model.restore_model(random_checkpoint(tmp_path / "model.pt", vocab, "sst2", LAYOUTS["bert"]),
                                          CLASSIFIERS)
    alone = [classify.classify(ours, vocab, [text], None, 96)[0] for text in SENTENCES]
    batched = classify.classify(ours, vocab, SENTENCES, None, 96, batch_size=2)  # batches of neighbouring lengths
    assert [label for label, _ in batched] == [label for label, _ in alone]
    assert np.allclose([value for _, value in batched], [value for _, value in alone], atol=1e-5)


@pytest.mark.parametrize("layout", ["bert", "rmsnorm-sinusoidal"])
def test_embeddings_through_the_graph_equal_the_checkpoints(vocab, tmp_path, layout):
    ours, graph, _ = both(tmp_path, vocab, "embed", layout, {"embed": embed.BertForEmbedding})
    expected, found = (embed_texts(model, vocab, SENTENCES, 96, batch_size=2) for model in (ours, graph))
    assert np.allclose(np.linalg.norm(found, axis=1), 1, atol=1e-5)
    assert (found * expected).sum(1).min() > 0.9999


def test_ner_tags_and_answer_spans_through_the_graph_equal_the_checkpoints(vocab, tmp_path):
    ours, graph, _ = both(tmp_path / "ner", vocab, "ner", "preln-rope-geglu", {"ner": ner.BertForTokenClassification})
    words = [ner.words_of(vocab, text) for text in SENTENCES]
    assert tag_sentences(graph, vocab, words, 96, batch_size=2) == tag_sentences(ours, vocab, words, 96)
    kinds = dict.fromkeys(("squad", "squad_v2"), qa.BertForQuestionAnswering)
    ours, graph, fields = both(tmp_path / "squad", vocab, "squad", "bert", kinds)
    settings = qa.run_settings(fields, graph.config.max_len) | {"seq-len": 48, "doc-stride": 16}
    questions = ["What made no sense?"] * 2 + ["Who acted?"]
    contexts = [SENTENCES[3], SENTENCES[3] * 3, SENTENCES[1]]  # the second one needs several windows
    expected, found = (answer_questions(model, vocab, questions, contexts, settings, batch_size=2)
                       for model in (ours, graph))
    assert [text for text, _ in found] == [text for text, _ in expected]
    assert np.allclose([score for _, score in found], [score for _, score in expected], atol=1e-3)


def test_the_scripts_take_the_directory_its_onnx_folder_or_a_graph_file_in_it(vocab, tmp_path, capsys):
    checkpoint = random_checkpoint(tmp_path / "model.pt", vocab, "sst2", LAYOUTS["bert"])
    export_hf.export(checkpoint, tmp_path / "hf", onnx=True)
    outputs = []
    for source in (checkpoint, tmp_path / "hf", tmp_path / "hf" / "onnx", tmp_path / "hf" / "onnx" / "model.onnx"):
        classify.main(["--cp", str(source), *SENTENCES[:3]])
        outputs.append([line.split("\t")[0] for line in capsys.readouterr().out.splitlines()])
    assert outputs[0] == outputs[1] == outputs[2] == outputs[3] and len(outputs[0]) == 3


def test_a_directory_without_a_graph_or_a_file_that_is_none_is_one_line(vocab, tmp_path, capsys):
    checkpoint = random_checkpoint(tmp_path / "model.pt", vocab, "sst2", LAYOUTS["bert"])
    export_hf.export(checkpoint, tmp_path / "hf")
    line = one_error_line(capsys, lambda: classify.main(["--cp", str(tmp_path / "hf"), "fine"]))
    assert line == (f"error: {tmp_path / 'hf'}: a directory without onnx/model.onnx: export with --onnx, "
                    f"or give a checkpoint")
    (tmp_path / "hf" / "onnx").mkdir()
    (tmp_path / "hf" / "onnx" / "model.onnx").write_bytes(b"not a graph")
    line = one_error_line(capsys, lambda: classify.main(["--cp", str(tmp_path / "hf"), "fine"]))
    assert line.startswith(f"error: {tmp_path / 'hf' / 'onnx' / 'model.onnx'}: not a graph onnxruntime runs (")
    (tmp_path / "texts.txt").write_text("fine\n", encoding="utf-8")
    line = one_error_line(capsys, lambda: embed.main(["--cp", str(tmp_path / "hf" / "onnx" / "model.onnx"),
                                                      "-i", str(tmp_path / "texts.txt"), "--query", "x"]))
    assert line == f"error: {tmp_path / 'hf' / 'onnx' / 'model.onnx'}: a sst2 model; expected embed"


def test_fill_mask_gives_the_checkpoints_candidates_through_the_graph(vocab, tmp_path):
    ours, graph, fields = both(tmp_path, vocab, "mlm", "preln-rope-geglu", {"mlm": fill_mask.BertForMaskedLM})
    assert fields["task"] == "mlm"
    for text in ("a [MASK] film .", "[MASK] , and then [MASK] was wooden from the first scene ."):
        expected, found = (fill_mask.fill_mask(model, vocab, text, 5) for model in (ours, graph))
        assert [[token for token, _ in row] for row in found] == [[token for token, _ in row] for row in expected]
        assert np.allclose([[p for _, p in row] for row in found], [[p for _, p in row] for row in expected],
                           atol=1e-5)


def test_the_graphs_metadata_reads_no_weights(vocab, tmp_path, monkeypatch):
    """The graph holds the weights: beside it the directory gives shapes alone (safetensors' header)."""
    from interop import hf_import
    checkpoint = random_checkpoint(tmp_path / "model.pt", vocab, "sst2", LAYOUTS["bert"])
    export_hf.export(checkpoint, tmp_path / "hf", onnx=True)

    def refused(*args, **kwargs):
        raise AssertionError("the weights were read")

    monkeypatch.setattr(hf_import, "load_file", refused)
    graph, _, fields = onnx_model.restore_model(tmp_path / "hf", CLASSIFIERS)
    assert fields["task"] == "sst2" and isinstance(graph, onnx_model.OnnxModel)
    assert all(tensor.is_meta for tensor in fields["model"].values())


@pytest.fixture(scope="module")
def exports(vocab, tmp_path_factory):
    """task -> a fresh export with onnx/model.onnx, one of each head the scripts run."""
    folder = tmp_path_factory.mktemp("exports")
    found = {}
    for task in ("sst2", "mlm", "ner", "squad", "embed"):
        export_hf.export(random_checkpoint(folder / f"{task}.pt", vocab, task, LAYOUTS["bert"]), folder / task,
                         onnx=True)
        found[task] = folder / task
    return found


def with_graph_of(exports, task: str, other: str, folder: Path) -> Path:
    """A copy of the task's export whose onnx/model.onnx is the other head's."""
    directory = folder / f"{task}-with-{other}-graph"
    shutil.copytree(exports[task], directory)
    shutil.copyfile(exports[other] / "onnx" / "model.onnx", directory / "onnx" / "model.onnx")
    return directory


@pytest.mark.parametrize("task, other, run, found, expected", [
    ("sst2", "mlm", lambda cp: classify.main(["--cp", cp, "fine"]),
     "logits [batch, sequence, 2000]", "a sequence classifier's logits [batch, 2]"),
    ("mlm", "sst2", lambda cp: fill_mask.main(["--cp", cp, "a [MASK] film"]),
     "logits [batch, 2]", "a masked LM's logits [batch, sequence, 2000]"),
    ("ner", "mlm", lambda cp: ner.main(["--cp", cp, "a fine film"]),
     "logits [batch, sequence, 2000]", "a token classifier's logits [batch, sequence, 5]"),
    ("squad", "sst2", lambda cp: qa.main(["--cp", cp, "-q", "What?", "-c", "A film."]),
     "logits [batch, 2]", f"a question answering model's {ANSWER_OUTPUTS}"),
    ("embed", "squad", lambda cp: embed.main(["--cp", cp, "-i", cp + "/README.md", "--query", "film"]),
     ANSWER_OUTPUTS, "an encoder's last_hidden_state [batch, sequence, 32]"),
])
def test_a_graph_of_another_head_is_one_line_naming_what_it_gives_and_what_was_expected(
        exports, tmp_path, capsys, task, other, run, found, expected):
    directory = with_graph_of(exports, task, other, tmp_path)
    line = one_error_line(capsys, lambda: run(str(directory)))
    assert line == f"error: {directory / 'onnx' / 'model.onnx'}: the graph gives {found}; expected {expected}"


def test_the_script_refuses_a_classifiers_directory_holding_an_mlm_graph_without_a_traceback(exports, tmp_path):
    directory = with_graph_of(exports, "sst2", "mlm", tmp_path)
    result = subprocess.run([sys.executable, str(SCRIPTS / "classify.py"), "--cp", str(directory), "a fine film"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: {directory / 'onnx' / 'model.onnx'}: the graph gives logits "
                                          f"[batch, sequence, 2000]; expected a sequence classifier's logits "
                                          f"[batch, 2]"]


def graph_file(path: Path, inputs: dict, outputs: dict) -> Path:
    """A .onnx file of the given inputs and outputs (name -> shape, float), each output the first input."""
    first = next(iter(inputs))
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", [first], [name]) for name in outputs], "other",
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT64, shape) for name, shape in inputs.items()],
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT64, shape) for name, shape in outputs.items()])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=8), path)
    return path


@pytest.mark.parametrize("inputs, shown", [
    ({"pixel_values": ["batch", 3]}, "pixel_values [batch, 3]"),
    ({"input_ids": ["batch", "sequence", 4]}, "input_ids [batch, sequence, 4]"),
    ({"input_ids": [1, "sequence"], "attention_mask": [1, "sequence"]},
     "input_ids [1, sequence], attention_mask [1, sequence]"),
])
def test_a_graph_that_takes_other_inputs_is_one_line(exports, tmp_path, capsys, inputs, shown):
    directory = tmp_path / "sst2"
    shutil.copytree(exports["sst2"], directory)
    graph = graph_file(directory / "onnx" / "model.onnx", inputs, {"logits": ["batch", 2]})
    line = one_error_line(capsys, lambda: classify.main(["--cp", str(directory), "fine"]))
    assert line == (f"error: {graph}: the graph takes {shown}; expected input_ids, with attention_mask and "
                    f"token_type_ids or not, each [batch, sequence]")


def test_a_graph_whose_axes_are_free_or_unnamed_passes_the_check(exports, tmp_path, capsys):
    """The legacy exporter named a classifier's batch axis `Gemmlogits_dim_0`; a graph may leave a size unsaid."""
    directory = tmp_path / "sst2"
    shutil.copytree(exports["sst2"], directory)
    graph_file(directory / "onnx" / "model.onnx", {"input_ids": ["b", None]}, {"logits": ["Gemmlogits_dim_0", None]})
    model, _, _ = onnx_model.restore_model(directory, CLASSIFIERS)
    assert isinstance(model, onnx_model.OnnxSequenceClassification)
