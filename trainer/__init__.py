"""GRPO training of the reviser, rewards, model registry and evaluation."""
