"""TRL training: offline DPO on exported preference pairs."""
