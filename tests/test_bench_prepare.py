"""scripts/bench_prepare.py end to end on a small corpus: every step runs and the three tables come out
(the numbers themselves are for a quiet machine)."""
import re

import bench_prepare


def test_the_preparation_benchmark_runs_every_step_and_prints_its_tables(imdb_corpus, vocab_dir, tmp_path, capsys):
    corpus = tmp_path / "reviews.txt"
    corpus.write_text("\n".join(imdb_corpus.read_text(encoding="utf-8").splitlines()[:200]) + "\n", encoding="utf-8")
    bench_prepare.main(["-i", str(corpus), "-v", str(vocab_dir), "-n", "2", "--prefix-fraction", "0.5",
                        "--workdir", str(tmp_path / "work")])
    out = capsys.readouterr().out
    row = r"^\| (tokens/s, tokenize -n 1|loaded shard bytes/token \(ids\)) \| ([\d,.]+) \|"
    comparison = dict(re.findall(row, out, re.M))
    assert float(comparison["tokens/s, tokenize -n 1"].replace(",", "")) > 0
    assert 2 <= float(comparison["loaded shard bytes/token (ids)"]) < 2.2  # uint16 ids and lengths
    steps = re.findall(r"^\| ours: (\S+)", out, re.M)
    assert {"tokenize_text", "prepare_mlm_fixed_len_dataset_from_ids", "prepare_mlm_dataset"} <= set(steps)
