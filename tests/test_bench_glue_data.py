"""scripts/bench_glue_data.py end to end at a tiny size: MNLI's layout written, a run's reads timed."""
import re

import pyarrow.parquet as pq

import bench_glue_data


def test_the_glue_data_benchmark_times_each_split_and_the_first_step(imdb_corpus, vocab_dir, tmp_path, capsys):
    bench_glue_data.main(["-i", str(imdb_corpus), "-v", str(vocab_dir), "--pairs", "64", "--workdir", str(tmp_path)])
    rows = re.findall(r"^\| 64 \|(.*)\|$", capsys.readouterr().out, re.M)
    train, validation, first_step, whole, peak = (float(cell.replace(",", "")) for cell in rows[0].split("|"))
    assert 0 < train and 0 <= validation and 0 < first_step <= whole and peak > 0
    mnli = tmp_path / "mnli-64" / "datasets" / "mnli"
    columns = pq.read_table(mnli / "train-00000-of-00001.parquet").column_names
    assert columns == ["premise", "hypothesis", "label", "idx"]
    assert len(pq.read_table(mnli / "validation_matched-00000-of-00001.parquet")) == 32
