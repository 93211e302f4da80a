"""The configuration of a BERT variant exported by the BERT-from-scratch program (scripts/export_hf.py).

Its fields are the program's ModelConfig (architecture.py); transformers' usual names
(hidden_size, num_hidden_layers, ...) read them through attribute_map.
"""
from transformers import PretrainedConfig


class BertVariantConfig(PretrainedConfig):
    model_type = "bert-variant"
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layer", "num_attention_heads": "heads",
                     "intermediate_size": "d_ff", "max_position_embeddings": "max_len",
                     "type_vocab_size": "segments", "pad_id": "pad_token_id"}

    def __init__(self, vocab_size=30522, max_len=512, d_model=768, heads=12, n_layer=12, d_ff=3072, dropout=0.1,
                 segments=2, layer_norm_eps=1e-12, norm="postln", position="learned", rope_theta=10_000.0,
                 feed_forward="gelu", causal=False, sentence_classes=0, pooling="cls", replaced_token_detection=False,
                 pad_token_id=0, **kwargs):
        self.vocab_size, self.max_len, self.d_model, self.heads = vocab_size, max_len, d_model, heads
        self.n_layer, self.d_ff, self.dropout, self.segments = n_layer, d_ff, dropout, segments
        self.layer_norm_eps, self.norm, self.position, self.feed_forward = layer_norm_eps, norm, position, feed_forward
        self.rope_theta = rope_theta
        self.causal, self.sentence_classes, self.pooling = causal, sentence_classes, pooling
        self.replaced_token_detection = replaced_token_detection  # ELECTRA's discriminator, for the pre-training class
        kwargs.setdefault("tie_word_embeddings", True)
        super().__init__(pad_token_id=pad_token_id, **kwargs)
