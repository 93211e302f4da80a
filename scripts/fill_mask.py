"""Show what a pre-trained checkpoint (or its ONNX export) predicts for each [MASK] in a sentence.

Example:
    python scripts/fill_mask.py --cp demo/runs/run0/checkpoints/best.pt "the movie was [MASK] ."
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from errors import UserError, exit_on_user_error  # noqa: E402
from model import BertForMaskedLM  # noqa: E402
from interop.onnx_model import OR_EXPORTED, restore_model  # noqa: E402


def encode_with_masks(vocab, text: str, max_len: int) -> list[int]:
    """[CLS] text [SEP], where each literal [MASK] becomes the mask token."""
    pieces = [vocab.encode([part])[0] if part.strip() else [] for part in text.split("[MASK]")]
    ids = [vocab.cls_id]
    for index, piece in enumerate(pieces):
        ids += piece if index == 0 else [vocab.mask_id, *piece]
    ids.append(vocab.sep_id)
    if len(ids) > max_len:
        raise UserError(f"the sentence has {len(ids)} tokens; this model reads at most {max_len}")
    return ids


@torch.no_grad()
def fill_mask(model, vocab, text: str, top_k: int) -> list[list[tuple[str, float]]]:
    """For each [MASK] in text, the top_k tokens with their probabilities."""
    ids = encode_with_masks(vocab, text, model.config.max_len)
    positions = [i for i, token in enumerate(ids) if token == vocab.mask_id]
    if not positions:
        raise UserError(f"no [MASK] in {text!r}")
    logits, _ = model(torch.tensor([ids]), torch.tensor([positions]))
    probabilities, tokens = logits[0].float().softmax(-1).topk(top_k, dim=-1)
    return [[(vocab.tokens[t], p) for t, p in zip(row_tokens.tolist(), row_probs.tolist())]
            for row_tokens, row_probs in zip(tokens, probabilities)]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=Path, required=True, help="an MLM checkpoint" + OR_EXPORTED)
    parser.add_argument("text", nargs="+", help="sentences with [MASK] where a word is missing")
    parser.add_argument("-k", "--top-k", type=int, default=5, help="candidates to show (default 5)")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    model, vocab, _ = restore_model(args.cp, {"mlm": BertForMaskedLM})
    if not 1 <= args.top_k <= vocab.size:
        raise UserError(f"-k {args.top_k}: expected 1 to {vocab.size} (the vocabulary's size)")
    for text in args.text:
        print(text)
        for number, candidates in enumerate(fill_mask(model, vocab, text, args.top_k), start=1):
            shown = "  ".join(f"{token} {probability:.3f}" for token, probability in candidates)
            print(f"  [MASK] {number}: {shown}")


if __name__ == "__main__":
    main()
