"""Token classification (task-type = ner): learning in both data layouts, exact resume, --test and a
resume by the checkpoint's labels, scripts/ner.py, and the export that transformers'
token-classification pipeline reads. The data (windows, first-piece labels, layouts, their errors):
test_token_data.py."""
import json
import re
import shutil

import numpy as np
import pytest
import torch

import checkpoints
import export_hf
import import_hf
import main
import make_ner_demo
import ner
from tasks import token_data
from conftest import assert_resumes_exactly_mid_epoch, one_error_line, write_mlm_config
from test_distributed import run_main
from test_token_data import write_parquet

NER = {"task_type": "ner", "batch_size": 16, "learning_rate": 1e-3, "warmup_iters": 10, "dataset_pattern": "",
       "val_dataset_pattern": "", "test_dataset_pattern": ""}


@pytest.fixture(scope="module")
def ner_base(imdb_corpus, vocab_dir, tmp_path_factory):
    """vocab/ and datasets/ner/ in both layouts, made up from the demo reviews."""
    base = tmp_path_factory.mktemp("ner_base")
    shutil.copytree(vocab_dir, base / "vocab")
    make_ner_demo.make_ner_demo(imdb_corpus, base / "datasets" / "ner", seed=123)
    return base


def ner_workdir(base, directory, layout: str, **settings):
    """A copy of the base with one layout's files only, and a config.ini for a small NER model."""
    shutil.copytree(base / "vocab", directory / "vocab")
    use_layout(base, directory, layout)
    write_mlm_config(directory, **NER | settings)
    return directory


def use_layout(base, directory, layout: str):
    """directory/datasets/ner: the base's files of one layout (the same sentences in either) only."""
    shutil.rmtree(directory / "datasets", ignore_errors=True)
    (directory / "datasets" / "ner").mkdir(parents=True)
    for path in (base / "datasets" / "ner").iterdir():
        if (path.suffix == ".parquet") == (layout == "parquet"):
            shutil.copy(path, directory / "datasets" / "ner" / path.name)


@pytest.mark.parametrize("layout", ["conll", "parquet"])
def test_the_model_learns_the_tags_in_either_layout_and_tests_and_tags_text(ner_base, tmp_path, monkeypatch,
                                                                            keep_signal_handlers, capsys, layout):
    monkeypatch.chdir(ner_workdir(ner_base, tmp_path / layout, layout, max_iters=300, lr_decay_iters=300,
                                  val_interval=300))
    run_dir = main.run(main.load_config(None, []), None, False)
    best = run_dir / "checkpoints" / "best.pt"
    saved = checkpoints.load(best)
    assert saved["task"] == "ner" and saved["best"] > 0.6  # F1: tagging every word O scores 0
    assert set(saved["model_config"]["label_names"]) >= {"O", "B-YEAR", "B-SCORE", "B-GENRE", "I-GENRE"}
    main.main(["--cp", str(best), "--test"])
    scores = json.loads(next(run_dir.glob("test_metrics_step*.json")).read_text())
    assert scores["test_f1"] > 0.6 and 0 <= scores["test_precision"] <= 1 and "test_f1_GENRE" in scores
    capsys.readouterr()
    ner.main(["--cp", str(best), "It was a 1959 western , 9 / 10 ."])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("It\t") and lines[-1] == "" and len(lines) == 11
    assert {line.split("\t")[1] for line in lines[:-1]} > {"O"}  # it finds entities


def test_a_run_resumes_exactly_mid_epoch(ner_base, tmp_path, monkeypatch, keep_signal_handlers):
    settings = {"lr_decay_iters": 12, "val_interval": 6, "dropout": 0.1}
    assert_resumes_exactly_mid_epoch(lambda name: ner_workdir(ner_base, tmp_path / name, "conll", **settings),
                                     monkeypatch, steps=12)


def test_two_processes_train_and_score_every_sentence_once(ner_base, tmp_path):
    workdir = ner_workdir(ner_base, tmp_path / "ddp", "conll", batch_size=8, max_iters=4, val_interval=4)
    result = run_main(workdir)
    assert result.returncode == 0, result.stderr
    saved = checkpoints.load(workdir / "runs" / "run0" / "checkpoints" / "checkpoint.pt")
    assert saved["step"] == 4 and len(saved["rng_per_rank"]) == 2
    sentences = len(token_data.read_split(workdir / "datasets", "validation", "ner_tags",
                                          saved["model_config"]["label_names"]))
    log = (workdir / "runs" / "run0" / "logs" / "log.txt").read_text(encoding="utf-8")
    assert re.search(rf"val sentences {sentences}\b", log)  # every sentence once, from whichever rank


def test_a_bad_tag_stops_the_run_before_its_first_step(ner_base, tmp_path, monkeypatch, capsys):
    directory = ner_workdir(ner_base, tmp_path / "bad", "conll")
    with (directory / "datasets" / "ner" / "validation.txt").open("a", encoding="utf-8") as file:
        file.write("Paris B-LOC\n")
    monkeypatch.chdir(directory)
    assert "validation.txt: tag B-LOC (line" in one_error_line(capsys, lambda: main.main(["--max-iters", "2"]))
    assert not (directory / "runs").exists() or not list((directory / "runs").iterdir())


def test_labels_naming_a_tag_twice_is_one_line(ner_base, tmp_path, monkeypatch, capsys, keep_signal_handlers,
                                               skip_flops_measurement):
    monkeypatch.chdir(ner_workdir(ner_base, tmp_path / "twice", "conll"))
    labels = "O,B-YEAR,I-YEAR,B-SCORE,I-SCORE,B-GENRE,B-GENRE,I-GENRE"
    line = one_error_line(capsys, lambda: main.main(["--labels", labels, "--max-iters", "1"]))
    assert line == f"error: labels = {labels}: B-GENRE named twice; each label needs a name of its own"


def rename_tags(directory, old: str, new: str):
    """Every CoNLL text file's entity type `old` called `new` (B-old -> B-new, I-old -> I-new)."""
    for path in (directory / "datasets" / "ner").glob("*.txt"):
        text = path.read_text(encoding="utf-8")
        path.write_text(re.sub(rf"-{old}$", f"-{new}", text, flags=re.MULTILINE), encoding="utf-8")


def renumber_tags(directory, names: tuple[str, ...]):
    """directory's CoNLL text made parquet files of the same sentences, whose tag ids count in the
    order of `names` (their metadata says so), as another export of a dataset may."""
    folder = directory / "datasets" / "ner"
    for split in ("train", "validation", "test"):
        data = token_data.read_split(directory / "datasets", split, "ner_tags", names)
        write_parquet(folder / f"{split}-00000-of-00001.parquet", data.words, data.tags, names)
    for path in folder.glob("*.txt"):
        path.unlink()


@pytest.fixture(scope="module")
def ner_checkpoint(ner_base, tmp_path_factory):
    """checkpoint.pt of a 4-step run on the CoNLL text: its labels are the tags the text uses, sorted
    O, B-GENRE, I-GENRE, ...; the base's parquet files declare I-YEAR too, and O, B-YEAR, ... is their order."""
    import signal
    import hardware
    directory = ner_workdir(ner_base, tmp_path_factory.mktemp("trained_ner"), "conll", max_iters=4, val_interval=4,
                            val_dataset_percentage=0.25, test_iters=2)
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(directory)
            patch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)  # not tested here
            run_dir = main.run(main.load_config(None, []), None, False)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    path = run_dir / "checkpoints" / "checkpoint.pt"
    names = checkpoints.load(path)["model_config"]["label_names"]
    assert names[:3] == ("O", "B-GENRE", "I-GENRE") and set(names) == set(make_ner_demo.LABELS) - {"I-YEAR"}
    return path


def test_test_scores_by_the_checkpoints_labels_and_refuses_tags_it_lacks(ner_base, ner_checkpoint, tmp_path,
                                                                         monkeypatch, capsys):
    directory = ner_workdir(ner_base, tmp_path / "renamed", "conll")
    rename_tags(directory, "GENRE", "TYPE")  # sorted after SCORE: the same count, every id shifted
    monkeypatch.chdir(directory)
    line = one_error_line(capsys, lambda: main.main(["--cp", str(ner_checkpoint), "--test"]))
    assert re.fullmatch(r"error: \S+/test.txt: tags B-TYPE \(line \d+\), I-TYPE \(line \d+\) are not among the "
                        r"checkpoint's labels \(O, B-GENRE, I-GENRE, .*\)", line), line
    names = checkpoints.load(ner_checkpoint)["model_config"]["label_names"]
    scores = {}
    for layout in ("conll", "renumbered", "parquet"):  # the same sentences, their tags numbered in other orders
        directory = ner_workdir(ner_base, tmp_path / layout, "parquet" if layout == "parquet" else "conll",
                                test_iters=2)
        if layout == "renumbered":
            renumber_tags(directory, tuple(reversed(names)))
        monkeypatch.chdir(directory)
        metrics = main.run(main.load_config(None, []), ner_checkpoint, True)
        scores[layout] = {name: value for name, value in metrics.items() if name != "checkpoint"}
    assert scores["renumbered"] == pytest.approx(scores["conll"], rel=1e-6)
    assert scores["parquet"] == pytest.approx(scores["conll"], rel=1e-6)


def test_a_resumed_run_reads_its_data_by_the_checkpoints_labels(ner_base, tmp_path, monkeypatch, capsys,
                                                                keep_signal_handlers, skip_flops_measurement):
    latest = "runs/run0/checkpoints/checkpoint.pt"
    weights = {}
    for name in ("straight", "resumed"):
        directory = ner_workdir(ner_base, tmp_path / name, "conll", warmup_iters=2, lr_decay_iters=8,
                                val_interval=4, val_dataset_percentage=0.25)
        monkeypatch.chdir(directory)
        if name == "resumed":
            main.main(["--max-iters", "4"])
            names = checkpoints.load(directory / latest)["model_config"]["label_names"]
            renumber_tags(directory, tuple(reversed(names)))  # the same count, each id another tag
        main.main(["--max-iters", "8", *(["--cp", latest] if name == "resumed" else [])])
        saved = checkpoints.load(directory / latest)
        assert saved["step"] == 8 and saved["model_config"]["label_names"][:3] == ("O", "B-GENRE", "I-GENRE")
        weights[name] = saved["model"]
    for name, tensor in weights["straight"].items():
        torch.testing.assert_close(weights["resumed"][name], tensor, rtol=0, atol=1e-5, msg=name)
    rename_tags(tmp_path / "straight", "GENRE", "TYPE")
    monkeypatch.chdir(tmp_path / "straight")
    line = one_error_line(capsys, lambda: main.main(["--max-iters", "12", "--cp", latest]))
    assert re.fullmatch(r"error: \S+/validation.txt: tags B-TYPE \(line \d+\), I-TYPE \(line \d+\) are not among "
                        r"the checkpoint's labels \(.*\)", line), line


def test_a_new_run_from_a_ner_checkpoint_keeps_its_head_where_its_labels_cover_the_tags(
        ner_base, ner_checkpoint, tmp_path, monkeypatch, keep_signal_handlers, skip_flops_measurement):
    saved = checkpoints.load(ner_checkpoint)
    names = saved["model_config"]["label_names"]
    runs = {}
    for name in ("renumbered", "renamed"):
        directory = ner_workdir(ner_base, tmp_path / name, "conll")
        if name == "renumbered":
            renumber_tags(directory, tuple(reversed(names)))
        else:
            rename_tags(directory, "GENRE", "TYPE")
        monkeypatch.chdir(directory)
        overrides = ["--max-iters", "1", "--seed", "7", "--val-dataset-percentage", "0.25"]  # a seed of its own:
        run_dir = main.run(main.load_config(None, overrides), ner_checkpoint, False, switch_training=True)
        runs[name] = (checkpoints.load(run_dir / "checkpoints" / "checkpoint.pt"),
                      (run_dir / "logs" / "log.txt").read_text(encoding="utf-8"))
    kept, log = runs["renumbered"]  # the same tags: the head and its order carry over
    assert kept["model_config"]["label_names"] == names
    assert "newly initialised: nothing" in log and "a new head" not in log
    # one step of warm-up moves a weight by about learning-rate / warmup-iters = 1e-4; a new head is 0.02 off
    torch.testing.assert_close(kept["model"]["classifier.weight"], saved["model"]["classifier.weight"], rtol=0,
                               atol=1e-3)
    new, log = runs["renamed"]  # other tags: a new head for them, said in the log
    assert "B-TYPE" in new["model_config"]["label_names"] and "B-GENRE" not in new["model_config"]["label_names"]
    assert "newly initialised: classifier.weight, classifier.bias" in log
    assert re.search(r"a new head: the checkpoint's labels \(O, B-GENRE, .*\) are not this run's \(O, .*B-TYPE", log)
    # ... a new head starts from other random weights than the checkpoint's started from
    assert not torch.allclose(new["model"]["classifier.weight"], saved["model"]["classifier.weight"], atol=1e-3)


@pytest.mark.parametrize("architecture", [["--norm", "postln", "--position", "learned"],
                                          ["--norm", "preln", "--position", "rope"]])
def test_the_export_tags_as_ours_in_transformers_pipeline(ner_base, tmp_path, monkeypatch, keep_signal_handlers,
                                                          architecture):
    transformers = pytest.importorskip("transformers")
    monkeypatch.chdir(ner_workdir(ner_base, tmp_path / "work", "parquet"))
    run_dir = main.run(main.load_config(None, ["--max-iters", "40", "--val-interval", "40", *architecture]),
                       None, False)
    path = run_dir / "checkpoints" / "checkpoint.pt"
    export_hf.main(["--cp", str(path), "-o", str(tmp_path / "hf")])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    native = architecture[1] == "postln"
    assert config["architectures"] == ["BertForTokenClassification" if native else "BertVariantForTokenClassification"]
    model, vocab, _ = checkpoints.restore_model(path, {"ner": ner.BertForTokenClassification})
    text = "A 1981 film noir with a romantic comedy twist : 8 out of 10 , and the best horror of 1999 ."
    words = ner.words_of(vocab, text)
    ours = ner.tag_sentences(model, vocab, [words], seq_len=64)[0]
    tagger = transformers.pipeline("token-classification", model=str(tmp_path / "hf"), trust_remote_code=not native,
                                   aggregation_strategy="none", ignore_labels=[])
    pieces = tagger.tokenizer(text)
    first_pieces = [index for index, word in enumerate(pieces.word_ids())
                    if word is not None and (index == 0 or pieces.word_ids()[index - 1] != word)]
    theirs = {entity["index"]: entity["entity"] for entity in tagger(text)}
    assert [theirs[index] for index in first_pieces] == ours
    assert {label for label in ours} != {"O"} or len(set(theirs.values())) == 1
    loaded = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "hf", trust_remote_code=not native)
    inputs = tagger.tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        expected, _ = model(inputs["input_ids"])
        torch.testing.assert_close(loaded(**inputs).logits, expected, rtol=1e-4, atol=1e-4)
    assert np.array_equal(np.array(list(loaded.config.id2label.values())), np.array(model.config.label_names))
    import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "back.pt")])
    back = checkpoints.load(tmp_path / "back.pt")
    assert back["task"] == "ner" and tuple(back["model_config"]["label_names"]) == model.config.label_names
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(back["model"][name], tensor, rtol=0, atol=0, msg=name)
