"""Replaced-token detection, ELECTRA's pre-training (task.Task): the MLM shards and masks; a
generator fills the masks, the encoder learns to tell every replaced token."""
import torch
import torch.nn.functional as F

from config import model_config
from tasks.lm_data import DATA_KEYS, CorpusTask, LanguageModelData
from model import IGNORE_INDEX, ElectraForPreTraining, ModelConfig, token_hits, token_loss
from run_plan import Progress
from tasks.mlm_task import MASKING_KEYS, Masker, first_sample, masked_share


class ElectraTask(CorpusTask):
    """The loss is the generator's MLM loss plus detection-weight times the detector's binary
    cross-entropy over every real token. Validation reports both, the generator's masked-token
    accuracy and the detection accuracy."""
    name = "electra"
    measuring_keys = (*DATA_KEYS, *MASKING_KEYS)

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        # masking = static is for mlm alone: the data is the unmasked ids
        super().__init__(config, vocab, device, LanguageModelData(config, vocab, rank, world_size))
        self.masker = Masker(config, vocab, device, rank)  # its generator draws the generator's samples too
        self.evaluation_sampling = torch.Generator(device=device)
        self.predictions_per_token = masked_share(config)  # the generator's head scores the masked positions

    def model_config(self, max_len: int | None = None) -> ModelConfig:
        """The discriminator, and a generator of generator-width of its heads (at least one), each as wide."""
        generator_heads = max(1, round(self.config.heads * self.config.generator_width))
        return model_config(self.config, self.vocab, max_len, generator_heads=generator_heads)

    def build_model(self, max_len: int | None = None) -> ElectraForPreTraining:
        return ElectraForPreTraining(self.model_config(max_len))

    def eval_batches(self, split: str, count: int | None):
        """Fixed batches with the same masks and the same generator samples at every evaluation."""
        self.evaluation_sampling.manual_seed(self.config.seed + 1)
        yield from self.masker.eval_batches(self.data, split, count, self.config.seed, self.device)

    def loss(self, model, batch: dict, progress: Progress | None = None):
        """Mean loss, and [masked tokens, generator hits, real tokens, detector hits, generator loss
        sum, detection loss sum, replaced tokens]; no host sync."""
        batch = self.masker.masked(batch, progress)
        labels = batch["labels"]
        generator_logits, detector_logits, corrupted = model(
            batch["input_ids"], batch["positions"], labels, batch["original_ids"],
            attention_mask=batch["attention_mask"],
            sampling=self.evaluation_sampling if progress is None else self.masker.generator,
            document_ids=batch.get("document_ids"))
        replaced = corrupted != batch["original_ids"]
        real = (torch.ones_like(replaced) if batch["attention_mask"] is None else batch["attention_mask"]).float()
        detection = F.binary_cross_entropy_with_logits(detector_logits.float(), replaced.float(), reduction="none")
        detection_loss = (detection * real).sum() / real.sum()
        generator_loss = token_loss(generator_logits, labels)
        loss = generator_loss + self.config.detection_weight * detection_loss
        masked = (labels != IGNORE_INDEX).sum().float()
        generator_hits = token_hits(generator_logits, labels).float()
        detector_hits = (((detector_logits > 0) == replaced).float() * real).sum()
        statistics = torch.stack([masked, generator_hits, real.sum(), detector_hits,
                                  generator_loss.detach().float() * masked, detection_loss.detach() * real.sum(),
                                  (replaced.float() * real).sum()])
        return loss, statistics

    def metrics(self, loss: float, statistics: torch.Tensor) -> dict:
        masked, generator_hits, real, detector_hits, generator_loss, detection_loss, replaced = statistics.tolist()
        return {"loss": loss, "accuracy": generator_hits / masked, "generator_loss": generator_loss / masked,
                "detection_loss": detection_loss / real, "detection_accuracy": detector_hits / real,
                "replaced": replaced / real}

    @torch.no_grad()
    def show_predictions(self, model, autocast) -> str:
        """The first validation sample as the discriminator saw it: /replaced/ tokens, and *flagged* ones."""
        batch = first_sample(self.eval_batches("val", 1))
        model.eval()
        with autocast:
            _, detector_logits, corrupted = model(batch["input_ids"], batch["positions"], batch["labels"],
                                                  batch["original_ids"], attention_mask=batch["attention_mask"],
                                                  sampling=self.evaluation_sampling,
                                                  document_ids=batch.get("document_ids"))
        model.train()
        original, corrupted = batch["original_ids"][0].tolist(), corrupted[0].tolist()
        flagged = (detector_logits[0] > 0).tolist()
        replaced_at = {position: token for position, token in enumerate(corrupted) if token != original[position]}
        flagged_at = {position: token for position, token in enumerate(corrupted) if flagged[position]}
        return (f"replaced:  {self.vocab.render(corrupted, replaced_at)}\n"
                f"flagged:   {self.vocab.render(corrupted, flagged_at)}")
