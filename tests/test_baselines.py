"""The comparison scripts run and measure something real: the bag-of-words baseline and bench.py."""
import bench
import bow_baseline
import make_demo
import torch


def test_bag_of_words_baseline_learns_sentiment(tmp_path, rotten_tomatoes, capsys):
    make_demo.write_sst2(tmp_path, rotten_tomatoes, seed=123)
    result = bow_baseline.main(["--datasets", str(tmp_path)])
    assert result["features"] > 1000
    assert result["val_accuracy"] > 0.6 and result["test_accuracy"] > 0.6  # balanced classes: chance is 0.5
    assert "bag-of-words logistic regression" in capsys.readouterr().out


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
