"""Export to transformers for every architecture and task: loaded with the Auto classes and the
pipelines, compared output by output with ours, and imported back."""
import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import SafetensorError
from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForPreTraining,
                          AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments, pipeline)
from transformers import BertForMaskedLM as TheirMaskedLM, BertForSequenceClassification as TheirClassifier
from transformers import BertTokenizerFast
from transformers.dynamic_module_utils import get_imports, get_relative_import_files, get_relative_imports

import checkpoints
from checkpoints import restore_model
from conftest import make_mlm_workdir, one_error_line, prepare_mlm_base_dir
import export_hf
from tasks import pair_encoding
from interop import hf_export
from interop import hf_import
import import_hf
import main
import make_demo
from vocab import Vocab
from model import (BertForCausalLM, BertForMaskedLM, BertForPreTraining, BertForSequenceClassification,
                   ElectraForPreTraining, ModelConfig)

SENTENCES = ["The acting is superb, and the score lifts every scene.", "a dull , lifeless script ."]
PAIRS = [("A man is playing a guitar.", "Someone plays an instrument on stage tonight."),
         ("The cat sleeps.", "A dog barks at the mailman.")]
# Every value of every architecture key, over the tasks: (task settings, architecture settings).
VARIANTS = {
    "mlm-preln-rope-geglu": (["--task-type", "mlm"],
                             ["--norm", "preln", "--position", "rope", "--rope-theta", "160000",
                              "--feed-forward", "geglu"]),
    "mlm-nsp-rmsnorm-sinusoidal": (["--task-type", "mlm", "--sentence-objective", "nsp"],
                                   ["--norm", "rmsnorm", "--position", "sinusoidal"]),
    "mlm-nsp-bert": (["--task-type", "mlm", "--sentence-objective", "nsp"],
                     ["--norm", "postln", "--position", "learned"]),
    "clm-preln-rope": (["--task-type", "clm"], ["--norm", "preln", "--position", "rope"]),
    "clm-bert": (["--task-type", "clm"], ["--norm", "postln", "--position", "learned"]),
    "electra-preln-rope": (["--task-type", "electra"], ["--norm", "preln", "--position", "rope"]),
}
# Fine-tuned classifiers: (architecture settings, the pre-training run they start from or None).
FINE_TUNED = {"sst2-preln-rope-geglu": (VARIANTS["mlm-preln-rope-geglu"][1], "mlm-preln-rope-geglu"),
              "sst2-mean-rmsnorm": (["--norm", "rmsnorm", "--position", "sinusoidal", "--pooling", "mean"], None)}
OUR_CLASSES = {"mlm": BertForMaskedLM, "clm": BertForCausalLM, "electra": ElectraForPreTraining}


SHORT_RUN = dict(max_iters=3, lr_decay_iters=3, warmup_iters=1, val_interval=3, learning_rate=1e-2)


@pytest.fixture(scope="module")
def workdir(mlm_workdir_factory, rotten_tomatoes, tmp_path_factory):
    directory = mlm_workdir_factory(tmp_path_factory.mktemp("export") / "work", **SHORT_RUN)
    make_demo.write_sst2(directory / "datasets", rotten_tomatoes, seed=123)
    return directory


@pytest.fixture(scope="module")
def pairs_workdir(imdb_corpus, vocab_dir, tmp_path_factory):
    """Shards of sentence pairs, for the next-sentence head (sentence order's is the same head)."""
    base = prepare_mlm_base_dir(tmp_path_factory.mktemp("pairs"), imdb_corpus, vocab_dir, "--pairs", "nsp")
    return make_mlm_workdir(base, tmp_path_factory.mktemp("pairs_work") / "work", **SHORT_RUN)


def train(workdir: Path, options: list[str], start: Path | None = None) -> Path:
    """A few steps (so no weight is at its initial value); the last checkpoint."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        run_dir = main.run(main.load_config(None, options), start, False)
    return run_dir / "checkpoints" / "checkpoint.pt"


@pytest.fixture(scope="module")
def trained(workdir, pairs_workdir):
    """name -> checkpoint, trained on demand once per module."""
    cache = {}

    def get(name: str) -> Path:
        if name not in cache:
            if name in FINE_TUNED:
                architecture, start = FINE_TUNED[name]
                cache[name] = train(workdir, ["--task-type", "sst2", *architecture], start and get(start))
            else:
                options = VARIANTS[name][0] + VARIANTS[name][1]
                cache[name] = train(pairs_workdir if "--sentence-objective" in options else workdir, options)
        return cache[name]
    return get


def our_model(path: Path):
    checkpoint = checkpoints.load(path)
    config = ModelConfig(**checkpoint["model_config"])
    kind = OUR_CLASSES.get(checkpoint["task"], BertForSequenceClassification)
    if checkpoint["task"] == "mlm" and config.sentence_classes:
        kind = BertForPreTraining
    model = kind(config)
    model.load_state_dict(checkpoint["model"])
    return model.eval(), checkpoint


def exported(path: Path, directory: Path) -> Path:
    export_hf.main(["--cp", str(path), "-o", str(directory)])
    return directory


def padded_inputs(directory: Path, texts=SENTENCES):
    tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
    inputs = tokenizer(*zip(*texts), padding=True, return_tensors="pt") if isinstance(texts[0], tuple) else (
        tokenizer(texts, padding=True, return_tensors="pt"))
    assert inputs["attention_mask"].min() == 0  # a padded batch
    return inputs


def our_hidden(model, inputs):
    return model.encoder(inputs["input_ids"], inputs["attention_mask"].bool(), inputs["token_type_ids"])


def loaded(auto_class, directory: Path, unused: tuple[str, ...] = ()):
    """auto_class.from_pretrained, with no weight missing or of another shape, and none left
    unused but those starting with `unused` (heads this class has not)."""
    model, info = auto_class.from_pretrained(directory, trust_remote_code=True, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    assert all(name.startswith(unused) for name in info["unexpected_keys"]) if unused else not info["unexpected_keys"]
    return model.eval()


def close(ours, theirs):
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------- the shipped code

def test_the_shipped_model_code_is_ours_as_it_is_and_needs_torch_alone(tmp_path):
    """transformers copies the files a modeling file imports relatively and requires every other
    import installed: model.py may need torch and its siblings architecture.py and cpu_kernels.py,
    and nothing of ours."""
    for name, text in hf_export.code_files().items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    for name in hf_export.MODEL_FILES:
        assert (tmp_path / name).read_text(encoding="utf-8") == (hf_export.SOURCE / name).read_text(encoding="utf-8")
        assert set(get_imports(tmp_path / name)) <= {"dataclasses", "functools", "math", "torch"}
    assert sorted(get_relative_imports(tmp_path / "model.py")) == ["architecture", "cpu_kernels"]
    assert set(get_relative_import_files(tmp_path / "modeling_bert_variant.py")) == {
        str(tmp_path / name) for name in ("configuration_bert_variant.py", *hf_export.MODEL_FILES)}


# ----------------------------------------------------------------------------------------- every architecture

@pytest.mark.parametrize("name", ["mlm-preln-rope-geglu", "mlm-nsp-rmsnorm-sinusoidal", "mlm-nsp-bert"])
def test_masked_lm_exports_with_equal_logits_in_auto_classes_and_fill_mask(trained, name, tmp_path):
    path = trained(name)
    ours, checkpoint = our_model(path)
    directory = exported(path, tmp_path / "hf")
    inputs = padded_inputs(directory)
    real = inputs["attention_mask"].bool()
    encoder = AutoModel.from_pretrained(directory, trust_remote_code=True).eval()
    if ours.config.position == "rope":  # the exported base, not rope's default, turns the angles
        assert encoder.config.rope_theta == ours.config.rope_theta == 160_000
    with torch.no_grad():
        hidden = our_hidden(ours, inputs)
        close(hidden[real], encoder(**inputs).last_hidden_state[real])
        sentence_head = ("pooler.", "sentence_head.", "bert.pooler.", "cls.seq_relationship.")
        masked_lm = loaded(AutoModelForMaskedLM, directory, unused=sentence_head)
        close(ours.head(hidden)[real], masked_lm(**inputs).logits[real])
        if checkpoint["model_config"]["sentence_classes"]:
            output = loaded(AutoModelForPreTraining, directory)(**inputs)
            close(ours.classify_pair(hidden), output.seq_relationship_logits)
            close(ours.head(hidden)[real], output.prediction_logits[real])

    fill = pipeline("fill-mask", model=str(directory), trust_remote_code=True)
    text = "the acting is [MASK] ."
    ids = torch.tensor([fill.tokenizer(text)["input_ids"]])
    with torch.no_grad():
        expected = ours.head(ours.encoder(ids))[0, ids[0].tolist().index(fill.tokenizer.mask_token_id)].argmax()
    assert fill(text)[0]["token"] == int(expected)


@pytest.mark.parametrize("name", ["clm-preln-rope", "clm-bert"])
def test_causal_lm_exports_with_equal_logits(trained, name, tmp_path):
    path = trained(name)
    ours, _ = our_model(path)
    directory = exported(path, tmp_path / "hf")
    inputs = padded_inputs(directory)
    real = inputs["attention_mask"].bool()
    theirs = loaded(AutoModelForCausalLM, directory)
    with torch.no_grad():
        close(ours.head(ours.encoder(inputs["input_ids"], real))[real],
              theirs(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits[real])


def test_electras_discriminator_exports_with_its_detector(trained, tmp_path):
    path = trained("electra-preln-rope")
    ours, _ = our_model(path)
    directory = exported(path, tmp_path / "hf")
    inputs = padded_inputs(directory)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        close(ours.detector(our_hidden(ours, inputs)).squeeze(-1)[real],
              loaded(AutoModelForPreTraining, directory)(**inputs).logits[real])
    assert not any(name.startswith("generator") for name in json.dumps(
        sorted(hf_export.exported_weights(checkpoints.load(path)))).split('"'))


@pytest.mark.parametrize("name", ["sst2-preln-rope-geglu", "sst2-mean-rmsnorm"])
def test_classifier_exports_with_label_names_and_equal_scores(trained, name, tmp_path):
    path = trained(name)
    ours, _ = our_model(path)
    directory = exported(path, tmp_path / "hf")
    inputs = padded_inputs(directory)
    theirs = loaded(AutoModelForSequenceClassification, directory)
    assert theirs.config.id2label == {0: "negative", 1: "positive"} and theirs.config.label2id["positive"] == 1
    # The directory's cpu_kernels.py, not src/'s: a user has no src/ to fall back on.
    assert type(theirs.dropout).__module__.startswith("transformers_modules.")
    with torch.no_grad():
        logits = ours(inputs["input_ids"], attention_mask=inputs["attention_mask"].bool(),
                      segment_ids=inputs["token_type_ids"])[0]
        close(logits, theirs(**inputs).logits)
    classify = pipeline("text-classification", model=str(directory), trust_remote_code=True)
    results = classify(SENTENCES)
    probabilities = logits.softmax(-1)
    for result, row in zip(results, probabilities):
        assert result["label"] == ("negative", "positive")[int(row.argmax())]
        assert result["score"] == pytest.approx(float(row.max()), abs=1e-4)


def regression_checkpoint(path: Path, out: Path) -> Path:
    """An STS-B model: the SST-2 checkpoint with a one-output head (random, not zero)."""
    checkpoint = checkpoints.load(path)
    torch.manual_seed(1)
    checkpoint["model"]["classifier.weight"] = torch.randn(1, checkpoint["model_config"]["d_model"]) * 0.1
    checkpoint["model"]["classifier.bias"] = torch.tensor([2.5])
    checkpoint["model_config"]["num_labels"] = 1
    checkpoint["task"] = "stsb"
    checkpoints.save(out, checkpoint)
    return out


def test_a_regression_exports_as_one_score_and_pairs_keep_their_segments(trained, tmp_path):
    path = regression_checkpoint(trained("sst2-preln-rope-geglu"), tmp_path / "stsb.pt")
    ours, _ = our_model(path)
    directory = exported(path, tmp_path / "hf")
    inputs = padded_inputs(directory, PAIRS)
    vocab = checkpoints.load(path)["vocab"]
    encoded = pair_encoding.encode_examples(Vocab(tuple(vocab)), [a for a, _ in PAIRS], [b for _, b in PAIRS], 64)
    for row, length in enumerate(inputs["attention_mask"].sum(1).tolist()):  # as fine-tuning encodes them
        rows = slice(encoded.offsets[row], encoded.offsets[row + 1])
        assert inputs["input_ids"][row, :length].tolist() == encoded.tokens[rows].tolist()
        assert inputs["token_type_ids"][row, :length].tolist() == encoded.segments[rows].tolist()
    theirs = loaded(AutoModelForSequenceClassification, directory)
    assert theirs.config.problem_type == "regression" and theirs.config.id2label == {0: "similarity"}
    with torch.no_grad():
        close(ours(inputs["input_ids"], attention_mask=inputs["attention_mask"].bool(),
                   segment_ids=inputs["token_type_ids"])[0], theirs(**inputs).logits)


def test_bert_layout_stays_native_and_others_carry_their_code(trained, tmp_path):
    native = exported(trained("clm-bert"), tmp_path / "native")
    assert json.loads((native / "config.json").read_text())["architectures"] == ["BertLMHeadModel"]
    assert not list(native.glob("*.py"))
    assert AutoConfig.from_pretrained(native).model_type == "bert"  # no trust_remote_code needed
    variant = exported(trained("mlm-preln-rope-geglu"), tmp_path / "variant")
    config = json.loads((variant / "config.json").read_text())
    assert config["model_type"] == "bert-variant" and config["norm"] == "preln"
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForMaskedLM",
                                       "AutoModelForSequenceClassification"}
    for name in hf_export.MODEL_FILES:
        assert (variant / name).read_text() == (hf_export.SOURCE / name).read_text()


def test_the_model_card_says_architecture_training_and_how_to_load(trained, tmp_path):
    card = (exported(trained("sst2-preln-rope-geglu"), tmp_path / "hf") / "README.md").read_text()
    assert "norm preln, positions rope" in card and "feed-forward 128 (geglu)" in card
    assert "- mlm: 3 steps" in card and "- sst2: 3 steps" in card  # the pre-training behind the fine-tuning
    assert "train_imdb_64_*.msgpack" in card
    assert "AutoModelForSequenceClassification.from_pretrained(DIRECTORY, trust_remote_code=True)" in card


# ----------------------------------------------------------------------------------------- BERT's own classes

# Two sentences of other lengths: transformers' tokenizer pads the shorter.
UNEVEN_SENTENCES = ["The acting is superb, and the score lifts every scene.",
             "a dull , lifeless script that never finds its footing ."]


@pytest.fixture(scope="module")
def bert_run(mlm_workdir_factory, tmp_path_factory) -> Path:
    """A base directory with a 10-step MLM run of BERT's architecture (what transformers can hold)."""
    directory = mlm_workdir_factory(tmp_path_factory.mktemp("bert") / "work", norm="postln", position="learned",
                                    max_iters=10, lr_decay_iters=10, val_interval=10)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(directory)
        main.run(main.load_config(None, []), None, False)
    return directory


@pytest.fixture(scope="module")
def mlm_checkpoint(bert_run):
    return bert_run / "runs" / "run0" / "checkpoints" / "checkpoint.pt"


@pytest.fixture(scope="module")
def classifier_checkpoint(bert_run, mlm_checkpoint, rotten_tomatoes, tmp_path_factory):
    base = tmp_path_factory.mktemp("sst2")
    shutil.copytree(bert_run / "vocab", base / "vocab")
    make_demo.write_sst2(base / "datasets", rotten_tomatoes, seed=123)
    shutil.copy(bert_run / "config.ini", base / "config.ini")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(base)
        config = main.load_config(None, ["--task-type", "sst2", "--max-iters", "5", "--val-interval", "5"])
        return main.run(config, mlm_checkpoint, False) / "checkpoints" / "checkpoint.pt"


def their_inputs(directory):
    tokenizer = BertTokenizerFast.from_pretrained(directory)
    return tokenizer(UNEVEN_SENTENCES, padding=True, return_tensors="pt")


def test_exported_mlm_loads_in_transformers_with_equal_logits(mlm_checkpoint, tmp_path):
    export_hf.main(["--cp", str(mlm_checkpoint), "-o", str(tmp_path)])
    theirs, info = TheirMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours, vocab, _ = restore_model(mlm_checkpoint, {"mlm": BertForMaskedLM})
    inputs = their_inputs(tmp_path)
    assert inputs["input_ids"][0].tolist()[:8] == [vocab.cls_id] + vocab.encode(UNEVEN_SENTENCES[:1])[0][:7]
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        their_logits = theirs.eval()(**inputs).logits
        our_logits = ours.head(ours.encoder(inputs["input_ids"], real))
    torch.testing.assert_close(our_logits[real], their_logits[real], rtol=1e-4, atol=1e-4)


def test_exported_classifier_gives_equal_logits(classifier_checkpoint, tmp_path):
    export_hf.export(classifier_checkpoint, tmp_path)
    theirs, info = TheirClassifier.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours, _, _ = restore_model(classifier_checkpoint, {"sst2": BertForSequenceClassification})
    inputs = their_inputs(tmp_path)
    with torch.no_grad():
        their_logits = theirs.eval()(**inputs).logits
        our_logits, _ = ours(inputs["input_ids"], attention_mask=inputs["attention_mask"].bool())
    torch.testing.assert_close(our_logits, their_logits, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------- back again

@pytest.mark.parametrize("name", ["mlm-preln-rope-geglu", "mlm-nsp-rmsnorm-sinusoidal", "clm-preln-rope", "clm-bert",
                                  "sst2-mean-rmsnorm", "mlm-nsp-bert"])
def test_an_export_imports_back_to_the_same_weights(trained, name, tmp_path):
    path = trained(name)
    original = checkpoints.load(path)
    result = hf_import.convert(exported(path, tmp_path / "hf"), tmp_path / "back.pt")
    assert result == {"task": original["task"], "unused": [], "fresh": []}
    back = checkpoints.load(tmp_path / "back.pt")
    assert set(back["model"]) == set(original["model"])
    for weight, tensor in original["model"].items():
        assert torch.equal(back["model"][weight], tensor), weight
    for key in ("norm", "position", "feed_forward", "pooling", "causal", "sentence_classes", "d_ff", "max_len"):
        assert back["model_config"][key] == original["model_config"][key], key
    assert back["vocab"] == original["vocab"]


def test_electra_imports_back_as_the_encoder_fine_tuning_starts_from(trained, tmp_path):
    path = trained("electra-preln-rope")
    result = hf_import.convert(exported(path, tmp_path / "hf"), tmp_path / "back.pt")
    assert result["task"] == "encoder" and sorted(result["unused"]) == [f"detector.{i}.{kind}" for i in (0, 2)
                                                                          for kind in ("bias", "weight")]
    back, original = checkpoints.load(tmp_path / "back.pt")["model"], checkpoints.load(path)["model"]
    assert all(torch.equal(tensor, original[name]) for name, tensor in back.items())


def test_a_bert_directory_with_only_tokenizer_json_imports(trained, tmp_path):
    directory = exported(trained("clm-bert"), tmp_path / "hf")
    (directory / "vocab.txt").unlink()
    hf_import.convert(directory, tmp_path / "back.pt")
    assert checkpoints.load(tmp_path / "back.pt")["vocab"] == checkpoints.load(trained("clm-bert"))["vocab"]


def test_an_imported_export_fine_tunes_and_exports_again(trained, workdir, tmp_path):
    hf_import.convert(exported(trained("mlm-preln-rope-geglu"), tmp_path / "hf"), tmp_path / "imported.pt")
    fine_tuned = train(workdir, ["--task-type", "sst2"], tmp_path / "imported.pt")
    directory = exported(fine_tuned, tmp_path / "again")
    assert loaded(AutoModelForSequenceClassification, directory).config.norm == "preln"
    card = (directory / "README.md").read_text()
    assert f"imported from {tmp_path / 'hf'}" in card and "- sst2: 3 steps" in card


def test_transformers_trainer_fine_tunes_an_export(trained, tmp_path):
    """A user's run_glue.py: the pre-trained export, a fresh classifier, transformers' Trainer."""
    directory = exported(trained("mlm-preln-rope-geglu"), tmp_path / "hf")
    tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
    model = AutoModelForSequenceClassification.from_pretrained(directory, trust_remote_code=True, num_labels=2)
    examples = [dict(tokenizer(text, truncation=True, max_length=32), labels=label)
                for text, label in zip(SENTENCES * 8, [1, 0] * 8)]
    before = model.classifier.weight.detach().clone()
    arguments = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=3,
                                  learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no")
    trainer = Trainer(model=model, args=arguments, train_dataset=examples, processing_class=tokenizer)
    losses = [entry["train_loss"] for entry in [trainer.train().metrics]]
    assert np.isfinite(losses).all() and not torch.equal(before, model.classifier.weight.detach())


# ----------------------------------------------------------------------------------------- bad input


def listing(directory: Path) -> dict[str, bytes]:
    """Every file under directory, with its bytes."""
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}


def test_force_replaces_an_earlier_export_and_nothing_else(trained, tmp_path, capsys):
    path = trained("clm-bert")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "notes.txt").write_text("mine")
    line = one_error_line(capsys, lambda: export_hf.main(["--cp", str(path), "-o", str(tmp_path / "hf")]))
    assert line == f"error: {tmp_path / 'hf'}: exists and is not empty; add --force to replace it"
    line = one_error_line(capsys, lambda: export_hf.main(["--cp", str(path), "-o", str(tmp_path / "hf"), "--force"]))
    assert line == (f"error: {tmp_path / 'hf'}: holds notes.txt, which no export writes; --force replaces only an "
                    "earlier export")
    assert listing(tmp_path / "hf") == {"notes.txt": b"mine"}

    (tmp_path / "hf" / "notes.txt").unlink()
    exported(path, tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text("{}")
    export_hf.main(["--cp", str(path), "-o", str(tmp_path / "hf"), "--force"])  # an earlier export: replaced
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["BertLMHeadModel"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no temporary directory left

    (tmp_path / "hf" / "1_Pooling").mkdir()  # an embedding export's folder: with anything else in it, not ours
    (tmp_path / "hf" / "1_Pooling" / "weights.bin").write_bytes(b"mine")
    line = one_error_line(capsys, lambda: export_hf.main(["--cp", str(path), "-o", str(tmp_path / "hf"), "--force"]))
    assert line.startswith(f"error: {tmp_path / 'hf'}: holds 1_Pooling, which no export writes")
    shutil.rmtree(tmp_path / "hf" / "1_Pooling")

    (tmp_path / "hf" / "README.md").write_text("# a model downloaded with an export's file names\n")
    before = listing(tmp_path / "hf")
    line = one_error_line(capsys, lambda: export_hf.main(["--cp", str(path), "-o", str(tmp_path / "hf"), "--force"]))
    assert line.endswith("has a README.md that is not an export's model card; --force replaces only an earlier export")
    assert listing(tmp_path / "hf") == before


def test_force_never_replaces_the_checkpoints_folder_or_the_base_directory(trained, tmp_path, capsys):
    """`-o RUN/checkpoints` and `-o BASE` (vocab/, datasets/, runs/) once deleted what they held."""
    base = tmp_path / "base"
    for folder in ("vocab", "datasets", "runs/run0/checkpoints"):
        (base / folder).mkdir(parents=True)
    (base / "vocab" / "vocab.txt").write_text("[PAD]\n")
    checkpoints_dir = base / "runs" / "run0" / "checkpoints"
    for name in ("best.pt", "checkpoint.pt"):
        shutil.copy(trained("clm-bert"), checkpoints_dir / name)
    before = listing(tmp_path)
    best = checkpoints_dir / "best.pt"
    for out in (checkpoints_dir, base):
        line = one_error_line(capsys, lambda out=out: export_hf.main(["--cp", str(best), "-o", str(out), "--force"]))
        assert line == f"error: {out}: holds the checkpoint {best}; export to another directory"
    elsewhere = trained("clm-bert")  # the checkpoint outside the base: still not an export
    line = one_error_line(capsys, lambda: export_hf.main(["--cp", str(elsewhere), "-o", str(base), "--force"]))
    assert line.startswith(f"error: {base}: holds datasets, which no export writes")
    assert listing(tmp_path) == before


def test_force_through_a_symbolic_link_replaces_the_directory_it_leads_to(trained, tmp_path):
    exported(trained("clm-bert"), tmp_path / "models" / "v1")
    (tmp_path / "latest").symlink_to(tmp_path / "models" / "v1", target_is_directory=True)
    export_hf.main(["--cp", str(trained("mlm-preln-rope-geglu")), "-o", str(tmp_path / "latest"), "--force"])
    assert (tmp_path / "latest").is_symlink() and (tmp_path / "latest").resolve() == tmp_path / "models" / "v1"
    assert json.loads((tmp_path / "models" / "v1" / "config.json").read_text())["model_type"] == "bert-variant"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "models"]  # no .latest.old
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["v1"]


@pytest.mark.parametrize("umask, directory_mode, file_mode", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)])
def test_an_export_has_the_permissions_the_umask_gives(trained, tmp_path, umask, directory_mode, file_mode):
    """Not mkdtemp's 0700 and safetensors' 0600: others read an export as they read our other files."""
    previous = os.umask(umask)
    try:
        directory = exported(trained("clm-bert"), tmp_path / "hf")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(directory.stat().st_mode) == directory_mode
    assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in directory.iterdir()} == {
        path.name: file_mode for path in directory.iterdir()}


def test_a_full_disk_while_writing_the_weights_is_one_line(trained, tmp_path, capsys, monkeypatch):
    """safetensors raises its own error, not an OSError, the OS's error in its message."""
    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    monkeypatch.setattr(export_hf, "save_file", full_disk)
    arguments = ["--cp", str(trained("clm-bert")), "-o", str(tmp_path / "hf")]
    line = one_error_line(capsys, lambda: export_hf.main(arguments))
    assert line == f"error: no space left on device writing {tmp_path / 'hf' / 'model.safetensors'}"
    assert not any(tmp_path.iterdir())  # no temporary directory left


def test_a_task_without_a_counterpart_is_one_line(trained, tmp_path, capsys):
    checkpoint = checkpoints.load(trained("clm-bert"))
    checkpoint["task"] = "fill"
    checkpoints.save(tmp_path / "odd.pt", checkpoint)
    line = one_error_line(capsys, lambda: export_hf.main(["--cp", str(tmp_path / "odd.pt"), "-o", str(tmp_path / "x")]))
    assert "a fill checkpoint has no transformers counterpart; export takes" in line and "electra" in line
    assert not (tmp_path / "x").exists()


def test_an_unsupported_model_type_is_one_line(trained, tmp_path, capsys):
    directory = exported(trained("clm-bert"), tmp_path / "hf")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"model_type": "modernbert"}))
    line = one_error_line(capsys, lambda: import_hf.main(["-i", str(directory), "-o", str(tmp_path / "x.pt")]))
    assert line == (f"error: {directory / 'config.json'}: model_type is 'modernbert'; this program reads bert, "
                    "electra, bert-variant")
    assert not (tmp_path / "x.pt").exists()


def test_a_truncated_variant_export_is_one_line_on_import(trained, tmp_path, capsys):
    directory = exported(trained("mlm-preln-rope-geglu"), tmp_path / "hf")
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    line = one_error_line(capsys, lambda: import_hf.main(["-i", str(directory), "-o", str(tmp_path / "x.pt")]))
    assert line.startswith(f"error: {weights}: not readable")
    shutil.rmtree(directory)
    assert not (tmp_path / "x.pt").exists()
