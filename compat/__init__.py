"""Compatibility harness: which Hugging Face Hub models run on a device, in which mode (eager/compiled)."""
