"""embed with a teacher: its transfer-data is training data too, so a resumed run must find those files
unchanged (task.files_record, run_start.check_same_files), as classify's own files (test_classify_files.py)."""
import hashlib

import checkpoints
import main
from conftest import one_error_line
from test_embed_task import STUDENT, embed_workdir, taught_base  # noqa: F401 (taught_base: a fixture)


def test_a_taught_students_resume_whose_transfer_data_changed_is_one_line(taught_base, imdb_reviews,  # noqa: F811
                                                                          tmp_path, monkeypatch, capsys,
                                                                          keep_signal_handlers):
    transfer = tmp_path / "reviews.txt"
    transfer.write_text("\n".join(imdb_reviews[:20]) + "\n", encoding="utf-8")
    monkeypatch.chdir(embed_workdir(taught_base, tmp_path / "work", max_iters=2, warmup_iters=1, lr_decay_iters=4,
                                    val_interval=2, val_dataset_percentage=0.2, transfer_data=transfer, **STUDENT))
    latest = main.run(main.load_config(None, []), None, False) / "checkpoints" / "checkpoint.pt"
    then = hashlib.sha256(transfer.read_bytes()).hexdigest()
    assert checkpoints.load(latest)["data"] == {"transfer-data": {str(transfer): then}}
    transfer.write_text("\n".join(imdb_reviews[:10]) + "\n", encoding="utf-8")
    now = hashlib.sha256(transfer.read_bytes()).hexdigest()
    line = one_error_line(capsys, lambda: main.main(["--cp", str(latest), "--max-iters", "4"]))
    assert line == (f"error: {latest}: transfer-data {transfer} has changed since the run began (sha256 {then[:12]}... "
                    f"then, {now[:12]}... now); a resumed run keeps its data (to start a new run from these weights "
                    f"on the new data, add --switch-training)")
