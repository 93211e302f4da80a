"""scripts/classify.py as a command in a pipeline: output into a pipe its reader closed ends quietly."""
import subprocess
import sys
from pathlib import Path

import checkpoints
from model import BertForSequenceClassification, ModelConfig

ROOT = Path(__file__).resolve().parent.parent


def untrained_sst2_checkpoint(path: Path, vocab) -> Path:
    """A fine-tuning checkpoint of fresh weights: what classify.py prints is tested, not how well."""
    config = ModelConfig(vocab_size=vocab.size, max_len=64, d_model=32, heads=2, n_layer=1, d_ff=64)
    state = checkpoints.make_state(task="sst2", weights=BertForSequenceClassification(config).state_dict(),
                                   model_config=config, vocab=vocab, config={"seq-len": 64})
    checkpoints.save(path, state)
    return path


def test_output_into_a_closed_pipe_ends_quietly_as_unix_tools_do(vocab, tmp_path):
    best = untrained_sst2_checkpoint(tmp_path / "best.pt", vocab)
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("a gorgeous , witty , seductive movie .\n" * 5000, encoding="utf-8")  # past a pipe's buffer
    result = subprocess.run(f'"{sys.executable}" "{ROOT / "scripts" / "classify.py"}" --cp "{best}" -i "{sentences}" '
                            f'| head -n1', shell=True, capture_output=True, text=True)
    assert result.stdout.count("\n") == 1 and result.stdout.endswith("a gorgeous , witty , seductive movie .\n")
    assert result.stderr == ""
