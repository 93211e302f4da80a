"""Sentence embeddings from an embedding checkpoint (task-type = embed, or a sentence-transformers
model brought in by import_hf.py): a file's lines to a .npy array, and nearest neighbours of a query.

Examples:
    python scripts/embed.py --cp demo/runs/run3/checkpoints/best.pt -i sentences.txt -o sentences.npy
    python scripts/embed.py --cp demo/runs/run3/checkpoints/best.pt -i sentences.txt --query "a dull sequel" -k 5

Each embedding has length 1 (float32, a row per non-blank line, in order), so a dot product is the
cosine similarity. With --query, the lines most similar to each query are printed, best first, with
their cosine; --embeddings reuses an array this script wrote for the same file instead of embedding
it again.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from atomic import atomic_write, check_output_file  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from model import BertForEmbedding  # noqa: E402
from interop.onnx_model import OR_EXPORTED, restore_model  # noqa: E402
from tasks.embed_task import embed_texts  # noqa: E402
from tasks.retrieval_metrics import best_documents  # noqa: E402
from classify import print_lines, read_sentences, trained_seq_len  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=Path, required=True, help="an embed checkpoint" + OR_EXPORTED)
    parser.add_argument("-i", "--input", type=Path, required=True, help="a file with one text per line")
    parser.add_argument("-o", "--output", type=Path, help="write the embeddings here (.npy)")
    parser.add_argument("--query", action="append", default=[], help="print the lines nearest to this text "
                                                                     "(repeat for several)")
    parser.add_argument("-k", type=int, default=5, help="neighbours per query (default 5)")
    parser.add_argument("--embeddings", type=Path, help="the .npy this script wrote for -i, instead of embedding it")
    parser.add_argument("--batch-size", type=int, default=64, help="texts per forward pass (default 64)")
    args = parser.parse_args(argv)
    if not args.output and not args.query:
        parser.error("nothing to do: give -o FILE.npy, --query TEXT, or both")
    if args.k < 1 or args.batch_size < 1:
        parser.error("-k and --batch-size take a whole number above 0")
    return args


def stored_embeddings(path: Path, lines: int, width: int) -> np.ndarray:
    """An array written for the input file: one row of the model's width per line."""
    try:
        vectors = np.load(path, allow_pickle=False)
    except OSError as error:
        raise UserError(f"--embeddings {path}: cannot read ({error.strerror or error})") from None
    except ValueError:  # numpy's words for a file of another kind speak of pickles
        raise UserError(f"--embeddings {path}: not a .npy array (this script's -o writes one)") from None
    if not isinstance(vectors, np.ndarray):  # np.load opens a .npz archive of arrays as a dictionary
        vectors.close()
        raise UserError(f"--embeddings {path}: a .npz archive, not a .npy array (this script's -o writes one)")
    if vectors.shape != (lines, width):
        raise UserError(f"--embeddings {path}: shape {list(vectors.shape)}; the input's {lines} lines and the "
                        f"model's width make [{lines}, {width}]")
    return vectors


def save_array(path: Path, vectors: np.ndarray):
    with path.open("wb") as file:  # a file object: np.save would add .npy to the temporary file's name
        np.save(file, vectors)


def neighbour_lines(queries: list[str], query_vectors: np.ndarray, texts: list[str], vectors: np.ndarray,
                    k: int) -> list[str]:
    lines = []
    for query, found, query_vector in zip(queries, best_documents(query_vectors, vectors, k), query_vectors):
        lines.append(f"query: {query}")
        lines += [f"  {float(vectors[row] @ query_vector):.4f}  {texts[row]}" for row in found.tolist()]
    return lines


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    if args.output:
        check_output_file(args.output, ".npy file")
    texts = read_sentences(args.input)
    model, vocab, checkpoint = restore_model(args.cp, {"embed": BertForEmbedding})
    seq_len = trained_seq_len(checkpoint, model)
    if args.embeddings:
        vectors = stored_embeddings(args.embeddings, len(texts), model.config.d_model)
    else:
        vectors = embed_texts(model, vocab, texts, seq_len, args.batch_size, progress=True)
    if args.output:
        atomic_write(args.output, lambda temp: save_array(temp, vectors))
        print(f"wrote {args.output}: {vectors.shape[0]} embeddings of {vectors.shape[1]} dimensions", file=sys.stderr)
    if args.query:
        query_vectors = embed_texts(model, vocab, args.query, seq_len, args.batch_size)
        print_lines(neighbour_lines(args.query, query_vectors, texts, vectors, args.k))


if __name__ == "__main__":
    main()
