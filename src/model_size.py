"""How much memory a model's weights take, from its shape alone, and the check that refuses a model
too large for the machine in one line, before anything is allocated (not after the kernel kills it)."""
import os

from errors import UserError
from model import ModelConfig, generator_config

BYTES_PER_WEIGHT = 4  # float32: how models are built and checkpoints stored
GIB = 2**30


def parameter_count(config: ModelConfig) -> int:
    """The weights of the encoder, a pre-training head and ELECTRA's generator: within a few per
    cent of any model built from config (norms, small heads and biases are left out)."""
    width = config.d_model
    embeddings = (config.vocab_size + config.max_len + config.segments) * width
    up = (2 if config.feed_forward == "geglu" else 1) * config.d_ff
    layer = 4 * width * width + width * up + config.d_ff * width  # q, k, v, out; feed-forward up and down
    head = width * width + config.vocab_size  # dense and the bias per token (the decoder is the embedding)
    generator = 0
    if config.generator_heads:
        narrow = generator_config(config)
        generator = parameter_count(narrow) - (config.vocab_size + config.max_len + config.segments) * narrow.d_model
    return embeddings + config.n_layer * layer + head + generator


def machine_memory() -> int:
    """Bytes of physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits_memory(config: ModelConfig, *, copies: int, limit_gib: float | None, source: str, flag: str):
    """Refuse a model whose weights, `copies` times over (import: 2; training: weights, gradients and
    Adam's two moments, 4), would take more than limit_gib, or than the machine's memory when None.
    source names what set the shape (a file and its keys); flag, how to raise the limit."""
    count = parameter_count(config)
    needed = copies * BYTES_PER_WEIGHT * count
    limit = machine_memory() if limit_gib is None else limit_gib * GIB
    if needed > limit:
        limit_text = (f"this machine's memory ({gib_text(limit)}; {flag} GIB sets another limit)"
                      if limit_gib is None else f"{flag} {limit_gib:g} GiB")
        raise UserError(f"{source}: the model would allocate {gib_text(needed)} ({copies} x {count:,} float32 "
                        f"weights), more than {limit_text}")


def gib_text(size: float) -> str:
    """Bytes in GiB, with the digits a small model needs too (0.0014 GiB, not 0.0)."""
    return f"{size / GIB:,.1f} GiB" if size >= GIB else f"{size / GIB:.2g} GiB"
