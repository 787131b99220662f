"""Pipeline stages over many prompts: sampling, judging, scoring, pair export, shards."""
