"""The original project's users move over unchanged: each of its config templates starts a run here
(data where its patterns point, a small model on the command line), local_config.ini, its keys and
flags, its GPT article arrays, CoLA, sinusoidal positions, short legacy shards, and fine-tuning that
takes the architecture from the checkpoint."""
import gzip
import math
import shutil
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch

import hardware
import legacy
import main
import make_demo
from tasks.classification_task import ClassificationTask
from ini import load_config
from tasks.mlm_task import MaskedLMTask
from packed_files import ShardError
from model import INIT_STD, BertForMaskedLM, ModelConfig, sinusoidal_positions
from shards import from_arrays, read_shard
from test_mlm_task import write_legacy_shard
from test_trainer import load
from vocab import load_vocab
from conftest import TEST_DEVICE

TEMPLATES = Path(__file__).resolve().parent.parent.parent / "shared" / "seed-project" / "templates"
SMALL = ["--d-model", "64", "--heads", "2", "--n-layer", "2", "--seq-len", "64", "--batch-size", "8",
         "--compile", "false", "--device", TEST_DEVICE, "--dtype", "float32"]
ONE_STEP = ["--max-iters", "1", "--val-interval", "1", "--val-iters", "1", "--warmup-iters", "0",
            "--lr-decay-iters", "1"]
needs_templates = pytest.mark.skipif(not TEMPLATES.is_dir(), reason="needs ../shared/seed-project/templates")


def write_article_arrays(datasets: Path, split: str, shard) -> None:
    """The original's GPT data from a shard: its samples as articles, ids (uint16) and their starts."""
    lengths = np.diff(shard.offsets)
    np.save(datasets / f"{split}_article_128_ids.npy", shard.tokens.astype(np.uint16))
    np.save(datasets / f"{split}_article_128_offsets.npy", np.concatenate([[0], np.cumsum(lengths)[:-1]]))


@pytest.fixture(scope="module")
def project(mlm_base_dir, rotten_tomatoes, tmp_path_factory) -> Path:
    """A working directory with wiki/ as the templates expect it: vocab/, and in datasets/ shards
    under the templates' names, SST-2/CoLA parquet files and GPT article arrays."""
    root = tmp_path_factory.mktemp("project")
    wiki = root / "wiki"
    shutil.copytree(mlm_base_dir / "vocab", wiki / "vocab")
    datasets = wiki / "datasets"
    datasets.mkdir()
    for split in ("train", "val", "test"):
        shard = mlm_base_dir / "datasets" / f"{split}_imdb_64_123.msgpack.gz"
        for label in ("weke", "wiki"):
            shutil.copy(shard, datasets / f"{split}_{label}_1.msgpack.gz")
        write_article_arrays(datasets, split, read_shard(shard))
    make_demo.write_sst2(datasets, rotten_tomatoes[:1200], seed=123)
    return root


@pytest.fixture
def in_project(project, tmp_path, monkeypatch, keep_signal_handlers):
    """A fresh copy of the project as the current directory."""
    shutil.copytree(project, tmp_path / "work")
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)  # not tested here
    return tmp_path / "work"


def last_run() -> Path:
    return max(Path("wiki/runs").iterdir(), key=lambda path: path.stat().st_mtime)


@needs_templates
@pytest.mark.parametrize("name, task", [("config_template.ini", "mlm"), ("config_mlm.ini", "mlm"),
                                        ("config_sst2.ini", "sst2"), ("config_cola.ini", "cola"),
                                        ("config_gpt.ini", "clm")])
def test_each_original_template_starts_a_run(in_project, name, task):
    shutil.copy(TEMPLATES / name, "config.ini")
    main.main([*SMALL, *ONE_STEP])
    saved = load(last_run() / "checkpoints" / "checkpoint.pt")
    assert saved["step"] == 1 and saved["task"] == task


@needs_templates
def test_the_gpt_template_trains_on_our_shards_too(in_project):
    shutil.copy(TEMPLATES / "config_gpt.ini", "config.ini")
    main.main([*SMALL, *ONE_STEP, "--dataset-pattern", "train_weke_*.msgpack"])
    assert load(last_run() / "checkpoints" / "checkpoint.pt")["task"] == "clm"


@needs_templates
def test_local_config_overrides_config_and_the_log_says_so(in_project):
    shutil.copy(TEMPLATES / "config_template.ini", "config.ini")
    shutil.copy(TEMPLATES / "local_config_template.ini", "local_config.ini")  # seq-len 32, 10% of the data
    main.main([*SMALL, *ONE_STEP])
    run = last_run()
    assert "config read from config.ini, then local_config.ini" in (run / "logs" / "log.txt").read_text()
    saved = (run / "config.ini").read_text().splitlines()
    assert "d-model = 64" in saved and "dataset-percentage = 0.1" in saved and "lr-scheduler = none" in saved


def test_article_arrays_are_cut_into_samples_of_seq_len(in_project):
    Path("config.ini").write_text("base-dir = wiki\n")
    config = load_config(None, ["--task-type", "clm", "--seq-len", "16",
                                "--dataset-pattern", "{split}_article_128_{which}.npy"])
    vocab = load_vocab("wiki/vocab")
    task = MaskedLMTask(config, vocab, torch.device(TEST_DEVICE))
    assert task.data.patterns["val"] == "val_article_128_{which}.npy"  # derived: the config has no val pattern
    split = task.data.split("train")
    shard = split.read(split.plan(0).files[0])  # the whole file
    ids = np.load("wiki/datasets/train_article_128_ids.npy")
    assert np.array_equal(shard.tokens, ids) or len(shard.tokens) < len(ids)  # lone last tokens dropped
    assert np.diff(shard.offsets).max() == 16 and np.diff(shard.offsets).min() >= 2
    starts = np.load("wiki/datasets/train_article_128_offsets.npy")
    first_article = ids[starts[0]:starts[1]]
    assert np.array_equal(shard.sample(0), first_article[:16])  # an article's first piece


def test_test_iters_caps_the_test_batches_and_run_id_names_the_run(in_project, monkeypatch, capsys):
    Path("config.ini").write_text("base-dir = wiki\ntask-type = sst2\n")
    main.main([*SMALL, *ONE_STEP, "--run-id", "first-try"])
    best = Path("wiki/runs/first-try/checkpoints/best.pt")
    assert best.is_file()
    with pytest.raises(SystemExit) as exit_info:
        main.main([*SMALL, *ONE_STEP, "--run-id", "first-try"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "error: run-id = first-try: " in error and "resume it with --cp" in error
    counts = []
    original = ClassificationTask.eval_batches
    monkeypatch.setattr(ClassificationTask, "eval_batches",
                        lambda self, split, count: counts.append((split, count)) or original(self, split, count))
    main.main(["--cp", str(best), "--test", "--test-iters", "2", *SMALL])
    assert ("test", 2) in counts


def test_percentages_keep_a_seeded_fixed_share(in_project):
    Path("config.ini").write_text("base-dir = wiki\n")
    vocab = load_vocab("wiki/vocab")
    whole = MaskedLMTask(load_config(None, [*SMALL, "--dataset-pattern", "train_weke_*.msgpack"]), vocab,
                         torch.device(TEST_DEVICE))
    tenth = [MaskedLMTask(load_config(None, [*SMALL, "--dataset-pattern", "train_weke_*.msgpack",
                                             "--dataset-percentage", "0.1"]), vocab, torch.device(TEST_DEVICE))
             for _ in range(2)]
    samples = len(whole.data.split("train").plan(0).rows(0))
    kept = [task.data.split("train").plan(0).rows(0) for task in tenth]
    assert len(kept[0]) == round(0.1 * samples) and np.array_equal(kept[0], kept[1])  # the same seeded share
    assert [task.train_examples() for task in (whole, tenth[0])] == [samples, len(kept[0])]  # what epochs counts
    validation = [task.data.split("val").plan(0).rows(0) for task in (whole, tenth[0])]
    assert len(validation[0]) == len(validation[1])  # the share is of the train split only

    sentences = ClassificationTask(load_config(None, [*SMALL, "--task-type", "sst2", "--val-dataset-percentage",
                                                      "0.5"]), vocab, torch.device(TEST_DEVICE))
    full = ClassificationTask(load_config(None, [*SMALL, "--task-type", "sst2"]), vocab, torch.device(TEST_DEVICE))
    assert len(sentences.split("val")) == round(0.5 * len(full.split("val")))
    assert sentences.train_examples() == full.train_examples()


def test_cola_keeps_the_checkpoint_of_the_best_matthews_correlation(in_project):
    Path("config.ini").write_text("base-dir = wiki\ntask-type = cola\n")
    main.main([*SMALL, "--max-iters", "4", "--val-interval", "2", "--val-iters", "1000", "--warmup-iters", "0",
               "--lr-decay-iters", "4"])
    run = last_run()
    matthews = [float(line.split("val matthews ")[1].split()[0]) for line in
                (run / "logs" / "log.txt").read_text().splitlines() if "val matthews" in line]
    assert load(run / "checkpoints" / "best.pt")["best"] == pytest.approx(max(matthews), abs=1e-4)


def test_fine_tuning_takes_the_architecture_from_the_checkpoint(in_project, capsys):
    Path("config.ini").write_text("base-dir = wiki\n")
    main.main([*SMALL, *ONE_STEP, "--dataset-pattern", "train_weke_*.msgpack", "--position", "sinusoidal",
               "--norm", "preln"])
    pretrained = last_run() / "checkpoints" / "checkpoint.pt"
    Path("config.ini").write_text("base-dir = wiki\ntask-type = sst2\n")  # no architecture keys at all
    main.main(["--cp", str(pretrained), *ONE_STEP, "--compile", "false", "--device", TEST_DEVICE, "--seq-len", "64"])
    saved = (last_run() / "config.ini").read_text().splitlines()
    assert {"d-model = 64", "heads = 2", "n-layer = 2", "position = sinusoidal", "norm = preln"} <= set(saved)
    with pytest.raises(SystemExit):  # a key the config sets must agree
        main.main(["--cp", str(pretrained), *ONE_STEP, "--compile", "false", "--seq-len", "64", "--heads", "4"])
    assert "heads = 2 in the checkpoint but 4" in capsys.readouterr().err


def test_sinusoidal_positions_are_the_papers_table_and_not_saved():
    table = sinusoidal_positions(50, 8)
    assert table[7, 2] == pytest.approx(INIT_STD * math.sin(7 / 10000 ** (2 / 8)))
    assert table[7, 3] == pytest.approx(INIT_STD * math.cos(7 / 10000 ** (2 / 8)))
    model = BertForMaskedLM(ModelConfig(vocab_size=40, max_len=50, d_model=8, heads=2, n_layer=1, d_ff=16,
                                        position="sinusoidal", dropout=0.0)).eval()
    assert not any("position" in name for name in model.state_dict())
    ids = torch.randint(5, 40, (1, 10))
    with torch.no_grad():
        hidden, swapped = model.encoder(ids), model.encoder(ids.flip(1))
    assert not torch.allclose(hidden.flip(1), swapped)  # order matters


def test_legacy_shards_of_seq_len_12_train(in_project):
    datasets = Path("wiki/datasets")
    vocab = load_vocab("wiki/vocab")
    rng = np.random.default_rng(0)
    for split, count in (("train", 400), ("val", 100), ("test", 100)):
        shard = read_shard(datasets / f"{split}_weke_1.msgpack.gz")
        samples = [np.concatenate([shard.sample(i)[:11], [vocab.sep_id]]) for i in range(count)]
        write_legacy_shard(datasets / f"{split}_short_1.msgpack.gz", samples, vocab.mask_id, rng)
    Path("config.ini").write_text("base-dir = wiki\n")
    main.main([*SMALL[:6], *SMALL[8:], *ONE_STEP, "--seq-len", "12", "--masking", "static", "--dataset-pattern",
               "train_short_*.msgpack", "--val-dataset-pattern", "val_short_*.msgpack"])
    assert load(last_run() / "checkpoints" / "checkpoint.pt")["step"] == 1


def test_the_original_flags(in_project, capsys):
    Path("config.ini").write_text("base-dir = wiki\n")
    main.main(["-t", "mlm", "--n-layers", "1", *SMALL[:4], *SMALL[6:], *ONE_STEP,
               "--dataset-pattern", "train_weke_*.msgpack", "--flash", "--dist-backend", "gloo"])
    assert "n-layer = 1" in (last_run() / "config.ini").read_text().splitlines()
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--dp"])
    assert exit_info.value.code == 2 and "use --ddp" in capsys.readouterr().err


def legacy_payload(rng, count=300) -> tuple[list, list]:
    inputs, labels = [], []
    for _ in range(count):
        ids = rng.integers(5, 2000, rng.integers(3, 128)).tolist()
        label = [0] * len(ids)
        for position in rng.choice(len(ids), max(1, len(ids) // 7), replace=False):
            label[position], ids[position] = ids[position], 4
        inputs.append(ids)
        labels.append(label)
    return inputs, labels


@pytest.mark.parametrize("gzipped", [True, False])
def test_legacy_shard_reads_as_packed(tmp_path, gzipped):
    inputs, labels = legacy_payload(np.random.default_rng(1))
    packed = msgpack.packb([item for pair in zip(inputs, labels) for item in pair])
    path = tmp_path / ("old.msgpack.gz" if gzipped else "old.msgpack")
    path.write_bytes(gzip.compress(packed) if gzipped else packed)
    shard = from_arrays(path, *legacy.read(path, {"seq_len": 128, "vocab_size": 2000}))
    assert shard.header["format"] == "legacy" and shard.masking == "static" and len(shard) == len(inputs)
    assert shard.seq_len == max(map(len, inputs))
    for i, (ids, label) in enumerate(zip(inputs, labels)):
        assert shard.sample(i).tolist() == ids
        begin, end = shard.mask_offsets[i], shard.mask_offsets[i + 1]
        rebuilt = [0] * len(ids)
        for position, original in zip(shard.mask_positions[begin:end], shard.mask_labels[begin:end]):
            rebuilt[position] = int(original)
        assert rebuilt == label
    with pytest.raises(ShardError, match="the vocabulary has 1000 tokens"):
        legacy.read(path, {"vocab_size": 1000})


def test_a_cut_shard_of_theirs_is_one_line_naming_it(tmp_path):
    inputs, labels = legacy_payload(np.random.default_rng(2))
    packed = msgpack.packb([item for pair in zip(inputs, labels) for item in pair])
    path = tmp_path / "damaged.msgpack"
    path.write_bytes(packed[:len(packed) // 2])
    with pytest.raises(ShardError, match=f"^{path}: truncated or corrupt file"):
        legacy.read(path, {})


def test_a_shard_of_ours_is_not_theirs(mlm_base_dir):
    assert legacy.read(next((mlm_base_dir / "datasets").glob("train_*")), {}) is None
