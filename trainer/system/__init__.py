"""The operating-system layer every other package stands on: running and signalling processes, signal names,
children that die with their parent, how legato's own processes exit, the environment a rank must start with, and the
CPU threads an allocation gives.

This package must never import another legato package (errors aside), hold training state or import torch.
"""
