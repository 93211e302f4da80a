"""The comparison scripts run and measure something real: the bag-of-words baseline, bench.py,
bench_finetune.py and bench_pretrain.py (transformers' pre-training recipe)."""
import shutil

import bench
import bench_finetune
from tasks import glue_data
from errors import UserError
import bow_baseline
import make_demo
import pytest
import torch


def test_bag_of_words_baseline_learns_sentiment(tmp_path, rotten_tomatoes, capsys):
    make_demo.write_sst2(tmp_path, rotten_tomatoes, seed=123)
    result = bow_baseline.main(["--datasets", str(tmp_path)])
    assert result["features"] > 1000
    assert result["val_accuracy"] > 0.6 and result["test_accuracy"] > 0.6  # balanced classes: chance is 0.5
    assert "bag-of-words logistic regression" in capsys.readouterr().out


def test_bag_of_words_baseline_refuses_hidden_test_labels(tmp_path, rotten_tomatoes, capsys):
    make_demo.write_sst2(tmp_path, rotten_tomatoes, seed=123)
    for path in tmp_path.glob("*.parquet"):
        path.unlink()  # only the GLUE TSV layout is left, whose test.tsv has no labels
    with pytest.raises(SystemExit) as exit_info:
        bow_baseline.main(["--datasets", str(tmp_path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'SST-2' / 'test.tsv'}: the test labels are hidden; "
                                       "use the parquet layout to score test\n")


def test_collator_masking_matches_the_reference_rule():
    ids = torch.randint(1000, bench.VOCAB_SIZE, (64, 128))
    ids[:, 0] = 101
    inputs, labels = bench.collator_masking(ids, torch.Generator().manual_seed(0))
    picked = labels != -100
    assert abs(picked.float().mean().item() - 0.15) < 0.01
    assert not picked[:, 0].any()  # [CLS] is never picked
    assert abs((inputs[picked] == bench.MASK_ID).float().mean().item() - 0.8) < 0.03
    assert torch.equal(labels[picked], ids[picked])


def test_benchmark_times_both_models():
    result = bench.compare("small", batch_size=2, steps=1, rounds=1, device=torch.device("cpu"),
                           dtype=torch.float32)
    assert set(result) == {"ours", "transformers"} and all(rate > 0 for rate in result.values())


def test_useful_flops_count_the_head_on_masked_slots_only():
    config = bench.mlm_config("small")
    all_positions = bench.flops_per_token(config, 128, 1.0) * 4 * 128
    encoder_only = bench.flops_per_token(config, 128, 0.0) * 4 * 128
    assert encoder_only < bench.useful_flops_per_step("small", 4) < all_positions


def test_finetuning_benchmark_runs_every_arm_on_the_same_sentences(vocab_dir, rotten_tomatoes, tmp_path):
    shutil.copytree(vocab_dir, tmp_path / "vocab")
    make_demo.write_sst2(tmp_path / "datasets", rotten_tomatoes, seed=123)
    epoch, vocab = bench.sst2_epoch(batch_size=4, demo=tmp_path)
    first = epoch[0]
    theirs = bench.padded_to(first, bench.SEQ_LEN, vocab.pad_id)
    width = first["input_ids"].shape[1]
    assert theirs["input_ids"].shape == (4, bench.SEQ_LEN)
    assert (theirs["input_ids"][:, :width] == first["input_ids"]).all()
    assert (theirs["input_ids"][:, width:] == vocab.pad_id).all()
    assert theirs["attention_mask"].sum() == first["attention_mask"].sum()

    measured = epoch[:6]
    shuffled = bench.shuffled_dynamic_batches(measured, vocab)
    def sentences(batches):
        return sorted((tuple(ids[real.astype(bool)]), int(label)) for batch in batches
                      for ids, real, label in zip(batch["input_ids"], batch["attention_mask"], batch["labels"]))
    assert sentences(shuffled) == sentences(measured) and sentences(shuffled) != sentences(measured[:5])
    for batch in shuffled:  # each padded to its own longest sentence
        assert batch["attention_mask"].sum(1).max() == batch["input_ids"].shape[1]
        assert (batch["input_ids"][batch["attention_mask"] == 0] == vocab.pad_id).all()

    result = bench.compare_finetuning("small", epoch, vocab, steps=1, rounds=2, device=torch.device("cpu"),
                                      dtype=torch.float32)
    assert set(result) == set(bench.FINETUNING_ARMS) and all(arm["rate"] > 0 for arm in result.values())
    assert result["transformers, padded to 128"]["width"] == bench.SEQ_LEN
    assert result["ours"]["width"] == result["transformers, our batches"]["width"] < 64

    on_the_cpu, on_a_gpu = (bench.finetuning_batches(measured, vocab, device) for device in ("cpu", "cuda"))
    for mine, exact, compiled, rounded in zip(measured, on_the_cpu["ours"], on_the_cpu["ours, compiled"],
                                              on_a_gpu["ours, compiled"]):
        width = mine["input_ids"].shape[1]  # on the CPU the longest exactly, compiled or not; on a GPU rounded up to 8
        assert width == mine["attention_mask"].sum(1).max()
        assert exact["input_ids"].shape[1] == compiled["input_ids"].shape[1] == width
        assert rounded["input_ids"].shape[1] == -(-width // 8) * 8 and rounded["attention_mask"].dtype == bool
        assert (rounded["input_ids"][:, :width] == mine["input_ids"]).all()

    floor = bench.kernel_floor("small", measured, vocab, torch.float32)
    assert set(floor) == {"GEMMs", "attention", "AdamW"} and all(seconds > 0 for seconds in floor.values())


def test_each_round_starts_one_arm_later_so_none_always_runs_first():
    arms = ["ours", "ours, compiled", "transformers"]
    orders = [bench.rotated(arms, number) for number in range(4)]
    assert orders == [arms, arms[1:] + arms[:1], arms[2:] + arms[:2], arms]
    assert {order[0] for order in orders[:3]} == set(arms)


def test_finetuning_arms_put_ours_first_and_compiled_only_when_asked():
    assert list(bench.finetuning_arms(False)) == list(bench.FINETUNING_ARMS)
    assert list(bench.finetuning_arms(True))[:2] == ["ours", "ours, compiled"]
    assert set(bench.finetuning_arms(True)) - set(bench.FINETUNING_ARMS) == {"ours, compiled"}


def test_floor_table_is_the_sentences_over_the_kernels_seconds_against_three_times_theirs(capsys):
    bench.print_floor_table({"medium": (100.0, {"GEMMs": 1.0, "attention": 0.5, "AdamW": 0.5})}, 768)
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row == "| 4 x 256 | 1.000 | 0.500 | 0.500 | 384.0 | 300.0 |"


def test_peak_memory_is_measured_in_a_fresh_process():
    mib = bench.peak_memory_mib("ours", "small", batch_size=2, steps=1, device=torch.device("cpu"))
    assert 10 < mib < 4000  # at least the 15 MiB token embedding with its gradient and AdamW state


def test_same_review_pairs_label_whether_two_sentences_come_from_one_review(imdb_reviews, tmp_path, monkeypatch):
    monkeypatch.setattr(bench_finetune, "PAIRS_PER_SPLIT", {"train": 300, "validation": 100, "test": 100})
    (tmp_path / "imdb.txt").write_text("\n".join(imdb_reviews) + "\n", encoding="utf-8")
    bench_finetune.same_review_pairs(tmp_path / "imdb.txt", tmp_path / "glue")
    review_of = {}
    for number, review in enumerate(imdb_reviews):
        for sentence in bench_finetune.review_sentences(review):
            review_of.setdefault(sentence, set()).add(number)
    sentences = {}
    for split, count in (("train", 300), ("validation", 100), ("test", 100)):
        pairs = glue_data.read_split(tmp_path / "glue", "mrpc", split)
        assert len(pairs.first) == count and 0.35 < pairs.labels.mean() < 0.65
        for a, b, label in zip(pairs.first, pairs.second, pairs.labels):
            assert a != b and bool(review_of[a] & review_of[b]) == bool(label)
        sentences[split] = set(pairs.first) | set(pairs.second)
    shared = sentences["test"] & (sentences["train"] | sentences["validation"])
    assert len(shared) <= 2  # the splits draw on disjoint reviews (a stock sentence may recur)

    monkeypatch.setattr(bench_finetune, "PAIRS_PER_SPLIT", {"train": 5000})
    with pytest.raises(UserError, match="reviews with two sentences of 5-40 words; the pair task needs 10,000$"):
        bench_finetune.same_review_pairs(tmp_path / "imdb.txt", tmp_path / "glue2")


def test_finetuning_side_by_side_fills_the_table_for_both_trainers(mlm_trained_run, rotten_tomatoes, imdb_reviews,
                                                                    tmp_path, capsys, monkeypatch):
    shutil.copytree(mlm_trained_run / "vocab", tmp_path / "vocab")  # the runs it makes land in tmp_path/runs
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "imdb.txt").write_text("\n".join(imdb_reviews) + "\n", encoding="utf-8")
    monkeypatch.setattr(bench_finetune, "PAIRS_PER_SPLIT", {"train": 64, "validation": 32, "test": 32})
    make_demo.write_sst2(tmp_path / "datasets", rotten_tomatoes, seed=123)
    checkpoint = mlm_trained_run / "runs" / "run0" / "checkpoints" / "checkpoint.pt"
    bench_finetune.main(["--cp", str(checkpoint), "--base-dir", str(tmp_path), "--seeds", "1", "--tasks", "mrpc",
                         "--", "--seq-len", "64", "--max-iters", "2", "--val-interval", "2", "--warmup-iters", "1",
                         "--lr-decay-iters", "2", "--batch-size", "8", "--dtype", "float32"])
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("| mrpc | this program | ") for line in lines)
    assert any(line.startswith("| mrpc | transformers Trainer | ") for line in lines)
    assert any(line.startswith("mrpc: difference ") and "x our time" in line for line in lines)


def test_transformers_recipe_pretrains_bert_and_writes_a_checkpoint_of_ours(mlm_workdir, tmp_path, capsys):
    """run_mlm.py's recipe on the config's shards: BertForMaskedLM at the config's size, trained for the
    steps asked, saved for transformers and converted into an MLM checkpoint of BERT's layout."""
    import bench_pretrain
    import checkpoints
    from ini import load_config
    from shards import read_shard
    config = load_config(mlm_workdir / "config.ini", [])
    rows = bench_pretrain.training_rows(config)
    shard_rows = sum(len(read_shard(path)) for path in config.datasets_path.glob("train_*"))
    assert len(rows) == shard_rows and rows[0]["input_ids"][0] == 2  # every sample, from [CLS] (id 2 here)

    out = tmp_path / "anchor"
    bench_pretrain.main(["--config", str(mlm_workdir / "config.ini"), "--max-steps", "6", "--learning-rate", "1e-3",
                         "-o", str(out)])
    saved = checkpoints.load(out / "checkpoint.pt")
    architecture = saved["model_config"]
    assert saved["task"] == "mlm" and saved["imported_from"] == str(out / "hf")
    assert (architecture["norm"], architecture["position"], architecture["d_model"], architecture["n_layer"]) == (
        "postln", "learned", config.d_model, config.n_layer)
    assert (out / "hf" / "config.json").is_file() and (out / "hf" / "tokenizer.json").is_file()
    assert "6 steps x 8 x" in capsys.readouterr().out

    with pytest.raises(SystemExit) as exit_info:
        bench_pretrain.main(["--config", str(mlm_workdir / "config.ini"), "--max-steps", "6", "-o", str(out)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: {out} is not empty: choose a new -o directory\n"


def test_mfu_is_against_the_peak_of_the_dtype_the_step_runs_in(capsys):
    """A CPU without bf16 runs the step in float32: its MFU is over the float32 peak, and no bf16 column."""
    rates = {"small": {"ours": 1000.0, "transformers": 500.0}}
    peak = bench.useful_flops_per_step("small", 4) * 1000.0 / (4 * bench.SEQ_LEN) * 2  # ours at half the peak
    bench.print_mfu_table(["small"], rates, 4, torch.float32, peak)
    table = capsys.readouterr().out
    assert "ours MFU float32" in table and "bf16" not in table
    assert table.strip().splitlines()[-1].split(" | ")[3] == "50%"
