"""The DPR bi-encoder: a question encoder and a passage encoder (or one shared), pooling, similarity,
and the two on-disk formats users load it in (sentence-transformers directories; transformers' DPR).
"""

import json

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel
from transformers.utils import cached_file

from utils.errors import UserError
from utils.retriever.config import EncoderConfig
from utils.runtime.batching import round_up


def sentence_transformers_defaults(model_name_or_path: str) -> tuple[str | None, bool | None]:
    """(pooling, normalised) a sentence-transformers model was trained with, from its modules.json and
    pooling config; (None, None) for a plain transformers checkpoint."""

    def read(name):
        try:
            path = cached_file(model_name_or_path, name, _raise_exceptions_for_missing_entries=False)
        except OSError:
            return None
        return json.load(open(path)) if path else None

    modules = read("modules.json")
    if not modules:
        return None, None
    pooling_dir = next((m["path"] for m in modules if m["type"].endswith("Pooling")), None)
    config = read(f"{pooling_dir}/config.json") if pooling_dir else None
    pooling = None
    if config:
        pooling = ("cls" if config.get("pooling_mode_cls_token") else "mean" if config.get("pooling_mode_mean_tokens")
                   else None)
    return pooling, any(m["type"].endswith("Normalize") for m in modules)


class BiEncoder(nn.Module):
    """forward(query=..., passage=...) -> (query embeddings, passage embeddings); either side may be None.
    One forward for both sides keeps every parameter in use under DDP."""

    def __init__(self, query_encoder: nn.Module, passage_encoder: nn.Module | None, pooling: str, normalize: bool,
                 length_buckets: int = 1):
        super().__init__()
        self.query_encoder = query_encoder
        self.passage_encoder = passage_encoder  # None: shared with the query encoder
        self.pooling, self.normalize, self.length_buckets = pooling, normalize, length_buckets

    @classmethod
    def from_pretrained(cls, query_path, passage_path, shared: bool, pooling: str, normalize: bool,
                        length_buckets: int = 1):
        query = AutoModel.from_pretrained(query_path)
        passage = None if shared else AutoModel.from_pretrained(passage_path)
        for encoder in (query, passage):
            for name, param in (encoder.named_parameters() if encoder is not None else ()):
                if name.startswith("pooler."):  # BERT's pooler is not part of either pooling: never trained,
                    param.requires_grad_(False)  # and DDP refuses parameters that get no gradient
        return cls(query, passage, pooling, normalize, length_buckets)

    def encoder(self, side: str) -> nn.Module:
        return self.query_encoder if side == "query" or self.passage_encoder is None else self.passage_encoder

    def embed(self, side: str, inputs: dict) -> torch.Tensor:
        """Pooled embeddings (fp32) of right-padded inputs. Passages are encoded in `length_buckets` sub-batches
        of similar length, each cut to its own longest input (a multiple of 8): the same embeddings (padding is
        masked) for less compute. Paragraphs vary in length (SQuAD's: docs/RESULTS.md), and one long passage would
        otherwise pad the whole batch."""
        buckets = min(self.length_buckets, len(inputs["input_ids"])) if side == "passage" else 1
        if buckets <= 1:
            return self._embed(side, inputs)
        lengths = inputs["attention_mask"].sum(1)
        order = torch.argsort(lengths, descending=True, stable=True)
        parts = []
        for rows in order.tensor_split(buckets):
            width = round_up(int(lengths[rows[0]]))
            parts.append(self._embed(side, {k: v[rows, :width] for k, v in inputs.items()}))
        return torch.cat(parts)[torch.argsort(order)]

    def _embed(self, side: str, inputs: dict) -> torch.Tensor:
        hidden = self.encoder(side)(**inputs).last_hidden_state
        if self.pooling == "cls":
            emb = hidden[:, 0]
        else:  # mean over real tokens
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        emb = emb.float()  # similarities and the loss in fp32 whatever the autocast precision
        return F.normalize(emb, dim=-1) if self.normalize else emb

    def forward(self, query: dict | None = None, passage: dict | None = None):
        return (self.embed("query", query) if query is not None else None,
                self.embed("passage", passage) if passage is not None else None)


def bi_encoder_of(config: EncoderConfig) -> BiEncoder:
    """The bi-encoder `config` describes."""
    return load_bi_encoder(config.query_model_name_or_path, config.passage_model_name_or_path, config.shared_encoder,
                           config.pooling, config.similarity, config.length_buckets)


def load_bi_encoder(query_path: str, passage_path: str, shared: bool, pooling: str, similarity: str,
                    length_buckets: int = 1) -> BiEncoder:
    """The bi-encoder (encoders, sharing, pooling, similarity, length buckets); a one-line error when an encoder
    cannot be loaded."""
    try:
        return BiEncoder.from_pretrained(query_path, passage_path, shared, pooling, similarity == "cosine",
                                         length_buckets)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load an encoder ({str(err).splitlines()[0]})") from None
