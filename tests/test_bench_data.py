"""scripts/bench_data.py end to end on a small corpus: its three tables, a row per size, and a shard switch
measured where the corpus (twice the input) spans 16 shards (the numbers themselves are for a quiet machine)."""
import re

import pytest

import bench_data
import bench_glue_data


def test_the_data_benchmark_prints_its_tables_with_a_shard_switch(imdb_corpus, vocab_dir, tmp_path, capsys):
    bench_data.main(["-i", str(imdb_corpus), "-v", str(vocab_dir), "--lines", "250", "--scales", "2",
                     "--steps", "12", "--loader-batches", "20", "--workdir", str(tmp_path)])
    tables = capsys.readouterr().out.split("\n\n")
    preparation, training, loader = (re.findall(r"^\| (\dx) \|(.*)\|$", table, re.M) for table in tables[-3:])
    assert [size for size, _ in preparation] == [size for size, _ in training] == ["2x"]
    assert "nan" not in preparation[0][1]
    shards, _, _, slowest_step_at_a_switch, *_, loop_against_alone = training[0][1].split("|")
    assert int(shards) == 16  # 8 for each copy of the input
    assert float(slowest_step_at_a_switch) > 0
    assert float(loop_against_alone) > 0
    tokens_per_sec, processes_an_h100_needs = (float(cell.replace(",", "")) for cell in loader[0][1].split("|"))
    assert tokens_per_sec > 0 and processes_an_h100_needs > 0


def test_a_missing_corpus_or_vocabulary_is_one_line_and_exit_2(imdb_corpus, vocab_dir, tmp_path, capsys):
    missing_corpus = (bench_data.main, ["-i", str(tmp_path / "none.txt"), "-v", str(vocab_dir)], "none.txt")
    missing_vocab = (bench_glue_data.main, ["-i", str(imdb_corpus), "-v", str(tmp_path)], str(tmp_path))
    for main, arguments, named in (missing_corpus, missing_vocab):
        with pytest.raises(SystemExit) as exit_info:
            main(arguments)
        errors = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(errors) == 1 and named in errors[0]


@pytest.mark.parametrize("scales", [["0"], ["1", "-2"]])
def test_a_corpus_size_below_1_is_named_as_scales(imdb_corpus, vocab_dir, tmp_path, capsys, scales):
    with pytest.raises(SystemExit) as exit_info:
        bench_data.main(["-i", str(imdb_corpus), "-v", str(vocab_dir), "--scales", *scales, "--workdir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: --scales {' '.join(scales)}: expected corpus sizes of at least 1\n"
    assert not any(tmp_path.iterdir())
