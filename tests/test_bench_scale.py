"""scripts/bench_scale.py: runs, resumes and reports, at a tiny size (its numbers are measured by hand)."""
import pytest

import bench_scale


def test_the_scale_benchmark_trains_resumes_and_reports_a_table(mlm_base_dir, capsys):
    bench_scale.main(["--base-dir", str(mlm_base_dir), "--sizes", "tiny", "--seq-len", "64", "--steps", "2",
                      "--dataset-pattern", "train_imdb_64_*.msgpack", "--val-dataset-pattern", "val_imdb_64_*.msgpack"])
    table = capsys.readouterr().out
    assert "| tiny (2 x 64) |" in table and "| yes, bit for bit |" in table, table


def test_fewer_than_two_steps_is_one_line(mlm_base_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_scale.main(["--base-dir", str(mlm_base_dir), "--steps", "1"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: --steps 1: expected at least 2 (a resume needs a step before it)\n"
