"""Sentence embeddings (task-type = embed; task.Task): contrastive fine-tuning as sentence-transformers'
MultipleNegativesRankingLoss (InfoNCE) trains them, scored by similarity and by retrieval.

Each anchor's positive is the right answer among every positive and hard negative of the batch
(the others are its in-batch negatives): cross-entropy over the cosine similarities divided by
`temperature`. With several processes the candidates are gathered from all of them (the gradient
flows back through the gather), so an anchor meets the global batch's negatives, as in one process.
Validation and test embed STS-B-layout pairs (the Spearman correlation of their cosine with the
people's scores, as MTEB's STS) and a BEIR-layout retrieval split (recall@1, recall@10, MRR@10,
nDCG@10 over the whole corpus), whichever the data has; best.pt goes by the Spearman correlation
where there are pairs, else by nDCG@10. The validation loss is the training objective on retrieval's
queries (every document a candidate) where there is retrieval, else the cosine's squared distance
to the scaled score on the pairs (sentence-transformers' CosineSimilarityLoss). An evaluation embeds
every text of the split, whatever val-iters or test-iters say: the scores need them all.
"""
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from batching import gather_padded, kept_rows, pad_multiple, padded_width
from config import model_config
from distributed import every_rank
from errors import UserError
from hardware import to_device
from model import BertForEmbedding, ModelConfig
from tasks import embed_data
from tasks.embed_data import Pairs, Retrieval
from tasks.fine_tuning import EncodedSplit, FineTuningTask, inference_rows, pooled_share
from tasks.glue_data import SIMILARITY_RANGE, Examples
from tasks.glue_metrics import pearson, spearman
from tasks.pair_encoding import EncodedExamples, encode_examples
from tasks.retrieval_metrics import best_documents, retrieval_scores


class TrainingTexts(EncodedSplit):
    """With a teacher: every text of the training pairs, then transfer-data's sentences, one a row."""

    def __init__(self, encoded: EncodedExamples):
        self.encoded = encoded

    def batch(self, rows: np.ndarray, pad_id: int, seq_len: int, multiple: int) -> dict:
        return text_batch(self.encoded, rows, pad_id, seq_len, multiple)


class TrainingPairs(EncodedSplit):
    """The training split: its pairs and each column's encoded texts, a row a pair (its anchor's length)."""

    def __init__(self, pairs: Pairs, columns: list[EncodedExamples]):
        self.pairs = pairs
        self.columns = columns
        self.encoded = columns[0]

    def batch(self, rows: np.ndarray, pad_id: int, seq_len: int, multiple: int) -> dict:
        """The anchors, then the positives, then the negatives of `rows`, padded to one width."""
        width = max(padded_width(column.lengths[rows], seq_len, multiple) for column in self.columns)
        padded = [gather_padded(column.tokens, column.offsets, rows, width, pad_id) for column in self.columns]
        return {"input_ids": np.concatenate([ids for ids, _ in padded]),
                "attention_mask": np.concatenate([real for _, real in padded])}


@dataclass
class EvaluationSplit:
    """A validation or test split: scored pairs and retrieval, either or both, and every text to embed
    by its part (first, second, queries, documents)."""
    similarity: Examples | None
    retrieval: Retrieval | None
    parts: dict[str, EncodedExamples]


class EmbeddingTask(FineTuningTask):
    """Sentence embeddings on BERT: BertForEmbedding, trained on pairs, scored by STS and retrieval.

    With a teacher (any embedding model of the vocabulary: a sentence-transformers folder, our embed
    checkpoint), the student learns instead the teacher's cosine similarities between the texts of a
    batch (the squared error of the two similarity matrices), on every text of the training pairs and
    transfer-data's sentences: the similarities are what an embedding is used for, and they compare
    across widths, so a narrower student needs no projection into the teacher's space."""
    measuring_keys = ("seq_len", "pooling", "temperature", "dataset_percentage", "val_dataset_percentage",
                      "teacher", "transfer_data")

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        super().__init__(config, vocab, device, rank, world_size)
        self.last_layer_share = pooled_share(config)
        self.best_metric = "spearman" if self.split("val").similarity is not None else "ndcg@10"
        self.teacher = None
        if config.teacher:
            from tasks.teacher import load_teacher  # a run without a teacher reads no other model
            self.teacher = load_teacher(Path(config.teacher), vocab, config.seq_len, device, BertForEmbedding)

    def read_part(self, split: str, name: str) -> TrainingPairs | EvaluationSplit:
        if split == "train":  # pairs to train on; validation and test: scored pairs or retrieval
            pairs = self.kept(embed_data.read_pairs(self.config.glue_path), split, "training pairs")
            if self.config.teacher:
                texts = [text for column in pairs.columns for text in column]
                if self.config.transfer_data:
                    from tasks.teacher import transfer_sentences
                    texts += transfer_sentences(self.config.transfer_data)
                return TrainingTexts(self.encode(texts))
            return TrainingPairs(pairs, [self.encode(texts) for texts in pairs.columns])
        return self.evaluation_split(split, name)

    def encode(self, texts: list[str]) -> EncodedExamples:
        return encode_examples(self.vocab, texts, None, self.config.seq_len)

    def evaluation_split(self, split: str, name: str) -> EvaluationSplit:
        """The split's scored pairs and retrieval queries (val-dataset-percentage of them for validation)."""
        directory = self.config.glue_path
        share, seed = self.config.share_of(split), self.config.seed
        similarity = embed_data.read_similarity(directory, name)
        if similarity is not None:
            similarity = similarity.select(kept_rows(len(similarity), share, seed))
        retrieval = None
        if embed_data.qrels_file(directory, name) is not None:
            retrieval = embed_data.read_retrieval(directory, name)
            rows = kept_rows(len(retrieval.queries), share, seed)
            retrieval = Retrieval([retrieval.queries[row] for row in rows], retrieval.documents,
                                  [retrieval.relevant[row] for row in rows], retrieval.files)
        if similarity is None and retrieval is None:
            folder, short = embed_data.folder_of(directory), "dev" if split == "val" else "test"
            raise UserError(f"{folder}: no embed {name} split: expected scored pairs in STS-B's layout "
                            f"(stsb/{name}-00000-of-00001.parquet or STS-B/{short}.tsv, with scores) or "
                            f"retrieval/qrels/{short}.tsv (BEIR's layout)")
        parts = {}
        if similarity is not None:
            parts |= {"first": self.encode(similarity.first), "second": self.encode(similarity.second)}
        if retrieval is not None:
            parts |= {"queries": self.encode(retrieval.queries), "documents": self.encode(retrieval.documents)}
        return EvaluationSplit(similarity, retrieval, parts)

    def model_config(self, max_len: int | None = None) -> ModelConfig:
        return model_config(self.config, self.vocab, max_len)

    def build_model(self, max_len: int | None = None) -> BertForEmbedding:
        return BertForEmbedding(self.model_config(max_len))

    def loss(self, model, batch: dict, progress=None):
        """Mean InfoNCE loss of the anchors, and [anchors, anchors whose positive scores best]; with a
        teacher, similarity_loss."""
        embeddings = model(batch["input_ids"], batch["attention_mask"])
        if self.teacher is not None:
            with torch.no_grad():
                taught = self.teacher(batch["input_ids"], batch["attention_mask"])
            return similarity_loss(embeddings, taught)
        anchors = len(embeddings) // len(self.split("train").columns)
        candidates, first = every_process_candidates(embeddings[anchors:])
        loss, right = contrastive_loss(embeddings[:anchors], candidates, self.config.temperature, first)
        return loss, torch.stack([torch.tensor(anchors, device=right.device), right])

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict:
        """accuracy: the share of anchors whose positive scores best, or with a teacher of texts whose
        nearest other text in the batch is the teacher's."""
        return {"loss": loss, "accuracy": float(statistics[1] / statistics[0]) if statistics[0] else 0.0}

    def eval_batches(self, split: str, count: int | None):
        """Every text of each part once (each rank every world-size-th), shortest first: little padding."""
        data, size = self.split(split), self.order.batch_size
        for part, encoded in data.parts.items():
            rows = np.argsort(encoded.lengths, kind="stable")[self.order.rank::self.order.world_size]
            for start in range(0, len(rows), size):
                chosen = rows[start:start + size]
                batch = text_batch(encoded, chosen, self.vocab.pad_id, self.config.seq_len, self.pad_multiple)
                yield to_device(batch, self.device, False) | {"split": split, "part": part, "rows": chosen}

    @torch.no_grad()
    def evaluate(self, model, batches, autocast) -> dict:
        """The split's scores from every rank's embeddings."""
        model.eval()
        split, embedded = "val", {}
        for batch in batches:
            split = batch["split"]
            with autocast:
                vectors = model(batch["input_ids"], batch["attention_mask"])
            embedded.setdefault(batch["part"], []).append((batch["rows"], vectors.float().cpu().numpy()))
        model.train()
        vectors = assembled(every_rank(embedded))
        return self.scores(self.split(split), vectors)

    def scores(self, data: EvaluationSplit, vectors: dict[str, np.ndarray]) -> dict:
        metrics = {}
        if data.retrieval is not None:
            metrics["loss"] = retrieval_loss(vectors["queries"], vectors["documents"], data.retrieval.relevant,
                                             self.config.temperature)
        if data.similarity is not None:
            cosine = np.sum(vectors["first"] * vectors["second"], axis=1)
            gold = data.similarity.labels.astype(np.float64)
            metrics.setdefault("loss", float(np.mean((cosine - gold / SIMILARITY_RANGE[1]) ** 2)))
            metrics |= {"spearman": spearman(gold, cosine), "pearson": pearson(gold, cosine),
                        "pairs": len(gold)}
        if data.retrieval is not None:
            ranked = best_documents(vectors["queries"], vectors["documents"])
            metrics |= retrieval_scores(ranked, data.retrieval.relevant) | {"queries": len(data.retrieval.queries)}
        return metrics

    def show_predictions(self, model, autocast) -> str:
        """A few validation pairs with their cosine and score, or queries with the document found."""
        data = self.split("val")
        model.eval()
        shown = {part: encoded for part, encoded in data.parts.items() if part != "documents"}
        with autocast:
            vectors = {part: embedded(model, encoded, np.arange(min(4, len(encoded))), self.vocab.pad_id,
                                      self.config.seq_len) for part, encoded in shown.items()}
        model.train()
        if data.similarity is not None:
            cosine = np.sum(vectors["first"] * vectors["second"], axis=1)
            return "predictions:\n" + "\n".join(
                f"  cosine {value:.2f} (score {score:.1f}): {first[:60]!r} | {second[:60]!r}"
                for value, score, first, second in zip(cosine, data.similarity.labels, data.similarity.first,
                                                       data.similarity.second))
        return "predictions: " + ", ".join(repr(query[:60]) for query in data.retrieval.queries[:4])


def text_batch(encoded: EncodedExamples, rows: np.ndarray, pad_id: int, seq_len: int, multiple: int) -> dict:
    width = padded_width(encoded.lengths[rows], seq_len, multiple)
    input_ids, real = gather_padded(encoded.tokens, encoded.offsets, rows, width, pad_id)
    return {"input_ids": input_ids, "attention_mask": real}


@torch.no_grad()
def embedded(model, encoded: EncodedExamples, rows: np.ndarray, pad_id: int, seq_len: int,
             batch_size: int = 64, progress: bool = False) -> np.ndarray:
    """The embeddings of texts `rows` (float32 numpy, in their order), batched by length."""
    device = next(model.parameters(), torch.empty(0)).device  # a graph in onnxruntime has none: the CPU
    vectors = np.zeros((len(rows), model.config.d_model), np.float32)
    for chosen in inference_rows(encoded.lengths[rows], batch_size, progress):
        batch = to_device(text_batch(encoded, rows[chosen], pad_id, seq_len, pad_multiple(device.type)),
                          device, False)
        output = model(batch["input_ids"], batch["attention_mask"])
        vectors[chosen] = output.float().cpu().numpy()
    return vectors


def embed_texts(model, vocab, texts: list[str], seq_len: int, batch_size: int = 64,
                progress: bool = False) -> np.ndarray:
    """Each text's embedding (length 1), cut and pooled as fine-tuning does."""
    encoded = encode_examples(vocab, texts, None, seq_len)
    return embedded(model, encoded, np.arange(len(encoded)), vocab.pad_id, seq_len, batch_size, progress)


def every_process_candidates(candidates: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Every process's candidates in rank order (each process's own keep their gradient: the
    gather's backward brings every process's share back), and where this process's begin."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return candidates, 0
    from torch.distributed.nn.functional import all_gather  # differentiable, unlike dist.all_gather
    return torch.cat(all_gather(candidates)), torch.distributed.get_rank() * len(candidates)


def similarity_loss(student: torch.Tensor, teacher: torch.Tensor):
    """The mean squared error between the student's and the teacher's cosine similarities of every
    two texts of the batch (embeddings of length 1), and [texts, texts whose nearest other text is
    the teacher's nearest]."""
    own = torch.eye(len(student), dtype=torch.bool, device=student.device)  # a text and itself: always 1
    learned, taught = (vectors.float() @ vectors.float().T for vectors in (student, teacher))
    loss = ((learned - taught) ** 2).masked_fill(own, 0).sum() / max(1, own.numel() - len(own))
    nearest = [similarities.detach().masked_fill(own, -2).argmax(-1) for similarities in (learned, taught)]
    return loss, torch.stack([torch.tensor(len(student), device=student.device), (nearest[0] == nearest[1]).sum()])


def contrastive_loss(anchors: torch.Tensor, candidates: torch.Tensor, temperature: float, first: int = 0):
    """InfoNCE: anchor i's right candidate is first + i (its positive), among all of them (positives,
    then hard negatives). Returns the mean loss and how many anchors score their own positive highest."""
    logits = anchors.float() @ candidates.float().T / temperature
    targets = torch.arange(len(anchors), device=anchors.device) + first
    return F.cross_entropy(logits, targets), (logits.argmax(-1) == targets).sum()


def retrieval_loss(queries: np.ndarray, documents: np.ndarray, relevant: list[dict[int, float]],
                   temperature: float) -> float:
    """The training objective on retrieval: each query's most relevant document among the whole corpus."""
    total = 0.0
    for start in range(0, len(queries), 256):
        logits = torch.from_numpy(queries[start:start + 256] @ documents.T / temperature)
        targets = torch.tensor([max(grades, key=grades.get) for grades in relevant[start:start + 256]])
        total += F.cross_entropy(logits.double(), targets, reduction="sum").item()
    return total / len(queries)


def assembled(gathered: list[dict]) -> dict[str, np.ndarray]:
    """Each part's embeddings in row order, from every rank's (rows, embeddings) batches."""
    vectors = {}
    for part in gathered[0]:
        batches = [batch for rank in gathered for batch in rank.get(part, [])]
        rows = np.concatenate([rows for rows, _ in batches])
        values = np.concatenate([values for _, values in batches])
        vectors[part] = values[np.argsort(rows)]
    return vectors
