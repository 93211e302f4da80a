"""The checkpoint format on its own: safe loading, compatibility messages in INI keys, rotation,
and the --cp rule."""
import errno
import io
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import checkpoints
import main
from config import Config
from errors import UserError
from model import BertForMaskedLM, ModelConfig
from vocab import Vocab

VOCAB = Vocab(("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"))
SMALL = ModelConfig(vocab_size=VOCAB.size, max_len=16, d_model=16, heads=2, n_layer=1, d_ff=32)


def small_state(**changes) -> dict:
    model = BertForMaskedLM(SMALL)
    return checkpoints.make_state(task="mlm", weights=model.state_dict(), model_config=SMALL, vocab=VOCAB,
                                  config=Config().to_dict(), **changes)


class RunsCode:
    """Unpickling this would run code: what a malicious checkpoint file does."""
    ran = False

    def __reduce__(self):
        return setattr, (RunsCode, "ran", True)


def test_save_then_load_gives_the_same_tensors_and_settings(tmp_path):
    state = small_state(step=7, best=1.5)
    checkpoints.save(tmp_path / "c.pt", state)
    loaded = checkpoints.load(tmp_path / "c.pt")
    assert loaded["step"] == 7 and loaded["best"] == 1.5 and loaded["task"] == "mlm"
    assert all(torch.equal(loaded["model"][name], tensor) for name, tensor in state["model"].items())
    assert not list(tmp_path.glob(".*.tmp"))  # the temp file was renamed into place


@pytest.mark.parametrize("save", [checkpoints.save, lambda path, state: checkpoints.save_latest(path.parent, state, 2)])
def test_a_state_the_safe_load_would_refuse_is_never_written(tmp_path, save):
    path = tmp_path / "checkpoint.pt"
    save(path, small_state(step=3))
    with pytest.raises(RuntimeError, match="checkpoint.pt: not saved: the checkpoint would not load safely"):
        save(path, small_state(step=4, best=np.float64(0.5)))  # a numpy scalar is not among weights_only's types
    assert checkpoints.load(path)["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_a_pickle_that_runs_code_is_refused_without_running(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": checkpoints.FORMAT, "payload": RunsCode()}, path)
    with pytest.raises(UserError, match="evil.pt: not a readable checkpoint"):
        checkpoints.load(path)
    assert RunsCode.ran is False


@pytest.mark.parametrize("content, message", [
    (None, "checkpoint not found"),
    (b"not a checkpoint", "not a readable checkpoint"),
    (b"\x80\xf8" + bytes(range(200)), "not a readable checkpoint"),  # a pickle of protocol 248: torch warns
    ({"weights": torch.zeros(2)}, "not a checkpoint of this program"),
    ({"format": checkpoints.FORMAT, "task": "mlm", "model": {}}, "damaged checkpoint, without step, tokens, optimizer"),
])
def test_bad_files_get_one_line(tmp_path, content, message):
    path = tmp_path / "c.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with pytest.raises(UserError, match=message):
            checkpoints.load(path)
    assert not warned  # nothing but the error line may reach the user


@pytest.mark.parametrize("damage, message", [
    (lambda state: state.pop("lineage"), "c.pt: a damaged checkpoint, without lineage"),
    (lambda state: state["model_config"].pop("pooling"), "c.pt: a damaged checkpoint: its model_config lacks pooling"),
])
def test_a_checkpoint_without_an_entry_or_a_model_field_is_one_line(tmp_path, damage, message):
    state = small_state()
    damage(state)
    torch.save({**state, "checksum": checkpoints.checksum(state)}, tmp_path / "c.pt")
    with pytest.raises(UserError, match=message):
        checkpoints.load(tmp_path / "c.pt")


def test_a_missing_checkpoint_names_its_full_path_and_the_newest_checkpoints_nearby(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    here = Path.cwd()
    with pytest.raises(UserError) as raised:
        checkpoints.load(Path("nothing.pt"), runs_dir=Path("wiki") / "runs")
    written = here / "wiki" / "runs" / "runN" / "checkpoints" / "checkpoint.pt"
    assert str(raised.value) == (f"{here / 'nothing.pt'}: checkpoint not found; no runs/ directory here yet: a "
                                 f"training run writes {written}")
    (here / "runs").mkdir()
    with pytest.raises(UserError, match=f"^{here / 'nothing.pt'}: checkpoint not found; {here / 'runs'} holds no "
                                        f"checkpoint yet: a training run writes runN/checkpoints/checkpoint.pt there$"):
        checkpoints.load(Path("nothing.pt"))
    for age, name in enumerate(["run2/checkpoints/checkpoint.pt", "run2/checkpoints/best.pt",
                                "run1/checkpoints/checkpoint.pt", "run0/checkpoints/checkpoint.pt"]):
        file = here / "runs" / name
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(b"")
        os.utime(file, (1e9 - age, 1e9 - age))  # newest first
    with pytest.raises(UserError) as raised:  # a typo in a path through runs/: that runs/ is the one listed
        checkpoints.load(Path("runs/run2/checkpoints/chekpoint.pt"), runs_dir=Path("wiki") / "runs")
    assert str(raised.value) == (f"{here / 'runs/run2/checkpoints/chekpoint.pt'}: checkpoint not found; newest "
                                 f"checkpoints in {here / 'runs'}: runs/run2/checkpoints/checkpoint.pt, "
                                 f"runs/run2/checkpoints/best.pt, runs/run1/checkpoints/checkpoint.pt and 1 more")
    with pytest.raises(UserError, match="checkpoint not found; newest checkpoints in "):  # a directory is no file
        checkpoints.load(here / "runs")


def test_another_architecture_is_named_in_ini_keys(tmp_path):
    wider = ModelConfig(**{**SMALL.__dict__, "d_model": 32})
    with pytest.raises(UserError, match=r"d-model = 16 in the checkpoint but 32 from the config"):
        checkpoints.check_compatible(tmp_path / "c.pt", small_state(), VOCAB, wider)
    other_vocab = Vocab(VOCAB.tokens + ("d",))
    with pytest.raises(UserError, match="another vocabulary"):
        checkpoints.check_compatible(tmp_path / "c.pt", small_state(), other_vocab, SMALL)
    checkpoints.check_compatible(tmp_path / "c.pt", small_state(), VOCAB, ModelConfig(**{**SMALL.__dict__,
                                                                                         "dropout": 0.0}))


def test_restore_model_gives_the_saved_model_and_vocabulary(tmp_path):
    state = small_state()
    checkpoints.save(tmp_path / "c.pt", state)
    model, vocab, _ = checkpoints.restore_model(tmp_path / "c.pt", {"mlm": BertForMaskedLM})
    assert vocab == Vocab(VOCAB.tokens) and not model.training
    assert torch.equal(model.state_dict()["encoder.embeddings.token.weight"],
                       state["model"]["encoder.embeddings.token.weight"])
    with pytest.raises(UserError, match="a mlm checkpoint; expected sst2"):
        checkpoints.restore_model(tmp_path / "c.pt", {"sst2": BertForMaskedLM})


def test_rotation_keeps_the_newest_under_their_steps(tmp_path):
    for step in (10, 20, 30, 40):
        checkpoints.save_latest(tmp_path, small_state(step=step), keep=3)
    assert sorted(path.name for path in tmp_path.glob("*.pt")) == [
        "checkpoint-20.pt", "checkpoint-30.pt", "checkpoint.pt"]
    assert checkpoints.load(tmp_path / "checkpoint.pt")["step"] == 40
    assert checkpoints.load(tmp_path / "checkpoint-30.pt")["step"] == 30


def test_a_kill_while_rotating_leaves_the_latest_in_place(tmp_path, monkeypatch):
    checkpoints.save_latest(tmp_path, small_state(step=10), keep=3)

    def killed(*args):
        raise KeyboardInterrupt  # the process dies between the new file and the rename
    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save_latest(tmp_path, small_state(step=20), keep=3)
    monkeypatch.undo()
    assert checkpoints.load(tmp_path / "checkpoint.pt")["step"] == 10  # README's resume command works
    assert not list(tmp_path.glob(".*.tmp"))


def test_run_dir_of_a_checkpoint():
    assert checkpoints.run_dir_of(Path("/x/runs/run3/checkpoints/best.pt")) == Path("/x/runs/run3")
    assert checkpoints.run_dir_of(Path("/x/elsewhere/best.pt")) is None


LONGER = ["--seq-len", "128", "--dataset-pattern", "train_imdb_128_*.msgpack",
          "--val-dataset-pattern", "val_imdb_128_*.msgpack", "--max-iters", "2", "--val-interval", "2"]


def prepare_longer_shards(corpus: Path):
    """datasets/{train,val,test}_imdb_128_123: the same corpus in samples of 128 tokens, documents apart."""
    import prepare_mlm_dataset
    prepare_mlm_dataset.main(["-i", str(corpus), "-l", "imdb", "-o", "datasets", "-m", "128", "-v", "vocab",
                              "-s", "123", "--documents", "apart"])


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_a_longer_context_phase_starts_from_a_checkpoint_at_a_shorter_seq_len(mlm_workdir, imdb_corpus, capsys,
                                                                                position):
    """A new run from a 64-token model's weights at seq-len 128 on 128-token shards: learned
    positions 64-127 start as copies of the trained 0-63, rope angles reach 128 at the new base."""
    short = main.run(main.load_config(None, ["--max-iters", "2", "--position", position]), None, False)
    prepare_longer_shards(imdb_corpus)
    theta = ["--rope-theta", "160000"] if position == "rope" else []
    trained = checkpoints.load(short / "checkpoints" / "checkpoint.pt")
    long = main.run(main.load_config(None, LONGER + theta), short / "checkpoints" / "checkpoint.pt", False,
                    switch_training=True)
    phase = checkpoints.load(long / "checkpoints" / "checkpoint.pt")
    assert phase["model_config"]["max_len"] == 128 and phase["step"] == 2
    assert [stage["step"] for stage in phase["lineage"]] == [2]
    log = (long / "logs" / "log.txt").read_text(encoding="utf-8")
    if position == "learned":
        assert "positions: 64 in the checkpoint, 128 now (the learned table's rows copied on)" in log
        table = phase["model"]["encoder.embeddings.position.weight"]
        assert table.shape[0] == 128
        started = trained["model"]["encoder.embeddings.position.weight"]
        # two steps of training move each row a little from the copy it started as
        torch.testing.assert_close(table[64:], started, atol=0.02, rtol=0)
    else:
        assert phase["model_config"]["rope_theta"] == 160_000
        assert "rope-theta: 10000 in the checkpoint, 160000 now" in log
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # resuming at another length is refused in one line
        main.main(["--cp", str(short / "checkpoints" / "checkpoint.pt"), *LONGER])
    assert exit_info.value.code == 2
    assert "the run has seq-len = 64, the config 128; a resumed run keeps it (to start a new run from these " \
           "weights, add --switch-training)" in capsys.readouterr().err


def test_a_checkpoint_without_rope_theta_is_read_at_ropes_published_base(tmp_path):
    """Checkpoints saved before rope-theta was a key turned their angles at 10,000."""
    state = small_state()
    del state["model_config"]["rope_theta"]
    checkpoints.save(tmp_path / "old.pt", state)
    assert checkpoints.load(tmp_path / "old.pt")["model_config"]["rope_theta"] == 10_000


def test_resuming_at_another_rope_theta_is_refused(mlm_workdir, capsys):
    run_dir = main.run(main.load_config(None, ["--max-iters", "1"]), None, False)
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--cp", str(run_dir / "checkpoints" / "checkpoint.pt"), "--rope-theta", "160000"])
    assert exit_info.value.code == 2
    assert "rope-theta = 10000.0 in the checkpoint but 160000.0 from the config" in capsys.readouterr().err


class FillingFile(io.FileIO):
    """A file on a disk that fills up after `room` bytes."""
    room = 2000

    def write(self, data):
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def test_a_full_disk_is_one_line_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    checkpoints.save_latest(tmp_path, small_state(step=10), keep=3)
    monkeypatch.setattr(checkpoints, "open", lambda path, mode: FillingFile(path, mode), raising=False)
    with pytest.raises(UserError) as error:
        checkpoints.save_latest(tmp_path, small_state(step=20), keep=3)
    assert str(error.value) == f"no space left on device writing {tmp_path / 'checkpoint.pt'}"
    monkeypatch.undo()
    assert checkpoints.load(tmp_path / "checkpoint.pt")["step"] == 10
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_a_bit_flipped_in_a_saved_tensor_is_refused(tmp_path):
    moment = torch.arange(1000, dtype=torch.float32) + 0.25  # an Adam moment, findable in the file
    checkpoints.save(tmp_path / "c.pt", small_state(optimizer={"state": {0: {"exp_avg": moment}}, "param_groups": []}))
    data = bytearray((tmp_path / "c.pt").read_bytes())
    start = data.find(moment.numpy().tobytes())
    assert start >= 0
    data[start + 2001] ^= 0x10  # one bit of the exponent of one element
    (tmp_path / "c.pt").write_bytes(data)
    with pytest.raises(UserError, match="c.pt: a damaged checkpoint: its contents do not match the checksum"):
        checkpoints.load(tmp_path / "c.pt")


def damaged_copy(source: Path, target: Path, damage: str) -> Path:
    """The checkpoint at source, edited as a careless hand or tool would, with the checksum of what
    it holds then."""
    state = torch.load(source, map_location="cpu", weights_only=True)
    weights = state["model"]
    if damage == "a row cut":
        weights["encoder.embeddings.token.weight"] = weights["encoder.embeddings.token.weight"][:-1].clone()
    elif damage == "a weight deleted":
        del weights["encoder.layers.0.attention.out.weight"]
    else:
        state["step"] = str(state["step"])
    state["checksum"] = checkpoints.checksum(state)
    torch.save(state, target)
    return target


DAMAGES = {"a row cut": "encoder.embeddings.token.weight has shape [1999, 64], its model's is [2000, 64]",
           "a weight deleted": "encoder.layers.0.attention.out.weight",
           "the step a string": "step is a str"}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("script", ["train", "test", "fill_mask", "export_hf"])
def test_a_damaged_checkpoint_is_one_line_in_every_script(mlm_trained_run, mlm_workdir, capsys, damage, script):
    import export_hf
    import fill_mask
    path = damaged_copy(mlm_trained_run / "runs" / "run0" / "checkpoints" / "checkpoint.pt",
                        mlm_workdir / "damaged.pt", damage)
    commands = {"train": lambda: main.main(["--cp", str(path), "--max-iters", "50"]),
                "test": lambda: main.main(["--cp", str(path), "--test"]),
                "fill_mask": lambda: fill_mask.main(["--cp", str(path), "a [MASK] film"]),
                "export_hf": lambda: export_hf.main(["--cp", str(path), "-o", "exported"])}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        commands[script]()
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and DAMAGES[damage] in lines[0], lines
    assert sorted(path.name for path in mlm_workdir.iterdir()) == ["config.ini", "damaged.pt", "datasets", "vocab"]


def test_random_states_keep_the_tasks_own_generator_and_an_earlier_layouts_mask_state_is_left_by_a_task_without_one():
    """A task that masks saves and restores its generator with the run's RNG; a checkpoint of any task
    written before tasks owned their generators holds a "mask" state too, which a fine-tuning task
    (random_generator None) leaves alone on resume."""
    generator = torch.Generator().manual_seed(7)
    saved = checkpoints.random_states(generator)
    expected = torch.rand(3, generator=generator)
    checkpoints.restore_random_states(saved, generator)
    assert torch.equal(torch.rand(3, generator=generator), expected)
    assert "mask" not in checkpoints.random_states(None)
    torch.manual_seed(3)
    earlier = {"torch": torch.get_rng_state(), "mask": torch.Generator().manual_seed(1).get_state()}
    drawn = torch.rand(2)
    checkpoints.restore_random_states(earlier, None)
    assert torch.equal(torch.rand(2), drawn)
