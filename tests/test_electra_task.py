"""ELECTRA (task-type = electra): the model's corruption, learning on real text, exact resume,
two processes, fine-tuning from its discriminator, and export of that encoder to transformers."""
import math
import shutil

import numpy as np
import pytest
import torch
from transformers import ElectraForPreTraining as TheirElectra

import checkpoints
import export_hf
import hardware
import main
import make_demo
from config import Config
from errors import UserError
from model import IGNORE_INDEX, ElectraForPreTraining, ModelConfig, generator_config
from test_distributed import run_main

ELECTRA = ["--task-type", "electra", "--generator-width", "0.5", "--mask-rate", "0.25"]


@pytest.fixture(autouse=True)
def skip_flops_measurement(monkeypatch):
    monkeypatch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)


def test_generator_is_narrower_and_shares_the_embeddings():
    config = ModelConfig(vocab_size=50, max_len=16, d_model=32, heads=4, n_layer=2, d_ff=64, generator_heads=1)
    assert (generator_config(config).d_model, generator_config(config).d_ff) == (8, 16)
    model = ElectraForPreTraining(config)
    assert model.generator_head.token_embedding is model.encoder.embeddings.token
    ids = torch.randint(5, 50, (3, 16))
    masked = ids.clone()
    positions = torch.tensor([[1, 2, 0], [3, 4, 5], [6, 0, 0]])
    labels = torch.where(positions > 0, ids.gather(1, positions), IGNORE_INDEX)
    masked.scatter_(1, positions, 4)
    generator_logits, detector_logits, corrupted = model(masked, positions, labels, ids,
                                                         sampling=torch.Generator().manual_seed(0))
    assert generator_logits.shape == (3, 3, 50) and detector_logits.shape == (3, 16)
    changed = corrupted != ids
    untouched = torch.ones_like(changed)
    untouched.scatter_(1, positions, False)
    assert not changed[untouched].any()  # only masked positions may be replaced
    loss = generator_logits.sum() + detector_logits.sum()
    loss.backward()
    assert model.encoder.embeddings.token.weight.grad.abs().sum() > 0
    assert model.generator_input.weight.grad.abs().sum() > 0


def test_a_generator_wider_than_the_discriminator_is_refused():
    with pytest.raises(UserError, match=r"generator-width = 1.5: expected a number in \(0, 1\]"):
        Config(task_type="electra", generator_width=1.5)


def test_electra_learns_to_detect_replaced_tokens(mlm_workdir):
    # Pre-LN with rotary positions leaves the unigram plateau within these few steps.
    quick = ["--norm", "preln", "--position", "rope", "--dropout", "0", "--max-iters", "150", "--lr-decay-iters", "150",
             "--val-interval", "50"]
    run_dir = main.run(main.load_config(None, ELECTRA + quick), None, False)
    log = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8")
    validations = [line for line in log.splitlines() if "| val loss" in line]
    assert len(validations) == 3
    final = {part.split()[1]: float(part.split()[2]) for part in validations[-1].split(" | ")[1:]}
    start = {part.split()[1]: float(part.split()[2]) for part in validations[0].split(" | ")[1:]}
    assert final["loss"] < start["loss"] and final["generator_loss"] < start["generator_loss"]
    # Better than the base rate: a detector that knows only the share replaced scores its entropy.
    share = final["replaced"]
    assert 0 < share < 0.25
    assert final["detection_loss"] < -(share * math.log(share) + (1 - share) * math.log(1 - share)) - 0.003
    assert "| generator_loss " in log and "| detection_accuracy " in log  # training lines show both parts
    assert "replaced:  " in log and "flagged:   " in log


def test_electra_resumes_exactly(mlm_workdir_factory, tmp_path, monkeypatch, keep_signal_handlers):
    settings = {"task_type": "electra", "generator_width": 0.5, "lr_decay_iters": 10, "val_interval": 5}
    monkeypatch.chdir(mlm_workdir_factory(tmp_path / "straight", **settings))
    main.main(["--max-iters", "10"])
    straight = checkpoints.load(tmp_path / "straight" / "runs" / "run0" / "checkpoints" / "checkpoint.pt")
    monkeypatch.chdir(mlm_workdir_factory(tmp_path / "resumed", **settings))
    main.main(["--max-iters", "5"])
    main.main(["--max-iters", "10", "--cp", "runs/run0/checkpoints/checkpoint.pt"])
    resumed = checkpoints.load(tmp_path / "resumed" / "runs" / "run0" / "checkpoints" / "checkpoint.pt")
    assert resumed["step"] == straight["step"] == 10
    for name, tensor in straight["model"].items():
        torch.testing.assert_close(resumed["model"][name], tensor, rtol=0, atol=1e-5, msg=name)


def test_two_processes_train_electra(mlm_workdir):
    result = run_main(mlm_workdir, *ELECTRA, "--max-iters", "6", "--val-interval", "6")
    assert result.returncode == 0, result.stderr
    saved = checkpoints.load(mlm_workdir / "runs" / "run0" / "checkpoints" / "checkpoint.pt")
    assert saved["task"] == "electra" and saved["step"] == 6 and len(saved["rng_per_rank"]) == 2


def test_fine_tuning_starts_from_the_discriminator_and_export_gives_it_to_transformers_electra(
        mlm_workdir, rotten_tomatoes, tmp_path):
    bert = ["--norm", "postln", "--position", "learned"]  # what transformers' ElectraForPreTraining holds
    run_dir = main.run(main.load_config(None, ELECTRA + bert + ["--max-iters", "4"]), None, False)
    electra = run_dir / "checkpoints" / "checkpoint.pt"
    make_demo.write_sst2(mlm_workdir / "datasets", rotten_tomatoes, seed=123)
    fine_tuned = main.run(main.load_config(None, ["--task-type", "sst2", "--max-iters", "3", "--val-interval", "3"]),
                          electra, False)
    log = (fine_tuned / "logs" / "log.txt").read_text(encoding="utf-8")
    assert f"loaded the encoder of {electra} (electra step 4)" in log
    assert "not used: detector.*, generator.*, generator_head.*, generator_input.*" in log

    export_hf.main(["--cp", str(electra), "-o", str(tmp_path / "hf")])
    # BERT's layout: transformers' own ELECTRA discriminator, detector head included.
    theirs, info = TheirElectra.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = ElectraForPreTraining(ModelConfig(**checkpoints.load(electra)["model_config"]))
    ours.load_state_dict(checkpoints.load(electra)["model"])
    ids = torch.randint(5, 100, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(ours.eval().detector(ours.encoder(ids)).squeeze(-1), theirs.eval()(ids).logits,
                                   rtol=1e-4, atol=1e-4)
    shutil.rmtree(tmp_path / "hf")


def test_a_shard_without_room_for_masks_is_one_line(mlm_workdir, capsys):
    from shards import ShardWriter
    from vocab import load_vocab
    vocab = load_vocab("vocab")
    for split in ("train", "val"):
        with ShardWriter(f"datasets/{split}_empty_1.msgpack.gz", vocab, seq_len=64, split=split, seed=1) as writer:
            writer.add([np.array([vocab.cls_id, vocab.sep_id])] * 100)
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--task-type", "electra", "--max-iters", "2", "--dataset-pattern", "train_empty_*.msgpack",
                   "--val-dataset-pattern", "val_empty_*.msgpack"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["error: datasets/val_empty_1.msgpack.gz: no sample has room for a mask: "
                     "every one is [CLS] [SEP] alone"]
