"""scripts/demo.py: a stop request ends the demo with the command that goes on."""
import shutil
from pathlib import Path

import demo
import hardware
import main
import make_demo
import prepare_mlm_dataset
import torch

ROOT = Path(__file__).resolve().parent.parent


def test_a_stop_ends_the_demo_saying_how_to_go_on(tmp_path, imdb_corpus, vocab_dir, rotten_tomatoes, monkeypatch,
                                                 capsys, keep_signal_handlers):
    base = tmp_path / "demo"
    shutil.copytree(vocab_dir, base / "vocab")
    prepare_mlm_dataset.main(["-i", str(imdb_corpus), "-l", "imdb", "-o", str(base / "datasets"), "-m", "128",
                              "-v", str(base / "vocab")])
    make_demo.write_sst2(base / "datasets", rotten_tomatoes, seed=123)
    monkeypatch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)  # not tested here
    monkeypatch.chdir(tmp_path)
    Path("stop").touch()

    demo.main(["--base-dir", str(base)])  # the stop file ends pre-training after its first step
    out = capsys.readouterr().out
    assert "the demo stopped during pre-training (the file ./stop)" in out
    assert "== fine-tuning" not in out and not (base / "runs" / "run1").exists()
    command = out.split("to go on with that stage: ")[1].split()
    assert command[:2] == ["python", "src/main.py"]

    monkeypatch.chdir(ROOT)  # the command names the template relative to the repository
    main.main(command[2:] + ["--max-iters", "2", "--time-budget", "0"])
    saved = torch.load(base / "runs" / "run0" / "checkpoints" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 2
