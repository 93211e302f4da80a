"""Causal language modelling (task.Task) on the MLM shards (a static shard's original ids, or
legacy.py's GPT article arrays): the encoder with a causal mask, each position
predicting the next token; loss and accuracy over every real next token."""
import torch

from config import model_config
from tasks.lm_data import DATA_KEYS, CorpusTask, LanguageModelData
from model import IGNORE_INDEX, BertForCausalLM, ModelConfig
from tasks.mlm_task import token_statistics


class CausalLMTask(CorpusTask):
    name = "clm"
    measuring_keys = DATA_KEYS  # nothing is masked: the masking keys cannot change what it measures
    predictions_per_token = 1.0  # the head scores every position

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        super().__init__(config, vocab, device, LanguageModelData(config, vocab, rank, world_size))

    def model_config(self, max_len: int | None = None) -> ModelConfig:
        return model_config(self.config, self.vocab, max_len, causal=True)

    def build_model(self, max_len: int | None = None) -> BertForCausalLM:
        return BertForCausalLM(self.model_config(max_len))

    def next_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Labels: the token after each position; IGNORE_INDEX after the last and before padding."""
        following = torch.cat([input_ids[:, 1:], torch.full_like(input_ids[:, :1], self.vocab.pad_id)], dim=1)
        return following.masked_fill(following == self.vocab.pad_id, IGNORE_INDEX)

    def loss(self, model, batch: dict, progress=None):
        labels = self.next_tokens(batch["input_ids"])
        logits, loss = model(batch["input_ids"], labels, attention_mask=batch["attention_mask"],
                             document_ids=batch.get("document_ids"))
        return loss, token_statistics(logits, labels)

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict:
        count, hits = statistics.tolist()
        return {"loss": loss, "accuracy": hits / count}

    @torch.no_grad()
    def show_predictions(self, model, autocast) -> str:
        """The first validation sample's opening, and the model's guess for each next token."""
        batch = next(self.eval_batches("val", 1))
        ids = batch["input_ids"][:1, :24]
        documents = batch.get("document_ids")
        model.eval()
        with autocast:
            logits, _ = model(ids, document_ids=None if documents is None else documents[:1, :24])
        model.train()
        guesses = [self.vocab.cls_id] + logits[0, :-1].argmax(-1).tolist()
        return (f"next-token guesses: {self.vocab.render(guesses, {})}\n"
                f"original:           {self.vocab.render(ids[0].tolist(), {})}")
