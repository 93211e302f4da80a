"""transformers classes around a BERT variant exported by the BERT-from-scratch program
(scripts/export_hf.py). The layers are the program's own: model.py, architecture.py and
cpu_kernels.py are its src/ files as they are; these classes only adapt inputs and outputs to
transformers' conventions. The weights keep the program's names."""
from dataclasses import fields

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.modeling_outputs import (BaseModelOutput, CausalLMOutput, MaskedLMOutput,
                                           QuestionAnsweringModelOutput, SequenceClassifierOutput,
                                           TokenClassifierOutput)
from transformers.models.bert.modeling_bert import BertForPreTrainingOutput
from transformers.models.electra.modeling_electra import ElectraForPreTrainingOutput

from .configuration_bert_variant import BertVariantConfig
from .model import (IGNORE_INDEX, BertForCausalLM, BertForMaskedLM, BertForPreTraining, BertForQuestionAnswering,
                    BertForSequenceClassification, BertForTokenClassification, ElectraForPreTraining, Embeddings,
                    Encoder, ModelConfig, Rotary, init_weights, rotary_angles, sequence_loss, sinusoidal_positions)

TIED = {"head.token_embedding.weight": "encoder.embeddings.token.weight"}  # the MLM decoder is the embedding


def model_config(config: BertVariantConfig, **changes) -> ModelConfig:
    """The program's ModelConfig from the transformers config: the same field names."""
    values = {field.name: getattr(config, field.name) for field in fields(ModelConfig)
              if hasattr(config, field.name)}
    return ModelConfig(**(values | {"pad_id": config.pad_token_id, "num_labels": config.num_labels} | changes))


def real_tokens(attention_mask):
    """transformers' 0/1 mask as the program's: True for real tokens, None when nothing is padded."""
    return None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()


class BertVariantPreTrainedModel(PreTrainedModel):
    config_class = BertVariantConfig
    base_model_prefix = "encoder"
    supports_gradient_checkpointing = False

    def adopt(self, ours: torch.nn.Module):
        """Take the program's model's modules as our own, under the same names (so the same weights)."""
        for name, module in ours.named_children():
            self.add_module(name, module)

    def get_input_embeddings(self):
        return self.encoder.embeddings.token

    @torch.no_grad()
    def _init_weights(self, module):
        """The program's initialisation; the position tables, which no file holds, computed again."""
        config = model_config(self.config)
        if isinstance(module, Rotary):
            angles = rotary_angles(config).to(module.cos.device)
            module.cos.copy_(angles.cos())
            module.sin.copy_(angles.sin())
        elif isinstance(module, Embeddings) and module.fixed_positions is not None:
            module.fixed_positions.copy_(sinusoidal_positions(config.max_len, config.d_model))
        else:
            init_weights(module)


class BertVariantModel(BertVariantPreTrainedModel):
    """The encoder alone: the last hidden states."""

    def __init__(self, config):
        super().__init__(config)
        self.encoder = Encoder(model_config(config))
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **kwargs):
        return BaseModelOutput(last_hidden_state=self.encoder(input_ids, real_tokens(attention_mask), token_type_ids))


class BertVariantForMaskedLM(BertVariantPreTrainedModel):
    _tied_weights_keys = TIED

    def __init__(self, config):
        super().__init__(config)
        self.adopt(BertForMaskedLM(model_config(config, sentence_classes=0)))
        self.post_init()

    def get_output_embeddings(self):
        return self.head.token_embedding

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        """Logits at every position; the loss over the positions whose label is not -100."""
        logits = self.head(self.encoder(input_ids, real_tokens(attention_mask), token_type_ids))
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                                           ignore_index=IGNORE_INDEX)
        return MaskedLMOutput(loss=loss, logits=logits)


class BertVariantForPreTraining(BertVariantPreTrainedModel):
    """The pre-training heads: MLM with the sentence-pair head (next-sentence or sentence-order
    prediction), or ELECTRA's replaced-token detector (config.replaced_token_detection). One class
    for both, as transformers maps one class per configuration to AutoModelForPreTraining."""

    def __init__(self, config):
        super().__init__(config)
        if config.replaced_token_detection:
            discriminator = ElectraForPreTraining(model_config(config, generator_heads=1))
            self.encoder, self.detector = discriminator.encoder, discriminator.detector  # the generator stays behind
        else:
            self.adopt(BertForPreTraining(model_config(config)))
            self._tied_weights_keys = TIED
        self.post_init()

    def get_output_embeddings(self):
        return None if self.config.replaced_token_detection else self.head.token_embedding

    classify_pair = BertForPreTraining.classify_pair

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        """labels (ELECTRA): 1 for replaced tokens, 0 for originals; padding is not scored."""
        real = real_tokens(attention_mask)
        hidden = self.encoder(input_ids, real, token_type_ids)
        if not self.config.replaced_token_detection:
            return BertForPreTrainingOutput(prediction_logits=self.head(hidden),
                                            seq_relationship_logits=self.classify_pair(hidden))
        logits = self.detector(hidden).squeeze(-1)
        loss = None
        if labels is not None:
            scored = torch.ones_like(labels, dtype=torch.bool) if real is None else real
            loss = F.binary_cross_entropy_with_logits(logits[scored].float(), labels[scored].float())
        return ElectraForPreTrainingOutput(loss=loss, logits=logits)


class BertVariantForCausalLM(BertVariantPreTrainedModel):
    """Each position predicts the next token; labels are the input ids (shifted here, as transformers does)."""
    _tied_weights_keys = TIED

    def __init__(self, config):
        super().__init__(config)
        self.adopt(BertForCausalLM(model_config(config, causal=True)))
        self.post_init()

    def get_output_embeddings(self):
        return self.head.token_embedding

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        logits = self.head(self.encoder(input_ids, real_tokens(attention_mask)))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                   ignore_index=IGNORE_INDEX)
        return CausalLMOutput(loss=loss, logits=logits)


class BertVariantForSequenceClassification(BertVariantPreTrainedModel):
    """The program's classifier (cls or mean pooling); with one label a regression (mean squared error),
    multi-label with problem_type = multi_label_classification."""

    def __init__(self, config):
        super().__init__(config)
        self.adopt(BertForSequenceClassification(model_config(config)))
        self.post_init()

    def loss(self, logits, labels):
        """The program's loss for transformers' problem_type (multi-label: a sigmoid a class)."""
        return sequence_loss(logits, labels, getattr(self.config, "problem_type", None) == "multi_label_classification")

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        logits, loss = BertForSequenceClassification.forward(self, input_ids, labels, real_tokens(attention_mask),
                                                             token_type_ids)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class BertVariantForTokenClassification(BertVariantPreTrainedModel):
    """A label for every token (named entities); the loss over the tokens whose label is not -100."""

    def __init__(self, config):
        super().__init__(config)
        self.adopt(BertForTokenClassification(model_config(config)))
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        logits, loss = BertForTokenClassification.forward(self, input_ids, labels, real_tokens(attention_mask),
                                                          token_type_ids)
        return TokenClassifierOutput(loss=loss, logits=logits)


class BertVariantForQuestionAnswering(BertVariantPreTrainedModel):
    """Start and end logits of an answer span for every token (SQuAD)."""

    def __init__(self, config):
        super().__init__(config)
        self.adopt(BertForQuestionAnswering(model_config(config)))
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None, end_positions=None,
                **kwargs):
        start, end, loss = BertForQuestionAnswering.forward(self, input_ids, real_tokens(attention_mask),
                                                            token_type_ids, start_positions, end_positions)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start, end_logits=end)
