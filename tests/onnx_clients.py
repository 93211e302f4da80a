"""Run by tests/test_onnx_clients.py under ONNX_CLIENT_PYTHON (an environment with optimum-onnx and
sentence-transformers, which need transformers 4): loads each exported directory's onnx/model.onnx
through its real client and prints, as JSON, the inputs the directory's tokenizer made and the
client's outputs.

    python onnx_clients.py CASES.json   # [{"directory", "client", "texts"}, ...]
"""
import json
import sys

CLIENTS = ("ORTModelForMaskedLM", "ORTModelForSequenceClassification", "ORTModelForTokenClassification",
           "ORTModelForQuestionAnswering", "ORTModelForFeatureExtraction")


def through_optimum(directory: str, client: str, texts: list[str]) -> dict:
    import optimum.onnxruntime
    from transformers import AutoTokenizer
    model = getattr(optimum.onnxruntime, client).from_pretrained(directory, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    encoded = tokenizer(texts, padding=True, return_tensors="np")
    outputs = model(**encoded)
    names = ("start_logits", "end_logits") if client == "ORTModelForQuestionAnswering" else (
        ("last_hidden_state",) if client == "ORTModelForFeatureExtraction" else ("logits",))
    return {"input_ids": encoded["input_ids"].tolist(), "attention_mask": encoded["attention_mask"].tolist(),
            "outputs": {name: outputs[name].tolist() for name in names}}


def through_sentence_transformers(directory: str, texts: list[str]) -> dict:
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(directory, backend="onnx", trust_remote_code=True, device="cpu")
    return {"outputs": {"embeddings": model.encode(texts).tolist()}}


def main(path: str):
    results = []
    for case in json.loads(open(path, encoding="utf-8").read()):
        if case["client"] == "SentenceTransformer":
            results.append(through_sentence_transformers(case["directory"], case["texts"]))
        else:
            results.append(through_optimum(case["directory"], case["client"], case["texts"]))
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
