"""Sentence embeddings (task-type = embed): the contrastive and similarity losses against references,
learning, exact resume, two processes, scripts/embed.py, and the directories sentence-transformers
reads both ways (our export, and all-MiniLM-L6-v2 as published). The data layouts and their one-line
errors: test_embed_data.py; the retrieval scores: test_retrieval_metrics.py."""
import contextlib
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

import checkpoints
import embed
from tasks import embed_data
import export_hf
import import_hf
import main
import make_embed_demo
from tasks import teacher
from conftest import assert_resumes_exactly_mid_epoch, one_error_line, write_mlm_config
from tasks.embed_task import contrastive_loss, embed_texts, similarity_loss
from errors import UserError
from model import BertForEmbedding
from test_distributed import run_main
from test_embed_data import write_jsonl
from test_vocab import published_uncased_model

EMBED = {"task_type": "embed", "seq_len": 64, "batch_size": 16, "learning_rate": 1e-3, "warmup_iters": 5,
         "pooling": "mean", "length_grouping": False, "dataset_pattern": "", "val_dataset_pattern": "",
         "test_dataset_pattern": ""}


# ----------------------------------------------------------------------------- the losses

def test_the_contrastive_loss_is_infonce_over_positives_and_hard_negatives():
    torch.manual_seed(0)
    anchors, candidates = (F.normalize(torch.randn(count, 8), dim=-1) for count in (3, 6))
    loss, right = contrastive_loss(anchors, candidates, 0.05)
    expected = 0.0
    for i in range(3):  # -log(exp(s_ii / t) / sum_j exp(s_ij / t)), the hard negatives among the j
        similarities = [float(anchors[i] @ candidates[j]) / 0.05 for j in range(6)]
        expected -= similarities[i] - math.log(sum(math.exp(s) for s in similarities))
    assert float(loss) == pytest.approx(expected / 3, rel=1e-5)
    assert int(right) == sum(int((anchors[i] @ candidates.T).argmax()) == i for i in range(3))


def test_the_similarity_loss_is_the_squared_error_of_every_two_texts_cosines():
    torch.manual_seed(0)
    student, teacher = F.normalize(torch.randn(5, 3), dim=-1), F.normalize(torch.randn(5, 8), dim=-1)
    loss, statistics = similarity_loss(student, teacher)
    pairs = [(i, j) for i in range(5) for j in range(5) if i != j]
    expected = sum(float(student[i] @ student[j] - teacher[i] @ teacher[j]) ** 2 for i, j in pairs) / len(pairs)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    nearest = [max((j for j in range(5) if j != i), key=lambda j, i=i: float(vectors[i] @ vectors[j]))
               for vectors in (student, teacher) for i in range(5)]
    assert statistics.tolist() == [5, sum(a == b for a, b in zip(nearest[:5], nearest[5:]))]
    assert float(similarity_loss(teacher, teacher)[0]) < 1e-12


# ----------------------------------------------------------------------------- training

@pytest.fixture(scope="module")
def embed_base(imdb_corpus, vocab_dir, tmp_path_factory):
    """vocab/ and datasets/embed made up from the demo reviews."""
    base = tmp_path_factory.mktemp("embed_base")
    shutil.copytree(vocab_dir, base / "vocab")
    make_embed_demo.make_embed_demo(imdb_corpus, base / "datasets" / "embed", seed=123, limit=600)
    return base


def embed_workdir(base: Path, directory: Path, **settings) -> Path:
    shutil.copytree(base, directory)
    write_mlm_config(directory, **EMBED | settings)
    return directory


def test_the_model_learns_to_find_passages_tests_and_embeds_a_file(embed_base, tmp_path, monkeypatch,
                                                                    keep_signal_handlers, capsys):
    """From random weights, whose mean pooling already scores word overlap, 120 steps find far more
    of the passages the test sentences were cut from, and score the made-up similarity better."""
    monkeypatch.chdir(embed_workdir(embed_base, tmp_path / "work", max_iters=120, lr_decay_iters=120,
                                    val_interval=120))
    config = main.load_config(None, [])
    task = main.make_task(config)
    torch.manual_seed(config.seed)
    untrained = task.evaluate(task.build_model(), task.eval_batches("test", None), contextlib.nullcontext())
    run_dir = main.run(config, None, False)
    best = run_dir / "checkpoints" / "best.pt"
    assert checkpoints.load(best)["task"] == "embed"
    main.main(["--cp", str(best), "--test"])
    scores = json.loads(next(run_dir.glob("test_metrics_step*.json")).read_text())
    assert {"test_loss", "test_pearson", "test_recall@1", "test_mrr@10", "test_ndcg@10"} <= scores.keys()
    assert scores["test_recall@10"] > untrained["recall@10"] + 0.08  # about 0.15 -> 0.3 (59 queries)
    assert scores["test_spearman"] > untrained["spearman"] + 0.03  # about 0.82 -> 0.9
    texts = tmp_path / "texts.txt"
    texts.write_text("a dull horror film\n\nthe acting was great\nI loved the music\n")
    capsys.readouterr()
    embed.main(["--cp", str(best), "-i", str(texts), "-o", str(tmp_path / "texts.npy"), "--query", "great acting",
                "-k", "2"])
    vectors = np.load(tmp_path / "texts.npy")
    assert vectors.shape == (3, 64) and np.allclose((vectors ** 2).sum(1), 1, atol=1e-5)  # blank lines skipped
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "query: great acting" and len(lines) == 3
    model, vocab, _ = checkpoints.restore_model(best, {"embed": BertForEmbedding})
    query = embed_texts(model, vocab, ["great acting"], 64)[0]
    cosines = vectors @ query
    shown = [line.strip().split("  ", 1) for line in lines[1:]]
    rows = [["a dull horror film", "the acting was great", "I loved the music"].index(text) for _, text in shown]
    assert rows == np.argsort(-cosines)[:2].tolist()
    assert [float(cosine) for cosine, _ in shown] == pytest.approx(cosines[rows], abs=1e-4)
    embed.main(["--cp", str(best), "-i", str(texts), "--embeddings", str(tmp_path / "texts.npy"), "--query",
                "great acting", "-k", "2"])  # the file's embeddings read back, not computed again
    assert capsys.readouterr().out.splitlines() == lines
    message = one_error_line(capsys, lambda: embed.main(["--cp", str(best), "-i", str(texts), "--embeddings",
                                                         str(texts), "--query", "x"]))
    assert message == f"error: --embeddings {texts}: not a .npy array (this script's -o writes one)"


def test_an_output_embed_py_cannot_write_is_one_line_before_the_model_is_read(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("a dull horror film\n")
    never_read = tmp_path / "no.pt"
    for output, message in ((tmp_path / "missing" / "x.npy", f"the folder {tmp_path / 'missing'} does not exist"),
                            (tmp_path, "a directory; -o takes the .npy file to write")):
        arguments = ["--cp", str(never_read), "-i", str(texts), "-o", str(output)]
        line = one_error_line(capsys, lambda arguments=arguments: embed.main(arguments))
        assert line == f"error: -o {output}: {message}"


def test_stored_embeddings_in_an_npz_archive_are_one_line(tmp_path):
    np.savez(tmp_path / "texts.npz", vectors=np.zeros((3, 64), dtype=np.float32))
    with pytest.raises(UserError, match=re.escape(f"--embeddings {tmp_path / 'texts.npz'}: a .npz archive, not a "
                                                  f".npy array (this script's -o writes one)")):
        embed.stored_embeddings(tmp_path / "texts.npz", 3, 64)


def test_a_run_resumes_exactly_mid_epoch(embed_base, tmp_path, monkeypatch, keep_signal_handlers):
    settings = {"lr_decay_iters": 8, "val_interval": 4, "val_dataset_percentage": 0.2}
    assert_resumes_exactly_mid_epoch(lambda name: embed_workdir(embed_base, tmp_path / name, **settings),
                                     monkeypatch, steps=8)


def test_two_processes_share_their_negatives_and_embed_every_text_once(embed_base, tmp_path, monkeypatch,
                                                                       keep_signal_handlers):
    """Two processes of batch 8 train as one of batch 16 (dropout off): each anchor meets all 16 pairs'
    candidates, through the gather; validation embeds each text once, in whichever process."""
    settings = {"max_iters": 3, "val_interval": 3, "dropout": 0.0}
    workdir = embed_workdir(embed_base, tmp_path / "ddp", batch_size=8, **settings)
    result = run_main(workdir)
    assert result.returncode == 0, result.stderr
    log = (workdir / "runs" / "run0" / "logs" / "log.txt").read_text(encoding="utf-8")
    pairs = len(pq.read_table(workdir / "datasets" / "embed" / "stsb" / "validation-00000-of-00001.parquet"))
    queries = (workdir / "datasets" / "embed" / "retrieval" / "qrels" / "dev.tsv").read_text().count("\n") - 1
    assert re.search(rf"val pairs {pairs}\b", log) and re.search(rf"val queries {queries}\b", log)
    monkeypatch.chdir(embed_workdir(embed_base, tmp_path / "one", batch_size=16, **settings))
    main.main([])
    two, one = (checkpoints.load(path / "runs" / "run0" / "checkpoints" / "checkpoint.pt")
                for path in (workdir, tmp_path / "one"))
    for name, tensor in one["model"].items():
        torch.testing.assert_close(two["model"][name], tensor, rtol=0, atol=2e-5, msg=name)


def test_hard_negatives_are_candidates_for_every_anchor(embed_base, tmp_path, monkeypatch, keep_signal_handlers):
    workdir = embed_workdir(embed_base, tmp_path / "negatives", max_iters=2, val_interval=2,
                            val_dataset_percentage=0.2)
    train = workdir / "datasets" / "embed" / "train.jsonl"
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    write_jsonl(train, [row | {"negative": rows[number - 1]["positive"]} for number, row in enumerate(rows)])
    monkeypatch.chdir(workdir)
    config = main.load_config(None, [])
    task = main.make_task(config)
    _, batch = next(task.train_batches(None))
    assert batch["input_ids"].shape[0] == 3 * 16  # anchors, positives, negatives
    model = task.build_model().eval()  # no dropout: the two computations see the same embeddings
    loss, statistics = task.loss(model, {name: torch.from_numpy(value) for name, value in batch.items()})
    anchors, candidates = (model(torch.from_numpy(batch["input_ids"][part]), torch.from_numpy(
        batch["attention_mask"][part])) for part in (slice(0, 16), slice(16, 48)))
    expected, _ = contrastive_loss(anchors, candidates, 0.05)
    assert int(statistics[0]) == 16 and float(loss) == pytest.approx(float(expected), rel=1e-4)
    run_dir = main.run(config, None, False)
    assert checkpoints.load(run_dir / "checkpoints" / "checkpoint.pt")["step"] == 2


def test_a_split_without_scored_pairs_or_retrieval_is_one_line(embed_base, tmp_path, monkeypatch, capsys):
    workdir = embed_workdir(embed_base, tmp_path / "none")
    shutil.rmtree(workdir / "datasets" / "embed" / "stsb")
    (workdir / "datasets" / "embed" / "retrieval" / "qrels" / "dev.tsv").unlink()
    monkeypatch.chdir(workdir)
    message = one_error_line(capsys, lambda: main.main(["--max-iters", "2"]))
    assert "no embed validation split: expected scored pairs in STS-B's layout" in message


# ----------------------------------------------------------------------------- sentence-transformers

@pytest.mark.parametrize("architecture", [["--norm", "postln", "--position", "learned"],
                                          ["--norm", "preln", "--position", "rope", "--pooling", "cls"]])
def test_the_export_is_a_sentence_transformers_model_giving_our_embeddings(embed_base, tmp_path, monkeypatch,
                                                                           keep_signal_handlers, architecture):
    import sentence_transformers
    monkeypatch.chdir(embed_workdir(embed_base, tmp_path / "work", val_dataset_percentage=0.2))
    run_dir = main.run(main.load_config(None, ["--max-iters", "4", "--val-interval", "4", *architecture]), None, False)
    path = run_dir / "checkpoints" / "checkpoint.pt"
    export_hf.main(["--cp", str(path), "-o", str(tmp_path / "hf")])
    native = architecture[1] == "postln"
    loaded = sentence_transformers.SentenceTransformer(str(tmp_path / "hf"), device="cpu", trust_remote_code=not native)
    texts = ["A fine western from 1959.", "The acting was wooden and the plot made no sense at all."]
    model, vocab, _ = checkpoints.restore_model(path, {"embed": BertForEmbedding})
    np.testing.assert_allclose(loaded.encode(texts), embed_texts(model, vocab, texts, 64), atol=1e-5)
    export_hf.main(["--cp", str(path), "-o", str(tmp_path / "hf"), "--force"])  # an export with its folders
    import_hf.main(["-i", str(tmp_path / "hf"), "-o", str(tmp_path / "back.pt")])
    back = checkpoints.load(tmp_path / "back.pt")
    assert back["task"] == "embed" and back["model_config"]["pooling"] == ("mean" if native else "cls")


def test_a_published_sentence_transformers_model_imports_and_embeds_as_sentence_transformers(tmp_path, capsys):
    """all-MiniLM-L6-v2: mean pooling, texts cut at its max_seq_length (256), length 1."""
    import sentence_transformers
    import_hf.main(["-i", str(published_uncased_model()), "-o", str(tmp_path / "minilm.pt")])
    assert "(task embed)" in capsys.readouterr().out
    texts = ["A man is eating food.", "Ça coûte 5€ — très cher!", "word " * 300]
    model, vocab, checkpoint = checkpoints.restore_model(tmp_path / "minilm.pt", {"embed": BertForEmbedding})
    assert checkpoint["config"]["seq-len"] == 256 and model.config.pooling == "mean"
    theirs = sentence_transformers.SentenceTransformer(str(published_uncased_model()), device="cpu").encode(texts)
    np.testing.assert_allclose(embed_texts(model, vocab, texts, 256), theirs, atol=1e-5)


@pytest.mark.parametrize("length", ['"abc"', "4", "true"])
def test_a_bad_max_seq_length_is_one_line_naming_the_file_and_key(tmp_path, capsys, length):
    """The length becomes the run's seq-len: seq-len's rule, said of the key the file holds."""
    model = tmp_path / "minilm"
    shutil.copytree(published_uncased_model(), model, copy_function=lambda source, target: Path(target).symlink_to(
        Path(source).resolve()))
    settings = model / "sentence_bert_config.json"
    settings.unlink()
    settings.write_text(f'{{"max_seq_length": {length}, "do_lower_case": false}}')
    line = one_error_line(capsys, lambda: import_hf.main(["-i", str(model), "-o", str(tmp_path / "x.pt")]))
    assert line == (f"error: {settings}: max_seq_length = {length}: expected an integer in [8, 2048] "
                    "(it becomes seq-len)")
    assert not (tmp_path / "x.pt").exists()


# ------------------------------------------------------------------- a teacher's similarities

@pytest.fixture(scope="module")
def taught_base(imdb_corpus, tmp_path_factory):
    """datasets/embed made up from the demo reviews, read with all-MiniLM-L6-v2's vocabulary: its teacher."""
    base = tmp_path_factory.mktemp("taught_base")
    shutil.copytree(published_uncased_model(), base / "vocab", ignore=shutil.ignore_patterns("*.safetensors"))
    make_embed_demo.make_embed_demo(imdb_corpus, base / "datasets" / "embed", seed=123, limit=600)
    return base


STUDENT = {"d_model": 32, "heads": 2, "n_layer": 1, "d_ff": 64, "teacher": published_uncased_model()}


def test_a_narrow_student_learns_a_published_models_similarities(taught_base, imdb_reviews, tmp_path, monkeypatch,
                                                                 keep_signal_handlers):
    transfer = tmp_path / "reviews.txt"
    transfer.write_text("\n".join(imdb_reviews[:50]) + "\n", encoding="utf-8")
    monkeypatch.chdir(embed_workdir(taught_base, tmp_path / "work", max_iters=60, lr_decay_iters=60, val_interval=60,
                                    log_interval=1, transfer_data=transfer, **STUDENT))
    config = main.load_config(None, [])
    task = main.make_task(config)
    pairs = embed_data.read_pairs(config.glue_path)
    sentences = teacher.transfer_sentences(str(transfer))
    assert len(sentences) > len(imdb_reviews[:50])
    assert len(task.split("train")) == 2 * len(pairs.anchors) + len(sentences)  # each pair's two texts, then these
    run_dir = main.run(config, None, False)
    lines = (run_dir / "logs" / "log.txt").read_text(encoding="utf-8").splitlines()
    losses = [float(line.split("| loss ")[1].split()[0]) for line in lines if "| loss " in line]
    assert len(losses) == 60 and sum(losses[-5:]) < 0.5 * sum(losses[:5]), losses
    saved = checkpoints.load(run_dir / "checkpoints" / "checkpoint.pt")
    assert saved["model_config"]["d_model"] == 32 and saved["task"] == "embed"


def test_a_taught_student_resumes_exactly(taught_base, tmp_path, monkeypatch, keep_signal_handlers):
    settings = {"lr_decay_iters": 6, "val_interval": 6, "val_dataset_percentage": 0.2, **STUDENT}
    assert_resumes_exactly_mid_epoch(lambda name: embed_workdir(taught_base, tmp_path / name, **settings),
                                     monkeypatch, steps=6)
