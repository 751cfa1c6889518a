"""Reference jobs written with PyTorch's own pieces, for readers to copy and adapt.

`ddp_torchrun`: lesson 77's data-parallel training job under torchrun (DistributedDataParallel,
DistributedSampler, gradient accumulation with no_sync, clipping, a rank-0 checkpoint). The book
names it but does not run it; a test runs it on CPU with gloo.
"""
