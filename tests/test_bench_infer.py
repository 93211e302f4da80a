"""scripts/bench_infer.py: a classifier and an embedding model side by side, one table row each (the
speeds themselves are measured, not tested)."""
import re

import checkpoints
import bench_infer
from model import BertForEmbedding, BertForSequenceClassification, ModelConfig
from test_classify import untrained_sst2_checkpoint


def test_the_table_has_a_row_per_checkpoint_with_its_size_and_the_first_as_the_unit(vocab, tmp_path, capsys):
    classifier = untrained_sst2_checkpoint(tmp_path / "sst2.pt", vocab)
    config = ModelConfig(vocab_size=vocab.size, max_len=64, d_model=64, heads=2, n_layer=2, d_ff=128)
    embedder = BertForEmbedding(config)
    checkpoints.save(tmp_path / "embed.pt", checkpoints.make_state(
        task="embed", weights=embedder.state_dict(), model_config=config, vocab=vocab, config={"seq-len": 64}))
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("a gorgeous , witty , seductive movie .\nit drags .\n" * 20, encoding="utf-8")
    bench_infer.main(["-i", str(sentences), "--cp", str(classifier), str(tmp_path / "embed.pt"), "--repeats", "2",
                      "--batch-size", "8"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("40 sentences of") and "batch 8" in lines[0]
    rows = [line.split(" | ") for line in lines if re.match(r"\| /", line)]
    assert [row[1:3] for row in rows] == [["1 x 32", "sst2"], ["2 x 64", "embed"]]
    built = sum(parameter.numel() for parameter in BertForSequenceClassification(
        ModelConfig(vocab_size=vocab.size, max_len=64, d_model=32, heads=2, n_layer=1, d_ff=64)).parameters())
    assert rows[0][3] == f"{built / 1e6:.2f}M" and rows[0][-1] == "1.00x |"
