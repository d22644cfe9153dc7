"""A corpus of small models of the kinds users bring, built from configs (nothing is downloaded).

`build(name, seed=0)` returns `(model, inputs)` where `model(*inputs)` runs one training
forward and returns the loss: a scalar tensor for the plain PyTorch models (one of them,
"dict_output", returns `{"loss": ..., "logits": ...}` instead), and for the `transformers`
models the model's own output object (a `ModelOutput` whose `.loss` is the scalar). Weights
are drawn under `torch.manual_seed(seed)`, inputs from `torch.Generator().manual_seed(seed)`.
Every model takes a batch of `BATCH` (8, divisible by 4, so a data-parallel axis of 2 or 4
splits it), is tiny (widths 16-64, 1-2 layers, vocabularies of 128-256, 16x16 or 32x32
images, sequences of 16) and runs without dropout, except "mlp_dropout", whose dropout
(p=0.1) stays active on purpose. `KINDS` says in one line what each model exercises.

The models (`MODELS`), plain PyTorch:

- "cnn": Conv2d, BatchNorm2d, ReLU, MaxPool2d, AdaptiveAvgPool2d, Linear, cross-entropy;
- "cnn1d": Conv1d, BatchNorm1d, MaxPool1d and AvgPool1d over a multichannel signal;
- "cnn3d": Conv3d, BatchNorm3d, MaxPool3d, AdaptiveAvgPool3d over small volumes;
- "unet": a two-level U-Net (ConvTranspose2d, bilinear Upsample, nearest F.interpolate,
  skip concatenations), mean-squared error;
- "transformer_encoder": nn.TransformerEncoder (batch_first) with a key padding mask,
  mean-pooled classifier;
- "transformer_seq2seq": nn.Transformer (encoder-decoder) with a causal target mask;
- "lstm_lm": a 2-layer nn.LSTM language model;
- "gru_classifier": a bidirectional nn.GRU classifier on its final hidden states;
- "dlrm": a DLRM-like recommender: nn.EmbeddingBag ("sum" with offsets, "mean" on 2d
  input), a bottom and a top MLP, a pairwise bmm interaction, BCEWithLogits;
- "topk_pooling": a top-k pointer head: index_select, cumsum, masked_fill, topk, sort,
  gather, scatter, index_put (accumulate), where;
- "mlp_mixer": an MLP-Mixer (patch Conv2d, token-mixing and channel-mixing MLPs);
- "frozen_bn": a CNN whose BatchNorm2d is in eval mode (running statistics) while the rest
  trains, as when fine-tuning a pretrained backbone;
- "mlp_dropout": an MLP with active dropout (p=0.1), a random op in the training step;
- "dict_output": a token classifier returning a dict `{"loss", "logits"}`;
- "masked_token_loss": a masked-LM head applied only to the labelled tokens, selected by
  boolean indexing, so a size depends on the data.

`transformers` models (config-built; "sdpa" attention, no cache, dropout 0):

- decoders: "gpt2", "llama", "qwen2", "gpt_neox", "opt", "phi", "falcon" (causal LM loss);
- encoders: "bert" (sequence classification, padded attention mask), "roberta" (masked
  LM), "distilbert" (token classification), "electra" (replaced-token detection);
- encoder-decoders: "t5" (labels only: decoder inputs are the shifted labels), "bart"
  (explicit decoder_input_ids and labels);
- vision: "vit", "convnext", "resnet" (image classification with labels);
- speech: "wav2vec2" (CTC on raw waveforms), "whisper" (log-mel features to tokens).

Not every model exports: `EXPORT_FAILS` names those for which
`torch.export.export(model, inputs, strict=False)` fails (torch 2.13, transformers 5.24)
and why. They stay in `MODELS`: users bring such models, and autopar must refuse them with
a clear error rather than crash.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

BATCH = 8
SEQ = 16
VOCAB = 256
CLASSES = 4

# name -> builder(generator) -> (model, inputs); filled by @_model below.
_BUILDERS: dict[str, Callable[[torch.Generator], tuple[nn.Module, tuple]]] = {}
KINDS: dict[str, str] = {}


def _model(name: str, kind: str):
    """Register the decorated builder as `name`, exercising `kind`."""
    def register(builder):
        _BUILDERS[name] = builder
        KINDS[name] = kind
        return builder
    return register


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple]:
    """The model `name` (a key of `MODELS`) in training mode, and its inputs."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    return _BUILDERS[name](generator)


# --- input helpers ---------------------------------------------------------------------

def _ids(g: torch.Generator, vocab: int = VOCAB, seq: int = SEQ, low: int = 0) -> torch.Tensor:
    return torch.randint(low, vocab, (BATCH, seq), generator=g)


def _labels(g: torch.Generator, classes: int = CLASSES) -> torch.Tensor:
    return torch.randint(0, classes, (BATCH,), generator=g)


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(BATCH, *shape, generator=g)


def _lengths(g: torch.Generator, least: int = SEQ // 2) -> torch.Tensor:
    """Per-sample lengths in [least, SEQ], the longest sample unpadded (padding is real)."""
    lengths = torch.randint(least, SEQ + 1, (BATCH,), generator=g)
    lengths[0] = SEQ
    return lengths


def _padding(lengths: torch.Tensor) -> torch.Tensor:
    """True at padded positions, (BATCH, SEQ)."""
    return torch.arange(SEQ).unsqueeze(0) >= lengths.unsqueeze(1)


# --- plain PyTorch ---------------------------------------------------------------------

class CNN(nn.Module):
    """Two conv blocks on 32x32 RGB images, global pooling, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(32, CLASSES)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.features(images).flatten(1)), labels)


@_model("cnn", "Conv2d+BatchNorm2d(train)+ReLU+MaxPool2d+AdaptiveAvgPool2d+Linear, "
        "cross-entropy")
def _cnn(g):
    return CNN(), (_randn(g, 3, 32, 32), _labels(g))


class CNN1d(nn.Module):
    """A 1d CNN over (batch, 4 channels, 32 samples), e.g. sensor readings."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(4, 16, 5, padding=2), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(16, 32, 3, padding=1), nn.BatchNorm1d(32), nn.ReLU(), nn.AvgPool1d(2))
        self.head = nn.Linear(32, CLASSES)

    def forward(self, signal: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.features(signal).mean(-1)), labels)


@_model("cnn1d", "Conv1d+BatchNorm1d+MaxPool1d+AvgPool1d, mean over time, cross-entropy")
def _cnn1d(g):
    return CNN1d(), (_randn(g, 4, 32), _labels(g))


class CNN3d(nn.Module):
    """A 3d CNN over (batch, 1, 8 frames, 16, 16) volumes, e.g. video clips or scans."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv3d(1, 8, 3, padding=1, bias=False), nn.BatchNorm3d(8), nn.ReLU(),
            nn.MaxPool3d(2),
            nn.Conv3d(8, 16, 3, padding=1, bias=False), nn.BatchNorm3d(16), nn.ReLU(),
            nn.AdaptiveAvgPool3d(1))
        self.head = nn.Linear(16, CLASSES)

    def forward(self, volumes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.features(volumes).flatten(1)), labels)


@_model("cnn3d", "Conv3d+BatchNorm3d+MaxPool3d+AdaptiveAvgPool3d, cross-entropy")
def _cnn3d(g):
    return CNN3d(), (_randn(g, 1, 8, 16, 16), _labels(g))


def _conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    """A two-level U-Net on 16x16 images, regressing a 3-channel image. Upsamples three
    ways (transposed conv, bilinear Upsample, nearest interpolate) since users mix them."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1, self.enc2, self.mid = _conv_block(3, 8), _conv_block(8, 16), _conv_block(16, 32)
        self.up2 = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.dec2 = _conv_block(32, 16)
        self.up1 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.dec1 = _conv_block(16 + 8, 8)
        self.side = nn.Conv2d(32, 8, 1)
        self.out = nn.Conv2d(8, 3, 1)

    def forward(self, images: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(images)                          # 16x16
        e2 = self.enc2(F.max_pool2d(e1, 2))             # 8x8
        m = self.mid(F.max_pool2d(e2, 2))               # 4x4
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))  # 8x8
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))  # 16x16
        # A deep side path from the bottleneck straight to full resolution.
        d1 = d1 + F.interpolate(self.side(m), size=e1.shape[-2:], mode="nearest")
        return F.mse_loss(self.out(d1), target)


@_model("unet", "U-Net: ConvTranspose2d, bilinear Upsample, nearest interpolate, skip cat, MSE")
def _unet(g):
    return UNet(), (_randn(g, 3, 16, 16), _randn(g, 3, 16, 16))


class EncoderClassifier(nn.Module):
    """nn.TransformerEncoder over padded token sequences, masked mean pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.pos = nn.Parameter(torch.randn(SEQ, 32) * 0.02)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        # Nested tensors are an inference fast path; off so training sees plain tensors.
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, ids: torch.Tensor, padding: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(ids) + self.pos, src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).to(h.dtype)
        pooled = (h * keep).sum(1) / keep.sum(1)
        return F.cross_entropy(self.head(pooled), labels)


@_model("transformer_encoder", "nn.TransformerEncoder(batch_first) + key padding mask, "
        "masked mean-pool classifier")
def _transformer_encoder(g):
    padding = _padding(_lengths(g))
    ids = _ids(g).masked_fill(padding, 0)
    return EncoderClassifier(), (ids, padding, _labels(g))


class Seq2Seq(nn.Module):
    """nn.Transformer translating source tokens to target tokens under a causal mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.pos = nn.Parameter(torch.randn(SEQ, 32) * 0.02)
        self.transformer = nn.Transformer(32, 4, num_encoder_layers=1, num_decoder_layers=1,
                                          dim_feedforward=64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor,
                tgt_out: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1])
        h = self.transformer(self.embed(src) + self.pos, self.embed(tgt_in) + self.pos,
                             tgt_mask=mask, tgt_is_causal=True)
        return F.cross_entropy(self.head(h).flatten(0, 1), tgt_out.flatten())


@_model("transformer_seq2seq", "nn.Transformer encoder-decoder with a causal tgt mask, "
        "token cross-entropy")
def _transformer_seq2seq(g):
    tgt = _ids(g, seq=SEQ + 1)
    return Seq2Seq(), (_ids(g), tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous())


class LSTMLM(nn.Module):
    """A 2-layer LSTM language model predicting the next token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.lstm = nn.LSTM(32, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(ids[:, :-1]))
        return F.cross_entropy(self.head(h).flatten(0, 1), ids[:, 1:].flatten())


@_model("lstm_lm", "nn.LSTM(2 layers, batch_first) language model, next-token cross-entropy")
def _lstm_lm(g):
    return LSTMLM(), (_ids(g),)


class GRUClassifier(nn.Module):
    """A bidirectional GRU; the final hidden states of both directions classify."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.gru = nn.GRU(32, 32, batch_first=True, bidirectional=True)
        self.head = nn.Linear(64, CLASSES)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        _, last = self.gru(self.embed(ids))             # (2 directions, batch, 32)
        return F.cross_entropy(self.head(last.transpose(0, 1).flatten(1)), labels)


@_model("gru_classifier", "bidirectional nn.GRU, final hidden states to a classifier")
def _gru_classifier(g):
    return GRUClassifier(), (_ids(g), _labels(g))


class DLRM(nn.Module):
    """A DLRM-like click model: dense features through a bottom MLP, two sparse features
    through EmbeddingBags, their pairwise dot products (bmm), a top MLP, one logit."""

    ROWS, DIM = 128, 16

    def __init__(self) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, self.DIM),
                                    nn.ReLU())
        # Multi-hot bags of different lengths: flat indices plus offsets.
        self.bag_sum = nn.EmbeddingBag(self.ROWS, self.DIM, mode="sum")
        # Fixed-size bags: a 2d index tensor, one row per sample.
        self.bag_mean = nn.EmbeddingBag(self.ROWS, self.DIM, mode="mean")
        pairs = 3 * 2 // 2
        self.top = nn.Sequential(nn.Linear(self.DIM + pairs, 32), nn.ReLU(), nn.Linear(32, 1))
        self.register_buffer("upper", torch.triu_indices(3, 3, offset=1), persistent=False)

    def forward(self, dense: torch.Tensor, flat_ids: torch.Tensor, offsets: torch.Tensor,
                bag_ids: torch.Tensor, clicks: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        features = torch.stack([x, self.bag_sum(flat_ids, offsets), self.bag_mean(bag_ids)], 1)
        dots = torch.bmm(features, features.transpose(1, 2))  # (batch, 3, 3)
        pairs = dots[:, self.upper[0], self.upper[1]]
        logit = self.top(torch.cat([x, pairs], 1)).squeeze(1)
        return F.binary_cross_entropy_with_logits(logit, clicks)


@_model("dlrm", "EmbeddingBag sum(offsets)+mean(2d), MLPs, bmm interaction, BCEWithLogits")
def _dlrm(g):
    lengths = torch.randint(1, 5, (BATCH,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    flat_ids = torch.randint(0, DLRM.ROWS, (int(lengths.sum()),), generator=g)
    bag_ids = torch.randint(0, DLRM.ROWS, (BATCH, 3), generator=g)
    clicks = torch.randint(0, 2, (BATCH,), generator=g).float()
    return DLRM(), (_randn(g, 8), flat_ids, offsets, bag_ids, clicks)


class TopKPooling(nn.Module):
    """Scores the tokens of a padded sequence, pools the top K of them (a pointer head), and
    adds a bag-of-chosen-tokens histogram: indexing ops users write by hand."""

    K, DIM = 4, 32

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(VOCAB, self.DIM) * 0.1)
        self.pos = nn.Embedding(SEQ + 1, self.DIM)
        self.score = nn.Linear(self.DIM, 1)
        self.head = nn.Linear(2 * self.DIM, CLASSES)
        self.hist_head = nn.Linear(VOCAB, CLASSES)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        batch, seq = ids.shape
        x = self.table.index_select(0, ids.flatten()).view(batch, seq, self.DIM)
        pad = ids == 0
        x = x + self.pos(torch.cumsum((~pad).long(), 1))  # position among real tokens
        scores = self.score(x).squeeze(-1).masked_fill(pad, float("-inf"))
        top, idx = scores.topk(self.K, dim=1)
        idx, order = idx.sort(dim=1)                      # back to sequence order
        weights = torch.softmax(top.gather(1, order), 1)
        picked = x.gather(1, idx.unsqueeze(-1).expand(-1, -1, self.DIM))
        pooled = (weights.unsqueeze(-1) * picked).sum(1)
        chosen = torch.zeros_like(scores).scatter(1, idx, 1.0).bool()
        rest = torch.where(chosen.unsqueeze(-1), torch.zeros_like(x), x).mean(1)
        rows = torch.arange(batch).unsqueeze(1).expand(-1, self.K)
        hist = torch.zeros(batch, VOCAB).index_put(
            (rows.flatten(), ids.gather(1, idx).flatten()), weights.flatten(), accumulate=True)
        logits = self.head(torch.cat([pooled, rest], 1)) + self.hist_head(hist)
        return F.cross_entropy(logits, labels)


@_model("topk_pooling", "index_select, cumsum, masked_fill, topk, sort, gather, scatter, "
        "index_put(accumulate), where")
def _topk_pooling(g):
    padding = _padding(_lengths(g, least=TopKPooling.K))
    ids = _ids(g, low=1).masked_fill(padding, 0)
    return TopKPooling(), (ids, _labels(g))


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 32), nn.GELU(), nn.Linear(32, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(dim, 64), nn.GELU(), nn.Linear(64, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(nn.Module):
    """MLP-Mixer on 16x16 images: 4x4 patches (16 tokens) of width 32, two blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 32, 4, stride=4)
        self.blocks = nn.Sequential(MixerBlock(16, 32), MixerBlock(16, 32))
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2)  # (batch, tokens, dim)
        x = self.norm(self.blocks(x)).mean(1)
        return F.cross_entropy(self.head(x), labels)


@_model("mlp_mixer", "MLP-Mixer: patch Conv2d, token-mixing (transposed) and channel MLPs, "
        "LayerNorm, GELU")
def _mlp_mixer(g):
    return MLPMixer(), (_randn(g, 3, 16, 16), _labels(g))


@_model("frozen_bn", "CNN with its BatchNorm2d in eval mode (running stats) inside a "
        "training model")
def _frozen_bn(g):
    model = CNN()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            # As if pretrained: statistics far from a fresh (0, 1), so using them is visible.
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            module.eval()
    # model.train() would put the BatchNorms back in training mode: callers must not.
    return model, (_randn(g, 3, 32, 32), _labels(g))


class FrozenEncoder(nn.Module):
    """Fine-tuning a classifier on a pretrained encoder kept frozen: its embedding and first
    layer do not train (`requires_grad_(False)`), the layer above them and the head do."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.encoder = nn.Linear(32, 64)
        self.adapter = nn.Linear(64, 64)
        self.head = nn.Linear(64, CLASSES)
        for frozen in (self.embed, self.encoder):
            frozen.requires_grad_(False)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.encoder(self.embed(ids)))
        pooled = torch.relu(self.adapter(hidden)).mean(dim=1)
        return F.cross_entropy(self.head(pooled), labels)


@_model("frozen_encoder", "a classifier fine-tuned on a frozen embedding and layer: "
        "parameters without gradients")
def _frozen_encoder(g):
    return FrozenEncoder(), (_ids(g), _labels(g))


class DropoutMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1),
                                 nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1),
                                 nn.Linear(64, CLASSES))

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(features), labels)


@_model("mlp_dropout", "MLP with active Dropout(p=0.1): a random op in the training step")
def _mlp_dropout(g):
    return DropoutMLP(), (_randn(g, 32), _labels(g))


class DictOutput(nn.Module):
    """A per-token tagger that returns what HF-style training loops expect: a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.norm = nn.LayerNorm(32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, CLASSES))

    def forward(self, ids: torch.Tensor, tags: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.mlp(self.norm(self.embed(ids)))
        loss = F.cross_entropy(logits.flatten(0, 1), tags.flatten())
        return {"loss": loss, "logits": logits}


@_model("dict_output", "forward returns a dict {'loss', 'logits'}, not a tensor")
def _dict_output(g):
    return DictOutput(), (_ids(g), torch.randint(0, CLASSES, (BATCH, SEQ), generator=g))


class MaskedTokenLoss(nn.Module):
    """A masked-LM head that keeps only the labelled tokens by boolean indexing before the
    output layer (saving the vocabulary projection on the rest), as hand-written training
    code does: the selected count depends on the data, so export gives it an unbacked size."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        h = self.norm(x + self.mlp(x))
        keep = labels != -100
        return F.cross_entropy(self.head(h[keep]), labels[keep])


@_model("masked_token_loss", "boolean-mask indexing h[labels != -100] before the head: a "
        "data-dependent (unbacked) size")
def _masked_token_loss(g):
    ids = _ids(g)
    masked = torch.rand(BATCH, SEQ, generator=g) < 0.3
    masked[:, 0] = True                                 # never empty
    return MaskedTokenLoss(), (ids, ids.masked_fill(~masked, -100))


# --- transformers ----------------------------------------------------------------------

class HFTrain(nn.Module):
    """`forward(*inputs)` -> the wrapped model's output (a ModelOutput with `.loss`), the
    positional inputs passed as the keyword arguments named `keys`."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, *inputs: torch.Tensor):
        return self.model(**dict(zip(self.keys, inputs, strict=True)))


# Shared by every config with attention: torch's fused attention, no KV cache.
_ATTN = {"attn_implementation": "sdpa", "use_cache": False}


def _causal_lm(g, model: nn.Module) -> tuple[nn.Module, tuple]:
    # The labels are the inputs: the model shifts them for the next-token loss.
    ids = _ids(g)
    return HFTrain(model, ("input_ids", "labels")), (ids, ids.clone())


@_model("gpt2", "GPT-2 causal LM: learned positions, Conv1D (addmm), tied embeddings")
def _gpt2(g):
    from transformers import GPT2Config, GPT2LMHeadModel
    lm = GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, **_ATTN))
    # transformers picks the loss by class name, which this one does not match (it would
    # warn, then take the same causal-LM loss).
    lm.loss_type = "ForCausalLM"
    return _causal_lm(g, lm)


@_model("llama", "Llama causal LM: rotary, grouped-query attention, RMSNorm, SwiGLU")
def _llama(g):
    from transformers import LlamaConfig, LlamaForCausalLM
    return _causal_lm(g, LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attention_dropout=0.0, **_ATTN)))


@_model("qwen2", "Qwen2 causal LM: Llama-like with q/k/v biases, tied embeddings")
def _qwen2(g):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    return _causal_lm(g, Qwen2ForCausalLM(Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attention_dropout=0.0, tie_word_embeddings=True, **_ATTN)))


@_model("gpt_neox", "GPT-NeoX causal LM: fused QKV, partial rotary, parallel residual")
def _gpt_neox(g):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    return _causal_lm(g, GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, attention_dropout=0.0,
        hidden_dropout=0.0, **_ATTN)))


@_model("opt", "OPT causal LM: learned offset positions, ReLU MLP, pre-LayerNorm")
def _opt(g):
    from transformers import OPTConfig, OPTForCausalLM
    return _causal_lm(g, OPTForCausalLM(OPTConfig(
        vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
        num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=64,
        dropout=0.0, attention_dropout=0.0, layerdrop=0.0, pad_token_id=1, bos_token_id=2,
        eos_token_id=2, **_ATTN)))


@_model("phi", "Phi causal LM: parallel attention+MLP block, partial rotary, untied head bias")
def _phi(g):
    from transformers import PhiConfig, PhiForCausalLM
    return _causal_lm(g, PhiForCausalLM(PhiConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, resid_pdrop=0.0, embd_pdrop=0.0,
        attention_dropout=0.0, **_ATTN)))


@_model("falcon", "Falcon causal LM: multi-query attention, parallel attention+MLP, rotary")
def _falcon(g):
    from transformers import FalconConfig, FalconForCausalLM
    return _causal_lm(g, FalconForCausalLM(FalconConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, **_ATTN)))


def _bert_dropout() -> dict:
    return {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


@_model("bert", "BERT sequence classifier with a padded attention_mask, pooler, token types")
def _bert(g):
    from transformers import BertConfig, BertForSequenceClassification
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, num_labels=CLASSES,
        classifier_dropout=0.0, **_bert_dropout(), **_ATTN))
    mask = (~_padding(_lengths(g))).long()
    ids = _ids(g, low=1) * mask
    return (HFTrain(model, ("input_ids", "attention_mask", "labels")),
            (ids, mask, _labels(g)))


@_model("roberta", "RoBERTa masked LM: padding-offset positions, -100 ignored labels")
def _roberta(g):
    from transformers import RobertaConfig, RobertaForMaskedLM
    # Positions start after pad_token_id (1), so the table needs SEQ + 2 rows at least.
    model = RobertaForMaskedLM(RobertaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=SEQ + 2, pad_token_id=1,
        **_bert_dropout(), **_ATTN))
    ids = _ids(g, low=4)
    masked = torch.rand(BATCH, SEQ, generator=g) < 0.25
    masked[:, 0] = True                                 # every row has a target
    labels = ids.masked_fill(~masked, -100)
    return HFTrain(model, ("input_ids", "labels")), (ids.masked_fill(masked, 3), labels)


@_model("distilbert", "DistilBERT token classifier: no token types, per-token labels")
def _distilbert(g):
    from transformers import DistilBertConfig, DistilBertForTokenClassification
    model = DistilBertForTokenClassification(DistilBertConfig(
        vocab_size=VOCAB, dim=64, hidden_dim=128, n_layers=2, n_heads=4,
        max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, qa_dropout=0.0,
        seq_classif_dropout=0.0, num_labels=CLASSES, attn_implementation="sdpa"))
    tags = torch.randint(0, CLASSES, (BATCH, SEQ), generator=g)
    return HFTrain(model, ("input_ids", "labels")), (_ids(g), tags)


@_model("electra", "ELECTRA discriminator: embedding projection (32->64), per-token BCE")
def _electra(g):
    from transformers import ElectraConfig, ElectraForPreTraining
    model = ElectraForPreTraining(ElectraConfig(
        vocab_size=VOCAB, embedding_size=32, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
        **_bert_dropout(), **_ATTN))
    replaced = torch.randint(0, 2, (BATCH, SEQ), generator=g)
    return HFTrain(model, ("input_ids", "labels")), (_ids(g), replaced)


@_model("t5", "T5 encoder-decoder: relative position buckets, RMSNorm, labels shifted into "
        "decoder inputs")
def _t5(g):
    from transformers import T5Config, T5ForConditionalGeneration
    model = T5ForConditionalGeneration(T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
        num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
        eos_token_id=1, **_ATTN))
    return HFTrain(model, ("input_ids", "labels")), (_ids(g), _ids(g, low=2))


@_model("bart", "BART encoder-decoder: explicit decoder_input_ids, learned positions, "
        "tied embeddings")
def _bart(g):
    from transformers import BartConfig, BartForConditionalGeneration
    model = BartForConditionalGeneration(BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, classifier_dropout=0.0, encoder_layerdrop=0.0,
        decoder_layerdrop=0.0, **_ATTN))
    # Contiguous copies: BART's loss views the labels, which fails on a strided slice.
    target = _ids(g, seq=SEQ + 1, low=4)
    return (HFTrain(model, ("input_ids", "decoder_input_ids", "labels")),
            (_ids(g, low=4), target[:, :-1].contiguous(), target[:, 1:].contiguous()))


def _image_classifier(g, model: nn.Module, size: int) -> tuple[nn.Module, tuple]:
    return HFTrain(model, ("pixel_values", "labels")), (_randn(g, 3, size, size), _labels(g))


@_model("vit", "ViT image classifier: Conv2d patches, CLS token, 32x32 images")
def _vit(g):
    from transformers import ViTConfig, ViTForImageClassification
    return _image_classifier(g, ViTForImageClassification(ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_labels=CLASSES,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa")), 32)


@_model("convnext", "ConvNeXt image classifier: depthwise 7x7 conv, channels-last LayerNorm, "
        "layer scale")
def _convnext(g):
    from transformers import ConvNextConfig, ConvNextForImageClassification
    return _image_classifier(g, ConvNextForImageClassification(ConvNextConfig(
        num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=32,
        drop_path_rate=0.0, num_labels=CLASSES)), 32)


@_model("resnet", "HF ResNet image classifier: basic blocks, BatchNorm (train), strided "
        "shortcuts")
def _resnet(g):
    from transformers import ResNetConfig, ResNetForImageClassification
    return _image_classifier(g, ResNetForImageClassification(ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
        num_labels=CLASSES)), 32)


@_model("wav2vec2", "wav2vec2 CTC on raw waveforms: conv feature extractor (GroupNorm), "
        "conv positions, CTC loss")
def _wav2vec2(g):
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC
    # Strides 5 and 2 turn 320 samples into 31 frames (the default extractor needs 400+).
    # Spec augment is off: it masks frames at random (numpy), outside torch's generator.
    model = Wav2Vec2ForCTC(Wav2Vec2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
        apply_spec_augment=False, mask_time_prob=0.0, hidden_dropout=0.0,
        activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0,
        final_dropout=0.0, layerdrop=0.0, pad_token_id=0, ctc_loss_reduction="mean",
        attn_implementation="sdpa"))
    # Transcripts of 4 to 8 characters (1..31; 0 is the CTC blank), -100 padded.
    lengths = torch.randint(4, 9, (BATCH,), generator=g)
    chars = torch.randint(1, 32, (BATCH, 8), generator=g)
    labels = chars.masked_fill(torch.arange(8).unsqueeze(0) >= lengths.unsqueeze(1), -100)
    return HFTrain(model, ("input_values", "labels")), (_randn(g, 320), labels)


@_model("whisper", "Whisper encoder-decoder: conv1d over log-mel features, sinusoidal "
        "encoder positions, labels")
def _whisper(g):
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    # The encoder wants exactly 2 * max_source_positions feature frames (its conv halves it).
    model = WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=128, num_mel_bins=16, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=8, max_target_positions=SEQ + 1,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
        decoder_layerdrop=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1, apply_spec_augment=False, **_ATTN))
    return (HFTrain(model, ("input_features", "labels")),
            (_randn(g, 16, 16), _ids(g, vocab=128, low=3)))


# name -> zero-argument builder (seed 0); `build(name, seed)` for another seed.
MODELS: dict[str, Callable[[], tuple[nn.Module, tuple]]] = {
    name: (lambda name=name: build(name)) for name in _BUILDERS}

# Models whose `torch.export.export(model, inputs, strict=False)` fails, and why (torch
# 2.13, transformers 5.24). Every other model exports, T5 included; "masked_token_loss"
# exports with an unbacked (data-dependent) size.
EXPORT_FAILS: dict[str, str] = {
    # Wav2Vec2ForCTC.forward validates `if labels.max() >= self.config.vocab_size: raise`,
    # a Python branch on a tensor's value.
    "wav2vec2": "GuardOnDataDependentSymNode: Could not guard on data-dependent expression "
                "Eq(u0, 1) (the labels.max() >= vocab_size check in Wav2Vec2ForCTC.forward)",
}
