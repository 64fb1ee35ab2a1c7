"""tpu tensors <-> device arrays: tensors around buffers, view reads and writes through views."""
