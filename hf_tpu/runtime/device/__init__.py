"""The `tpu` device as PyTorch sees it: registration, `torch.tpu`, torch.accelerator, hooks, and the
torch surface (autocast, storages, generators, pinned memory, printing) installed for it."""
