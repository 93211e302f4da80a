"""GPU readiness: under compile = true dynamo compiles a handful of graphs for a run, not one per
batch. A graph per batch shape would make every step of a GPU run wait for the compiler."""
import pytest
import torch

import main
import make_demo
from conftest import TEST_DEVICE


@pytest.fixture
def compiled_graphs(monkeypatch, keep_signal_handlers):
    """The input shapes of every graph dynamo hands to the backend while the run trains.

    The backend runs each captured graph as it is: which graphs get captured and when a changed
    shape forces a new one (guards, automatic dynamic shapes) is dynamo's decision, the same for
    inductor, which would spend minutes generating code for each."""
    graphs = []

    def counting_backend(graph, example_inputs):
        graphs.append([tuple(value.shape) for value in example_inputs if isinstance(value, torch.Tensor)])
        return graph.forward

    compile_with_inductor = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **options: compile_with_inductor(
        model, **options, backend=counting_backend))
    torch._dynamo.reset()
    yield graphs
    torch._dynamo.reset()


def test_mlm_with_dynamic_masking_compiles_a_handful_of_graphs(mlm_workdir, compiled_graphs):
    # 40 steps, each with fresh masks, and 4 validations. The masked positions per row are a fixed
    # count (masking.predictions_per_sequence), so no batch brings a new shape. The graphs: a
    # training step with and without padding (attention_mask None), validation (no grad) and the
    # log's one-sequence sample without labels. One more per step would be 40.
    main.main(["--compile", "true", "--masking", "dynamic", "--max-iters", "40", "--lr-decay-iters", "40",
               "--val-interval", "10", "--log-interval", "100"])
    assert 1 <= len(compiled_graphs) <= 5, compiled_graphs


def test_fine_tuning_over_varied_lengths_compiles_a_handful_of_graphs(
        mlm_workdir, rotten_tomatoes, compiled_graphs):
    make_demo.write_sst2(mlm_workdir / "datasets", rotten_tomatoes, seed=123)
    # One epoch of 1,600 sentences in length-grouped batches: widths from 8 to 64 in steps of 8,
    # and 2 validations over the whole validation split. The graphs: the first batch's width, then
    # any width (dynamo makes the dimension dynamic at the first change), validation (no grad), its
    # short last batch, and the log's sample predictions without labels. One per width would be 7 more.
    main.main(["--task-type", "sst2", "--compile", "true", "--device", TEST_DEVICE, "--max-iters", "50",
               "--lr-decay-iters", "50", "--warmup-iters", "5", "--val-interval", "25", "--val-iters", "1000",
               "--log-interval", "100", "--batch-size", "32"])
    assert 1 <= len(compiled_graphs) <= 5, compiled_graphs
