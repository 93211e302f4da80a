"""src/interop/hf_import.py: a transformers or sentence-transformers directory imported as our
checkpoint (scripts/import_hf.py), compared output by output with transformers and exported back to
the same weights; training, fine-tuning and teaching from it; a published model's casing; an
imported classifier's label names; every bad directory one line. The export itself: test_hf_export.py."""
import json
import pickle
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertForMaskedLM as TheirMaskedLM
from transformers import AutoModel, AutoTokenizer, BertForPreTraining as TheirPreTraining, BertModel

import export_hf
from interop import hf_import
import import_hf
import main
import make_demo
import prepare_mlm_dataset
from errors import UserError
from conftest import one_error_line
from interop.hf_weights import THEIR_TIED
from model import BertForMaskedLM, BertForPreTraining, BertForSequenceClassification, ModelConfig
from checkpoints import check_compatible, load as load_checkpoint, restore_model, vocab_of
from test_vocab import published_uncased_model
from vocab import load_vocab, write_tokenizer_config

ROOT = Path(__file__).resolve().parent.parent


def random_bert(model_class, vocab_dir, directory, **save_options):
    """A randomly initialised transformers model saved in `directory` with our test vocabulary."""
    torch.manual_seed(0)
    vocab_size = sum(1 for _ in (vocab_dir / "vocab.txt").open(encoding="utf-8"))
    config = BertConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=128)  # more than seq-len 64
    model = model_class(config).eval()
    model.save_pretrained(directory, **save_options)
    shutil.copy(vocab_dir / "vocab.txt", directory / "vocab.txt")
    return model


def test_imported_mlm_matches_transformers_and_round_trips(vocab_dir, tmp_path, capsys):
    theirs = random_bert(TheirMaskedLM, vocab_dir, tmp_path / "hf")
    import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "ours.pt")])
    assert "a starting point for --cp (task mlm)" in capsys.readouterr().out
    ours, _, checkpoint = restore_model(tmp_path / "ours.pt", {"mlm": BertForMaskedLM})
    ids = torch.randint(5, checkpoint["model_config"]["vocab_size"], (3, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours.encoder(ids), theirs.bert(ids).last_hidden_state, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ours.head(ours.encoder(ids)), theirs(ids).logits, rtol=1e-4, atol=1e-4)
    assert load_checkpoint(tmp_path / "ours.pt")["optimizer"] is None  # a starting point, not a run to resume

    export_hf.export(tmp_path / "ours.pt", tmp_path / "back")
    original = load_file(tmp_path / "hf" / "model.safetensors")
    returned = load_file(tmp_path / "back" / "model.safetensors")
    assert set(returned) <= set(original)
    assert set(original) - set(returned) <= set(THEIR_TIED)  # transformers ties these again on load
    for name, tensor in returned.items():
        assert torch.equal(tensor, original[name]), name


def test_pretraining_model_with_nsp_head_round_trips(vocab_dir, tmp_path):
    """bert-base-uncased is published as BertForPreTraining: MLM head, pooler and NSP head."""
    theirs = random_bert(TheirPreTraining, vocab_dir, tmp_path / "hf")
    assert hf_import.convert(tmp_path / "hf", tmp_path / "ours.pt") == {"task": "mlm", "unused": [], "fresh": []}
    ours, _, checkpoint = restore_model(tmp_path / "ours.pt", {"mlm": BertForPreTraining})
    assert checkpoint["config"]["sentence-objective"] == "nsp"
    ids = torch.randint(5, checkpoint["model_config"]["vocab_size"], (3, 40))
    every_position = torch.arange(40).expand(3, 40)
    with torch.no_grad():
        logits, sentence_logits, _ = ours(ids, every_position)
        their_output = theirs(ids)
    torch.testing.assert_close(logits, their_output.prediction_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(sentence_logits, their_output.seq_relationship_logits, rtol=1e-4, atol=1e-4)

    export_hf.export(tmp_path / "ours.pt", tmp_path / "back")
    returned, info = TheirPreTraining.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(returned.eval()(ids).seq_relationship_logits, their_output.seq_relationship_logits)


def test_imported_encoder_only_model_keeps_hidden_states(vocab_dir, tmp_path):
    theirs = random_bert(BertModel, vocab_dir, tmp_path / "hf")
    result = hf_import.convert(tmp_path / "hf", tmp_path / "encoder.pt")
    assert result["task"] == "encoder" and result["fresh"] == ["classifier.weight", "classifier.bias"]
    checkpoint = load_checkpoint(tmp_path / "encoder.pt")
    ours = BertForSequenceClassification(ModelConfig(**checkpoint["model_config"])).eval()
    ours.load_state_dict(checkpoint["model"], strict=False)
    ids = torch.randint(5, checkpoint["model_config"]["vocab_size"], (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(ours.encoder(ids), theirs(ids).last_hidden_state, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(torch.tanh(ours.pooler(ours.encoder(ids)[:, 0])), theirs(ids).pooler_output,
                                   rtol=1e-4, atol=1e-4)

    export_hf.export(tmp_path / "encoder.pt", tmp_path / "back")  # and back, as a BertModel with its pooler
    returned, info = BertModel.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(returned.eval()(ids).pooler_output, theirs(ids).pooler_output)


def test_a_truncated_safetensors_file_is_one_line(vocab_dir, tmp_path, capsys):
    random_bert(TheirMaskedLM, vocab_dir, tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    capsys.readouterr()  # transformers' progress bar
    with pytest.raises(SystemExit) as exit_info:
        import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "x.pt")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {weights}: not readable"), lines
    assert not (tmp_path / "x.pt").exists()


def test_import_errors_name_the_file(tmp_path, vocab_dir):
    (tmp_path / "config.json").write_text('{"model_type": "roberta"}')
    with pytest.raises(UserError, match="config.json: model_type is 'roberta'"):
        hf_import.convert(tmp_path, tmp_path / "x.pt")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="config.json: cannot read"):
        hf_import.convert(tmp_path, tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()


def test_training_starts_from_imported_checkpoints(mlm_trained_run, vocab_dir, rotten_tomatoes, tmp_path, monkeypatch):
    """An encoder-only BertModel continues MLM pre-training with a fresh head; an imported
    BertForMaskedLM is fine-tuned on SST-2. Neither is mistaken for a run to resume."""
    random_bert(BertModel, vocab_dir, tmp_path / "encoder")
    random_bert(TheirMaskedLM, vocab_dir, tmp_path / "mlm")
    hf_import.convert(tmp_path / "encoder", tmp_path / "encoder.pt")
    hf_import.convert(tmp_path / "mlm", tmp_path / "mlm.pt")
    base = tmp_path / "base"
    shutil.copytree(mlm_trained_run / "vocab", base / "vocab")
    shutil.copytree(mlm_trained_run / "datasets", base / "datasets")
    make_demo.write_sst2(base / "datasets", rotten_tomatoes, seed=123)
    shutil.copy(mlm_trained_run / "config.ini", base / "config.ini")
    monkeypatch.chdir(base)
    steps = ["--heads", "4", "--max-iters", "3", "--val-interval", "3"]

    pretraining = main.run(main.load_config(None, steps), tmp_path / "encoder.pt", False)
    log = (pretraining / "logs" / "log.txt").read_text()
    assert "loaded the encoder of" in log
    assert "newly initialised: head.bias, head.dense.weight, head.dense.bias, head.norm.weight, head.norm.bias\n" in log
    assert "not used: pooler.*" in log and "resuming" not in log
    assert load_checkpoint(pretraining / "checkpoints" / "checkpoint.pt")["step"] == 3

    fine_tuning = main.run(main.load_config(None, steps + ["--task-type", "sst2"]), tmp_path / "mlm.pt", False)
    log = (fine_tuning / "logs" / "log.txt").read_text()
    assert "newly initialised: pooler.weight, pooler.bias, classifier.weight, classifier.bias" in log
    assert "not used: head.*" in log
    assert load_checkpoint(fine_tuning / "checkpoints" / "checkpoint.pt")["step"] == 3


def test_a_published_model_continues_on_a_corpus_prepared_with_its_own_vocabulary(imdb_corpus, tmp_path,
                                                                                   monkeypatch, capsys):
    """README's path, as etc/templates/config_continue_cpu.ini gives it, on all-MiniLM-L6-v2 as
    published (a sentence-transformers folder, no MLM head): import, prepare with its vocabulary,
    MLM from its weights with a fresh head tied to the word embeddings, named in the log."""
    published = published_uncased_model()
    base = tmp_path / "demo"
    (base / "input").mkdir(parents=True)
    (base / "input" / "imdb.txt").write_text("\n".join(imdb_corpus.read_text(encoding="utf-8").splitlines()[:300]),
                                             encoding="utf-8")
    import_hf.main(["-i", str(published), "-o", str(base / "minilm.pt")])
    prepare_mlm_dataset.main(["-i", str(base / "input" / "imdb.txt"), "-l", "minilm", "-o", str(base / "datasets"),
                              "-m", "128", "-v", str(published)])
    monkeypatch.chdir(tmp_path)
    config = main.load_config(ROOT / "etc" / "templates" / "config_continue_cpu.ini",
                              ["--vocab", str(published), "--time-budget", "0", "--max-iters", "2", "--warmup-iters",
                               "1", "--lr-decay-iters", "2", "--val-interval", "2", "--val-iters", "1",
                               "--batch-size", "4"])
    run_dir = main.run(config, base / "minilm.pt", False)
    log = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")
    assert "newly initialised: head.bias, head.dense.weight, head.dense.bias, head.norm.weight, head.norm.bias\n" in log
    model = restore_model(run_dir / "checkpoints" / "checkpoint.pt", {"mlm": BertForMaskedLM})[0]
    assert model.head.token_embedding is model.encoder.embeddings.token  # tied: the head reads the published words
    assert load_checkpoint(run_dir / "checkpoints" / "checkpoint.pt")["model_config"]["d_model"] == 384


def test_a_published_model_fine_tuned_teaches_a_small_student_as_a_checkpoint_or_an_exported_directory(
        rotten_tomatoes, imdb_reviews, tmp_path, monkeypatch):
    """README's small model for a task: all-MiniLM-L6-v2 fine-tuned with its template teaches a narrow
    student on sentences without labels, as our checkpoint or as the transformers directory it exports
    to (the same logits)."""
    from tasks.classification_task import ClassificationTask
    published = published_uncased_model()
    base = tmp_path / "demo"
    make_demo.write_sst2(base / "datasets", rotten_tomatoes[:600], seed=123)
    import_hf.main(["-i", str(published), "-o", str(base / "minilm.pt")])
    transfer = tmp_path / "reviews.txt"
    transfer.write_text("\n".join(imdb_reviews[:20]) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    short = ["--vocab", str(published), "--max-iters", "2", "--warmup-iters", "1", "--lr-decay-iters", "2",
             "--val-interval", "2", "--batch-size", "8", "--seq-len", "64"]
    template = ROOT / "etc" / "templates" / "config_sst2_published_cpu.ini"
    teacher_run = main.run(main.load_config(template, [*short, "--run-id", "teacher"]), base / "minilm.pt", False)
    teacher = teacher_run / "checkpoints" / "checkpoint.pt"
    export_hf.export(teacher, tmp_path / "exported")
    student = ["--d-model", "64", "--heads", "2", "--n-layer", "1", "--d-ff", "128", "--transfer-data", str(transfer)]
    vocab = load_vocab(published)
    logits = []
    for each in (teacher, tmp_path / "exported"):
        config = main.load_config(template, [*short, *student, "--teacher", str(each)])
        task = ClassificationTask(config, vocab, torch.device("cpu"))
        train = task.split("train")
        batch = train.batch(torch.arange(len(train) - 8, len(train)).numpy(), vocab.pad_id, 64, 8)  # transfer sentences
        with torch.no_grad():
            logits.append(task.teacher(torch.as_tensor(batch["input_ids"]),
                                       attention_mask=torch.as_tensor(batch["attention_mask"]))[0])
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)
    run_dir = main.run(config, None, False)
    log = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")
    assert f"teacher = {tmp_path / 'exported'}" in log and "step 2 | loss" in log


def test_an_imported_masked_lm_continues_with_its_own_head(mlm_trained_run, vocab_dir, tmp_path, monkeypatch):
    theirs = random_bert(TheirMaskedLM, vocab_dir, tmp_path / "mlm")
    hf_import.convert(tmp_path / "mlm", tmp_path / "mlm.pt")
    base = tmp_path / "base"
    shutil.copytree(mlm_trained_run / "vocab", base / "vocab")
    shutil.copytree(mlm_trained_run / "datasets", base / "datasets")
    shutil.copy(mlm_trained_run / "config.ini", base / "config.ini")
    monkeypatch.chdir(base)
    run_dir = main.run(main.load_config(None, ["--heads", "4", "--max-iters", "1", "--val-interval", "1",
                                               "--learning-rate", "1e-9", "--min-learning-rate", "1e-10"]),
                       tmp_path / "mlm.pt", False)
    log = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")
    assert "newly initialised: nothing" in log
    saved = load_checkpoint(run_dir / "checkpoints" / "checkpoint.pt")["model"]
    torch.testing.assert_close(saved["head.dense.weight"], theirs.cls.predictions.transform.dense.weight.detach(),
                               rtol=0, atol=1e-6)  # a fresh head's would be another draw


def test_a_config_json_that_does_not_fit_the_weights_is_one_line(vocab_dir, tmp_path, capsys):
    random_bert(TheirMaskedLM, vocab_dir, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config | {"hidden_size": 128}))  # over 64-wide weights
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "x.pt")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'hf' / 'config.json'}: does not fit the "
                                                   "weights: encoder."), lines
    assert lines[0].endswith("has shape [64] in them, [128] by config.json"), lines
    assert not (tmp_path / "x.pt").exists()


class RunsCode:
    """Unpickling this would run code."""
    def __reduce__(self):
        return print, ("ran",)


def test_a_pickle_that_runs_code_is_refused_in_one_line_without_a_warning(vocab_dir, tmp_path, capsys):
    random_bert(TheirMaskedLM, vocab_dir, tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").unlink()
    # A plain pickle (protocol 4), not torch.save's: torch warns about the protocol before refusing it.
    (tmp_path / "hf" / "pytorch_model.bin").write_bytes(pickle.dumps({"bert.pooler.dense.weight": RunsCode()}))
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as exit_info:
            import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "x.pt")])
    assert exit_info.value.code == 2
    assert not [str(warning.message) for warning in warned if warning.category is not ResourceWarning]
    output = capsys.readouterr()
    assert output.err == f"error: {tmp_path / 'hf' / 'pytorch_model.bin'}: not readable (UnpicklingError)\n"
    assert "ran" not in output.out


def test_an_imported_classifier_keeps_names_but_not_bare_numbers():
    assert hf_import.output_names({"id2label": {"0": "neg", "1": "pos"}}, "classify") == ("neg", "pos")
    assert hf_import.output_names({"id2label": {"1": "1", "0": "0"}}, "classify") == ()
    assert hf_import.output_names({"id2label": {"0": "0", "1": "1"}}, "ner") == ("0", "1")
    assert hf_import.output_names({"id2label": {"0": "neg", "1": "pos"}}, "sst2") == ()


# ----------------------------------------------------------------------------------------- a published model's casing


def test_a_published_uncased_model_keeps_its_lower_casing_through_import_and_export(tmp_path):
    """all-MiniLM-L6-v2 (bert-base-uncased's vocabulary, `ℝ` included): imported, it tokenizes as
    transformers does; exported again, it lower-cases and gives the original's hidden states."""
    original = published_uncased_model()
    import_hf.main(["-i", str(original), "-o", str(tmp_path / "minilm.pt")])
    checkpoint = load_checkpoint(tmp_path / "minilm.pt")
    assert checkpoint["vocab_lowercase"] is True
    theirs = AutoTokenizer.from_pretrained(original)
    assert vocab_of(checkpoint).encode(["Hello World"])[0] == theirs("Hello World", add_special_tokens=False)[
        "input_ids"] == theirs("hello world", add_special_tokens=False)["input_ids"]

    export_hf.main(["--cp", str(tmp_path / "minilm.pt"), "-o", str(tmp_path / "back")])
    assert json.loads((tmp_path / "back" / "tokenizer_config.json").read_text())["do_lower_case"] is True
    assert json.loads((tmp_path / "back" / "tokenizer.json").read_text())["normalizer"]["lowercase"] is True
    texts = ["Hello World", "The Acting is SUPERB, and the Score lifts every scene."]
    inputs = AutoTokenizer.from_pretrained(tmp_path / "back")(texts, padding=True, return_tensors="pt")
    original_inputs = theirs(texts, padding=True, return_tensors="pt")
    assert torch.equal(inputs["input_ids"], original_inputs["input_ids"])
    with torch.no_grad():
        torch.testing.assert_close(AutoModel.from_pretrained(tmp_path / "back").eval()(**inputs).last_hidden_state,
                                   AutoModel.from_pretrained(original).eval()(**original_inputs).last_hidden_state)


def test_a_tokenizer_json_token_with_a_line_break_is_one_line_on_import(tmp_path, capsys):
    """vocab.txt holds one token a line: such a token would make it one line too long."""
    shutil.copy(published_uncased_model() / "config.json", tmp_path / "config.json")
    tokenizer = json.loads((published_uncased_model() / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"]["[unused0]\n"] = tokenizer["model"]["vocab"].pop("[unused0]")
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    line = one_error_line(capsys, lambda: import_hf.main(["-i", str(tmp_path), "-o", str(tmp_path / "x.pt")]))
    assert line == (f"error: {tmp_path / 'tokenizer.json'}: token 1 ('[unused0]\\n') holds a line break, which a "
                    "vocab.txt (one token a line) cannot hold")
    assert not (tmp_path / "x.pt").exists()


def test_fine_tuning_refuses_a_vocabulary_that_cases_otherwise(vocab_dir, tmp_path):
    random_bert(TheirMaskedLM, vocab_dir, tmp_path / "hf")
    hf_import.convert(tmp_path / "hf", tmp_path / "ours.pt")
    checkpoint = load_checkpoint(tmp_path / "ours.pt")
    shutil.copy(vocab_dir / "vocab.txt", tmp_path / "vocab.txt")
    write_tokenizer_config(tmp_path, lowercase=False)
    with pytest.raises(UserError, match=f"ours.pt: its vocabulary lower-cases text, {tmp_path / 'vocab.txt'} keeps "
                                        "the case of text"):
        check_compatible(tmp_path / "ours.pt", checkpoint, load_vocab(tmp_path), ModelConfig(
            **checkpoint["model_config"]))


# ----------------------------------------------------------------------------------------- config.json and paths

BAD_CONFIGS = {
    "an array": (lambda config: [config], "cannot read the model's settings (expected a JSON object, found list)"),
    "no vocab_size": (lambda config: {key: value for key, value in config.items() if key != "vocab_size"},
                      "vocab_size is missing"),
    "heads that do not divide the width": (lambda config: config | {"num_attention_heads": 5},
                                           "hidden_size 64 is not divisible by num_attention_heads 5"),
    "negative positions": (lambda config: config | {"max_position_embeddings": -1},
                           "max_position_embeddings is -1; expected a whole number above 0"),
    "a width given as text": (lambda config: config | {"hidden_size": "64"},
                              "hidden_size is '64'; expected a whole number above 0"),
}


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_a_bad_config_json_is_one_line_before_the_weights_are_read(vocab_dir, tmp_path, capsys, monkeypatch, case):
    random_bert(TheirMaskedLM, vocab_dir, tmp_path / "hf")
    edit, message = BAD_CONFIGS[case]
    config_file = tmp_path / "hf" / "config.json"
    config_file.write_text(json.dumps(edit(json.loads(config_file.read_text()))))
    monkeypatch.setattr(hf_import, "read_weights", lambda directory: pytest.fail("read the weights"))
    line = one_error_line(capsys, lambda: import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "x.pt")]))
    assert line == f"error: {config_file}: {message}"
    assert not (tmp_path / "x.pt").exists()


def test_a_model_larger_than_the_memory_is_refused_saying_its_size(vocab_dir, tmp_path, capsys, monkeypatch):
    random_bert(TheirMaskedLM, vocab_dir, tmp_path / "hf")
    config_file = tmp_path / "hf" / "config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"intermediate_size": 10**9}))
    monkeypatch.setattr(hf_import, "read_weights", lambda directory: pytest.fail("read the weights"))
    line = one_error_line(capsys, lambda: import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "x.pt")]))
    assert line.startswith(f"error: {config_file} (vocab_size 2000, max_position_embeddings 128, hidden_size 64, "
                           "num_hidden_layers 2, intermediate_size 1000000000, type_vocab_size 2): the model would "
                           "allocate 1,907.")
    assert "GiB (2 x 256,000," in line and "more than this machine's memory (" in line
    assert line.endswith("GiB; --memory-limit-gib GIB sets another limit)")
    assert not (tmp_path / "x.pt").exists()


def test_the_memory_limit_is_a_flag(vocab_dir, tmp_path, capsys):
    random_bert(TheirMaskedLM, vocab_dir, tmp_path / "hf")
    arguments = ["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "x.pt")]
    line = one_error_line(capsys, lambda: import_hf.main(arguments + ["--memory-limit-gib", "0.001"]))
    assert line.endswith("would allocate 0.0015 GiB (2 x 207,952 float32 weights), "
                         "more than --memory-limit-gib 0.001 GiB")
    import_hf.main(arguments + ["--memory-limit-gib", "0.01"])
    assert (tmp_path / "x.pt").is_file()


def test_a_vocab_txt_linked_to_a_device_is_one_line(vocab_dir, tmp_path, capsys):
    random_bert(TheirMaskedLM, vocab_dir, tmp_path / "hf")
    (tmp_path / "hf" / "vocab.txt").unlink()
    (tmp_path / "hf" / "vocab.txt").symlink_to("/dev/zero")
    line = one_error_line(capsys, lambda: import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "x.pt")]))
    assert line == f"error: {tmp_path / 'hf' / 'vocab.txt'}: cannot read vocabulary (not a regular file)"


def test_an_output_in_a_missing_folder_or_onto_a_directory_is_one_line(vocab_dir, tmp_path, capsys):
    random_bert(TheirMaskedLM, vocab_dir, tmp_path / "hf")
    missing = tmp_path / "nowhere" / "x.pt"
    line = one_error_line(capsys, lambda: import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(missing)]))
    assert line == f"error: -o {missing}: the folder {missing.parent} does not exist"
    (tmp_path / "taken").mkdir()
    line = one_error_line(capsys, lambda: import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "taken")]))
    assert line == f"error: -o {tmp_path / 'taken'}: a directory; -o takes the checkpoint file to write"
    assert not missing.parent.exists() and not any((tmp_path / "taken").iterdir())
