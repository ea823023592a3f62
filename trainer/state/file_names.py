"""The names of a checkpoint's files, as its manifest lists them.

Plain strings, importable without torch: `legato status` and the resume rule read manifests by these names. This module
must never import anything.
"""

MODEL_FILE = "model.pt"
TRAIN_STATE_FILE = "train_state.pt"
RANK_FILE = "rank"  # stands for rank<R>.pt
SHARD_FILE = "shard"  # stands for <name>.shard<R>.pt: this rank's shards of a sharded (FSDP2) component
