"""scripts/bench_infer.py: a classifier through our model, its ONNX graph and transformers' pipeline,
and an embedding model through ours and sentence-transformers, a row per arm, batch size and thread
count (the speeds themselves are measured, not tested)."""
import re

import checkpoints
import bench_infer
import export_hf
from model import BertForEmbedding, BertForSequenceClassification, ModelConfig
from test_classify import untrained_sst2_checkpoint


def test_the_table_has_a_row_per_arm_batch_and_threads_with_the_first_arm_as_the_unit(vocab, tmp_path, capsys):
    classifier = untrained_sst2_checkpoint(tmp_path / "sst2.pt", vocab)
    export_hf.export(classifier, tmp_path / "hf-sst2", onnx=True)
    config = ModelConfig(vocab_size=vocab.size, max_len=64, d_model=64, heads=2, n_layer=2, d_ff=128)
    checkpoints.save(tmp_path / "embed.pt", checkpoints.make_state(
        task="embed", weights=BertForEmbedding(config).state_dict(), model_config=config, vocab=vocab,
        config={"seq-len": 64}))
    export_hf.export(tmp_path / "embed.pt", tmp_path / "hf-embed")
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("a gorgeous , witty , seductive movie .\nit drags .\n" * 20, encoding="utf-8")
    bench_infer.main(["-i", str(sentences), "--cp", str(classifier), str(tmp_path / "hf-sst2"),
                      str(tmp_path / "embed.pt"), "--hf", str(tmp_path / "hf-sst2"), str(tmp_path / "hf-embed"),
                      "--repeats", "2", "--batch-size", "1", "8", "--threads", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("40 sentences of")
    rows = [line.split(" | ") for line in lines if re.match(r"\| /", line)]
    assert [(row[1], row[2], row[3]) for row in rows[::2]] == [
        ("PyTorch eager", "sst2", "1"), ("onnxruntime (model.onnx)", "sst2", "1"), ("PyTorch eager", "embed", "1"),
        ("transformers pipeline", "sst2", "1"), ("sentence-transformers", "embed", "1")]
    assert [row[3] for row in rows[1::2]] == ["8"] * 5 and all(row[4] == "1" for row in rows)
    built = sum(parameter.numel() for parameter in BertForSequenceClassification(
        ModelConfig(vocab_size=vocab.size, max_len=64, d_model=32, heads=2, n_layer=1, d_ff=64)).parameters())
    assert rows[0][5] == f"{built * 4 / 2 ** 20:.1f}" and rows[0][-1] == "1.00x |" and rows[1][-1] == "1.00x |"
