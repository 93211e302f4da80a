"""A short pre-training must never make fine-tuning worse than random weights. With BERT's post-LN
after 120 steps, [CLS] alone could not tell sentences apart and fine-tuning through it sat at chance
(64% and 52% test accuracy where random weights gave 78%); the recommended recipe
(etc/templates/config_sst2_cpu.ini) pools the mean of the tokens instead. With the sinusoidal table
at amplitude 1 the embeddings carried almost nothing but position, and both starts sat at chance.
Both starts, real text, for BERT's architecture, the original project's and the defaults."""
import shutil
from pathlib import Path

import pytest

import main
import make_demo
from conftest import TEST_DEVICE

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "etc" / "templates" / "config_sst2_cpu.ini"
ARCHITECTURES = {  # where a start collapsed (BERT's own, the original project's), and the defaults
    "bert": ["--norm", "postln", "--position", "learned"],
    "original-project": ["--norm", "preln", "--position", "sinusoidal"],
    "defaults": ["--norm", "preln", "--position", "rope"],
}
SMALL = ["--seq-len", "64", "--d-model", "128", "--heads", "2", "--n-layer", "2", "--device", TEST_DEVICE,
         "--dtype", "float32"]


@pytest.fixture(scope="module")
def base(mlm_base_dir, rotten_tomatoes, tmp_path_factory) -> Path:
    """The shared MLM shards of 64 tokens (prepare_mlm_dataset.py's defaults) beside SST-2's files."""
    base = tmp_path_factory.mktemp("start")
    for name in ("vocab", "datasets"):
        shutil.copytree(mlm_base_dir / name, base / name)
    make_demo.write_sst2(base / "datasets", rotten_tomatoes, seed=123)
    return base


def outcome(run_dir: Path) -> tuple[float, float]:
    """The best validation accuracy and the last logged training loss of a fine-tuning run."""
    lines = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8").splitlines()
    accuracy = max(float(line.split("val accuracy ")[1].split()[0]) for line in lines if "val accuracy" in line)
    loss = [float(line.split("| loss ")[1].split()[0]) for line in lines if "| loss " in line][-1]
    return accuracy, loss


def fine_tune(base: Path, checkpoint: Path | None, architecture: list[str]) -> tuple[float, float]:
    """The recommended recipe, shortened to 150 steps (3 epochs of the 1,600 sentences)."""
    overrides = ["--base-dir", str(base), *SMALL, *architecture, "--max-iters", "150", "--lr-decay-iters", "150",
                 "--val-interval", "50"]
    return outcome(main.run(main.load_config(RECIPE, overrides), checkpoint, False))


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_fine_tuning_after_a_short_pre_training_is_no_worse_than_from_random_weights(name, base, monkeypatch,
                                                                                  keep_signal_handlers):
    architecture = ARCHITECTURES[name]
    monkeypatch.chdir(base)
    pretraining = main.load_config(ROOT / "etc" / "templates" / "config_cpu.ini",
                                   ["--base-dir", str(base), *SMALL, *architecture, "--max-iters", "120",
                                    "--time-budget", "0", "--val-interval", "120", "--val-iters", "2",
                                    "--dataset-pattern", "train_imdb_64_*.msgpack",
                                    "--val-dataset-pattern", "val_imdb_64_*.msgpack"])
    checkpoint = main.run(pretraining, None, False) / "checkpoints" / "checkpoint.pt"
    pretrained, pretrained_loss = fine_tune(base, checkpoint, architecture)
    random, _ = fine_tune(base, None, architecture)
    # 200 validation sentences: one standard error of an accuracy near 0.67 is 0.033, of the difference of two
    # 0.047. Over seeds 1, 2, 7 and 1337 and two ways of drawing dropout masks, the defaults' and BERT's
    # pre-trained starts came from 0.06 below their random ones to 0.03 above; the collapsed starts this test
    # is for sat 0.14 and 0.26 below.
    assert pretrained >= random - 0.08, (pretrained, random)
    # A collapsed start keeps the training loss at ln 2 = 0.693 (with the unit sinusoidal table random weights
    # did too, at 52% validation accuracy); a working one fits the 1,600 sentences, 0.31 to 0.43 here.
    assert pretrained_loss < 0.5, (pretrained_loss, pretrained)
