"""An export's onnx/model.onnx in its real clients: optimum's ORTModel class of each head, and
sentence-transformers' ONNX backend for an embedding model, for every layout, with outputs within
1e-4 of our model's on the inputs the directory's own tokenizer makes.

The clients need transformers 4 (optimum-onnx 0.1 pins it below 4.58), so they run in an environment
of their own, named by ONNX_CLIENT_PYTHON (.ci/run builds it from tests/onnx_clients_requirements.txt);
without it these tests are skipped.
"""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import checkpoints
import export_hf
from interop import onnx_export
from tasks.embed_task import embed_texts
from interop.onnx_model import restore_model
from test_onnx_export import HEADS, LAYOUTS, random_checkpoint

CLIENT_PYTHON = os.environ.get("ONNX_CLIENT_PYTHON")
pytestmark = pytest.mark.skipif(not CLIENT_PYTHON, reason="ONNX_CLIENT_PYTHON names no Python with optimum-onnx")
CLIENTS = {"mlm": "ORTModelForMaskedLM", "sst2": "ORTModelForSequenceClassification",
           "stsb": "ORTModelForSequenceClassification", "ner": "ORTModelForTokenClassification",
           "squad": "ORTModelForQuestionAnswering", "embed": "SentenceTransformer"}
TEXTS = ["Fine.", "A gorgeous, witty, seductive movie.", "Ça coûte 5€ — très cher! 42 (forty-two) reasons; why?",
         "The plot made no sense at all, and the acting was wooden from the first scene to the last."]


def run_clients(cases: list[dict], folder: Path) -> list[dict]:
    (folder / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    script = Path(__file__).resolve().parent / "onnx_clients.py"
    result = subprocess.run([CLIENT_PYTHON, str(script), str(folder / "cases.json")], capture_output=True,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def ours_on(checkpoint: Path, found: dict) -> dict[str, np.ndarray]:
    """Our model's outputs, under the graph's names, on the inputs the client's tokenizer made."""
    wrapper = onnx_export.exported_model(checkpoints.load(checkpoint))
    ids, mask = (torch.tensor(found[name]) for name in ("input_ids", "attention_mask"))
    with torch.no_grad():
        outputs = wrapper(ids, mask, torch.zeros_like(ids))
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return dict(zip(found["outputs"], (each.float().numpy() for each in outputs)))


def test_every_head_and_layout_loads_in_its_client_with_our_outputs(vocab, tmp_path):
    cases, checkpoints_of = [], []
    for layout in LAYOUTS:
        for task in HEADS:
            checkpoint = random_checkpoint(tmp_path / f"{task}-{layout}.pt", vocab, task, LAYOUTS[layout])
            export_hf.export(checkpoint, tmp_path / f"{task}-{layout}", onnx=True)
            cases.append({"directory": str(tmp_path / f"{task}-{layout}"), "client": CLIENTS[task], "texts": TEXTS})
            checkpoints_of.append(checkpoint)
    for case, checkpoint, found in zip(cases, checkpoints_of, run_clients(cases, tmp_path)):
        where = f"{case['client']} on {Path(case['directory']).name}"
        if case["client"] == "SentenceTransformer":
            model, vocabulary, _ = restore_model(checkpoint, {"embed": onnx_export.BertForEmbedding})
            ours = embed_texts(model, vocabulary, TEXTS, 96)
            theirs = np.array(found["outputs"]["embeddings"])
            assert np.abs(theirs - ours).max() < 1e-4, where
            continue
        for name, expected in ours_on(checkpoint, found).items():
            theirs = np.array(found["outputs"][name], dtype=np.float32)
            real = np.array(found["attention_mask"], dtype=bool)
            if theirs.ndim == expected.ndim == 3 or name.endswith("_logits"):  # a value per token: the real ones
                theirs, expected = theirs[real], expected[real]
            assert theirs.shape == expected.shape and np.abs(theirs - expected).max() < 1e-4, f"{where}: {name}"
