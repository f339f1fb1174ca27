"""Axis names and the tensor layouts of the standard values.

An axis that is a fact about the model is named after the attribute that holds
its size (``HIDDEN`` is ``"hidden_size"``), so :func:`nnterp.axis_size` finds the
size on the envoy serving the value. The other axes (``batch``, ``seq``) are
facts about the input.

Each layout is a jaxtyping type: ``isinstance(tensor, Residual)`` checks rank and
dtype, and ``EProperty.dims`` names the axes the same way on every family.
"""

from __future__ import annotations

from jaxtyping import Bool, Float, Int
from torch import Tensor

BATCH = "batch"
SEQ = "seq"
QUERY = "query"
KEY = "key"
HIDDEN = "hidden_size"
INTERMEDIATE = "intermediate_size"
VOCAB = "vocab_size"
HEADS = "num_heads"
KV_HEADS = "num_kv_heads"
HEAD_DIM = "head_dim"
QK_HEAD_DIM = "qk_head_dim"
MIXER_HEADS = "mixer_heads"
KEY_DIM = "key_dim"
VALUE_DIM = "value_dim"
STATE_DIM = "state_dim"
CHANNELS = "channels"
GROUPS = "groups"
STREAMS = "streams"
EXPERTS = "num_experts"
TOP_K = "top_k"
# A vision tower's axes: the images of an invoke, their patches, and the tower's own width.
IMAGES = "images"
PATCHES = "patches"
VISION_HIDDEN = "vision_hidden_size"
# The text positions an image's features are scattered into, every image of the batch in order.
IMAGE_TOKENS = "image_tokens"
#: The axes whose sizes are facts about the input, not the model.
INPUT_AXES = frozenset({BATCH, SEQ, IMAGES, PATCHES, IMAGE_TOKENS})

Residual = Float[Tensor, f"{BATCH} {SEQ} {HIDDEN}"]
# A hyper-connection block's residual: several streams side by side, and what a sublayer adds into them.
Streams = Float[Tensor, f"{BATCH} {SEQ} {STREAMS} {HIDDEN}"]
# How a hyper-connection weights the streams: one weight per stream, or one per pair of streams, each token.
StreamWeights = Float[Tensor, f"{BATCH} {SEQ} {STREAMS}"]
StreamMixing = Float[Tensor, f"{BATCH} {SEQ} {STREAMS} {STREAMS}"]
Neurons = Float[Tensor, f"{BATCH} {SEQ} {INTERMEDIATE}"]
Logits = Float[Tensor, f"{BATCH} {SEQ} {VOCAB}"]
Probabilities = Float[Tensor, f"{BATCH} {VOCAB}"]
TokenIds = Int[Tensor, f"{BATCH} {SEQ}"]

# A mixture of experts' routing: one row per token, one column per expert or per routing slot.
RouterLogits = Float[Tensor, f"{BATCH} {SEQ} {EXPERTS}"]
ExpertWeights = Float[Tensor, f"{BATCH} {SEQ} {TOP_K}"]
ExpertIndices = Int[Tensor, f"{BATCH} {SEQ} {TOP_K}"]
ExpertOutputs = Float[Tensor, f"{BATCH} {SEQ} {TOP_K} {HIDDEN}"]

# A vision tower's stream: one row of patches per image (one packed row on Pixtral and the Qwen ViT).
Patches = Float[Tensor, f"{IMAGES} {PATCHES} {VISION_HIDDEN}"]
PatchNeurons = Float[Tensor, f"{IMAGES} {PATCHES} {INTERMEDIATE}"]
#: What the text model receives at its image tokens, in the text model's width.
ImageFeatures = Float[Tensor, f"{IMAGE_TOKENS} {HIDDEN}"]
ImageTokenMask = Bool[Tensor, f"{BATCH} {SEQ}"]

Queries = Float[Tensor, f"{BATCH} {HEADS} {SEQ} {QK_HEAD_DIM}"]
Keys = Float[Tensor, f"{BATCH} {KV_HEADS} {SEQ} {QK_HEAD_DIM}"]
Values = Float[Tensor, f"{BATCH} {KV_HEADS} {SEQ} {HEAD_DIM}"]
Pattern = Float[Tensor, f"{BATCH} {HEADS} {QUERY} {KEY}"]
HeadOutputs = Float[Tensor, f"{BATCH} {SEQ} {HEADS} {HEAD_DIM}"]

# Recurrent mixers put the sequence axis first after the batch, as their kernels do.
LinearQK = Float[Tensor, f"{BATCH} {SEQ} {MIXER_HEADS} {KEY_DIM}"]
LinearV = Float[Tensor, f"{BATCH} {SEQ} {MIXER_HEADS} {VALUE_DIM}"]
Gates = Float[Tensor, f"{BATCH} {SEQ} {MIXER_HEADS}"]
ChannelGates = Float[Tensor, f"{BATCH} {SEQ} {MIXER_HEADS} {KEY_DIM}"]
State = Float[Tensor, f"{BATCH} {MIXER_HEADS} {KEY_DIM} {VALUE_DIM}"]
States = Float[Tensor, f"{BATCH} {SEQ} {MIXER_HEADS} {KEY_DIM} {VALUE_DIM}"]
LinearHeadOutputs = Float[Tensor, f"{BATCH} {SEQ} {MIXER_HEADS} {VALUE_DIM}"]
#: A recurrent mixer's token mixing (``token_mixing``): per head, how each query row mixes the values of every token.
Mixing = Float[Tensor, f"{BATCH} {MIXER_HEADS} {QUERY} {KEY}"]

ScanQK = Float[Tensor, f"{BATCH} {SEQ} {GROUPS} {STATE_DIM}"]
ScanValues = Float[Tensor, f"{BATCH} {SEQ} {CHANNELS}"]
ScanSteps = Float[Tensor, f"{BATCH} {SEQ} {CHANNELS}"]
ScanDecays = Float[Tensor, f"{BATCH} {SEQ} {CHANNELS} {STATE_DIM}"]
ScanState = Float[Tensor, f"{BATCH} {CHANNELS} {STATE_DIM}"]
ScanStates = Float[Tensor, f"{BATCH} {SEQ} {CHANNELS} {STATE_DIM}"]
ScanMixing = Float[Tensor, f"{BATCH} {CHANNELS} {QUERY} {KEY}"]

SSDQueries = Float[Tensor, f"{BATCH} {SEQ} {GROUPS} {STATE_DIM}"]
SSDKeys = SSDQueries
SSDValues = Float[Tensor, f"{BATCH} {SEQ} {MIXER_HEADS} {HEAD_DIM}"]
SSDHeadOutputs = SSDValues
SSDState = Float[Tensor, f"{BATCH} {MIXER_HEADS} {STATE_DIM} {HEAD_DIM}"]
SSDStates = Float[Tensor, f"{BATCH} {SEQ} {MIXER_HEADS} {STATE_DIM} {HEAD_DIM}"]
