"""Turn a Hugging Face directory into a checkpoint of ours, to fine-tune or pre-train on.

Example:
    python scripts/import_hf.py -i bert-base-uncased/ -o wiki/bert-base.pt
    python src/main.py --cp wiki/bert-base.pt          # with task-type = sst2: fine-tune it

Reads config.json, the vocabulary (vocab.txt, or tokenizer.json alone) and model.safetensors (or
pytorch_model.bin, loaded safely) of a transformers BERT (BertModel, BertForMaskedLM,
BertForPreTraining, BertLMHeadModel, BertForSequenceClassification, BertForTokenClassification,
BertForQuestionAnswering), an ELECTRA discriminator, or any directory scripts/export_hf.py wrote. A
sentence-transformers model (modules.json: Transformer, Pooling by cls or mean, Normalize) becomes
an embed checkpoint with its pooling and max_seq_length. Heads the directory lacks start fresh when training
begins, and the log says so. Whether text is lower-cased is read from the directory's own
tokenizer_config.json (do_lower_case) or tokenizer.json and kept in the checkpoint. config.json's
sizes are checked before anything is allocated: a model larger than this machine's memory
(--memory-limit-gib) is refused.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from errors import UserError, exit_on_user_error  # noqa: E402
from interop.hf_import import convert  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--input", type=Path, required=True, help="a transformers BERT directory")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the checkpoint file to write")
    parser.add_argument("--memory-limit-gib", type=float, metavar="GIB",
                        help="the most memory the model may take, in GiB (default: this machine's memory)")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    if not args.input.is_dir():
        raise UserError(f"{args.input}: not a directory")
    result = convert(args.input, args.output, args.memory_limit_gib)
    print(f"wrote {args.output}: a starting point for --cp (task {result['task']})")
    if result["fresh"]:
        print(f"  not in {args.input} (start fresh when training): {', '.join(result['fresh'])}")
    if result["unused"]:
        print(f"  not used: {', '.join(result['unused'])}")


if __name__ == "__main__":
    main()
