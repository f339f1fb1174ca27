"""Falcon-Mamba: Mamba's blocks, with weightless RMS norms on B, C and the step size before the scan.

The mixer's values are read at the kernel call, so ``attention_queries``,
``attention_keys`` and ``betas`` are the normed ones.
"""

from transformers.models.falcon_mamba import modeling_falcon_mamba as MODELING

from nnterp_mamba.blocks import MambaLayer
from nnterp_mamba.families import mamba
from nnterp_mamba.selective_scan import SelectiveScan

MODEL_TYPES = ("falcon_mamba",)
ENVOYS = {
    MODELING.FalconMambaBlock: MambaLayer,
    MODELING.FalconMambaMixer: SelectiveScan,
}
RENAME = mamba.RENAME
TINY_CONFIG = mamba.TINY_CONFIG
