"""The grammars of time-budget, lr-scheduler, mask-rate, seq-len-curriculum and stop-at, as pure
functions: each text read into a value, and each value written back as text that reads the same."""
import pytest

from run_plan import (GRAMMARS, Curriculum, Duration, MaskRate, Schedule, Target, parse_curriculum, parse_duration,
                      parse_mask_rate, parse_scheduler, parse_target)


@pytest.mark.parametrize("text, seconds", [("0", 0.0), ("", 0.0), ("90s", 90.0), ("30m", 1800.0),
                                           ("1.5h", 5400.0), (" 2H ", 7200.0), (".5m", 30.0)])
def test_durations_in_seconds(text, seconds):
    assert parse_duration(text).seconds == seconds


@pytest.mark.parametrize("text", ["30", "m", "30 min", "-5m", "1d"])
def test_what_is_not_a_duration_is_a_value_error(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize("kind, text", [
    (Duration, "0"), (Duration, "90s"), (Duration, "30m"), (Duration, "1.5h"), (Duration, "0.1s"),
    (Schedule, "cosine"), (Schedule, "none"), (Schedule, "steplr:500:0.5"), (Schedule, "one-cycle"),
    (Schedule, "one-cycle:0.3"), (Schedule, "wsd"), (Schedule, "wsd:0.25"), (Schedule, "wsd:0.2:linear"),
    (Schedule, "wsd:0.123457:linear"),
    (MaskRate, "0.15"), (MaskRate, "0.3:0.15"), (MaskRate, "0.3:0.15@0.8"), (MaskRate, "0.3:0.15@decay"),
    (Target, "accuracy:0.35"), (Target, "loss:4"), (Curriculum, "64:0.5")])
def test_a_value_is_written_back_as_the_text_it_was_read_from(kind, text):
    value = GRAMMARS[kind].parse(text)
    assert str(value) == text and GRAMMARS[kind].parse(str(value)) == value


def test_a_value_made_in_code_is_written_as_text_that_reads_back_exactly():
    """decay_branch's share of the run left has many digits: a resume reads the same rate."""
    schedule = Schedule("wsd", decay=1 - 0.3, shape="linear")  # 0.7000000000000001
    assert parse_scheduler(str(schedule)) == schedule
    assert parse_duration(str(Duration(1234567.0))) == Duration(1234567.0)
    assert str(parse_scheduler("one-cycle:0.5")) == "one-cycle" and str(parse_scheduler("WSD:0.2:sqrt")) == "wsd"


@pytest.mark.parametrize("text, schedule", [
    ("cosine", Schedule("cosine")), ("Linear", Schedule("linear")), ("none", Schedule("none")),
    ("steplr:500:0.5", Schedule("steplr", step=500, gamma=0.5)),
    ("one-cycle", Schedule("one-cycle", peak=0.5)), ("one-cycle:0.3", Schedule("one-cycle", peak=0.3)),
    ("wsd", Schedule("wsd", decay=0.2, shape="sqrt")), ("WSD:0.1", Schedule("wsd", decay=0.1)),
    ("wsd:1:linear", Schedule("wsd", decay=1.0, shape="linear"))])
def test_schedulers_read_with_their_arguments(text, schedule):
    assert parse_scheduler(text) == schedule


@pytest.mark.parametrize("text", ["cosine:2", "steplr", "steplr:0:0.5", "steplr:10:1.5", "steplr:x:0.5",
                                  "one-cycle:1", "one-cycle:0", "one-cycle:0.2:0.3", "triangle", "wsd:0", "wsd:1.5",
                                  "wsd:0.2:cosine", "wsd:0.2:sqrt:1"])
def test_a_scheduler_out_of_its_forms_is_a_value_error(text):
    with pytest.raises(ValueError, match="not a scheduler"):
        parse_scheduler(text)


def test_a_target_is_reached_from_above_for_losses_and_from_below_for_scores():
    assert parse_target("") is None
    accuracy, loss = parse_target("accuracy:0.35"), parse_target("LOSS:4")
    assert (accuracy, loss) == (Target("accuracy", 0.35), Target("loss", 4.0))
    assert accuracy.reached({"accuracy": 0.35}) and not accuracy.reached({"accuracy": 0.349})
    assert loss.reached({"loss": 3.99}) and not loss.reached({"loss": 4.01})
    assert str(accuracy) == "accuracy:0.35"


def test_an_undefined_metric_reaches_no_target():
    """A correlation of constant predictions (None) is no score: stop-at = pearson:0 is not reached by it."""
    assert not parse_target("pearson:0").reached({"pearson": None})
    assert not parse_target("loss:4").reached({"loss": None})

@pytest.mark.parametrize("text", ["accuracy", ":0.3", "accuracy:high", "val/accuracy:0.3"])
def test_a_target_out_of_its_form_is_a_value_error(text):
    with pytest.raises(ValueError):
        parse_target(text)


def test_a_curriculum_reads_length_and_share():
    assert parse_curriculum(" ") is None
    assert parse_curriculum("64:0.5") == Curriculum(64, 0.5)
    for text in ("64", "1:0.5", "64:0", "64:1.5", "sixty:0.5"):
        with pytest.raises(ValueError):
            parse_curriculum(text)


@pytest.mark.parametrize("text, rate", [
    ("0.15", MaskRate(0.15, 0.15)), (" 0.30 ", MaskRate(0.3, 0.3)), ("0.3:0.15", MaskRate(0.3, 0.15)),
    ("0.3:0.15@0.8", MaskRate(0.3, 0.15, 0.8)), ("0.3:0.15@Decay", MaskRate(0.3, 0.15, "decay"))])
def test_a_mask_rate_reads_as_its_start_end_and_step(text, rate):
    assert parse_mask_rate(text) == rate


@pytest.mark.parametrize("text", ["0", "1", "0.1:0.3", "0.3@0.5", "0.3:0.15@", "0.3:0.15@0", "0.3:0.15@1", "0.3:",
                                  "x", "0.3:0.15@later"])
def test_a_mask_rate_out_of_its_forms_is_a_value_error(text):
    with pytest.raises(ValueError, match="not a mask rate"):
        parse_mask_rate(text)
